"""The recipe of ``ctc-small``, the shipped streaming Conformer-CTC model, one step a module.

Run from the repository root, in this order (``README.md`` beside this file has the commands):

- :mod:`~recipes.ctc_small.corpus`: synthesise a speech corpus with held-out voices and sentences.
- :mod:`~recipes.ctc_small.train`: train on it (one stage), save the model file, evaluate it.
- :mod:`~recipes.ctc_small.evaluate`: evaluate a model file on a corpus (another device, another engine).
- :mod:`~recipes.ctc_small.card`: render ``MODEL_CARD.md`` from the training and evaluation reports.

Shared by the steps: :mod:`~recipes.ctc_small.config` (every training setting),
:mod:`~recipes.ctc_small.data` (manifest, features, batches),
:mod:`~recipes.ctc_small.augment` (waveform and feature augmentation) and
:mod:`~recipes.ctc_small.cli` (parsing, errors, the command each report records).
"""
