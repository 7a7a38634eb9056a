"""Recipes: the commands that make the artefacts audiomask ships, run from the repository root.

- :mod:`recipes.ctc_small`: the shipped model ``audiomask/assets/ctc-small.safetensors`` and its card.
"""
