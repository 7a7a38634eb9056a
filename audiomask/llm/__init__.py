"""LLM recognisers: an audio encoder, a projector and a causal language model (Qwen3-ASR, Phi-4-multimodal).

Needs the ``llm`` extra (transformers, for the checkpoints' tokenizers and configs).
"""
