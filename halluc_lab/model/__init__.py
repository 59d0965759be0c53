"""The model and what it is made of: the tokenizer, positional encodings, attention, the KV cache,
the Llama-style decoder (``transformer``) and its Hugging Face twin.

ARCHITECTURE.md §2 says which module of this package owns what.
"""
