"""Turning a model into text: sampling rules and their parameters, the reference decoding loop, the
batched engine over the KV cache, and the backspace controller.

ARCHITECTURE.md §2 says which module of this package owns what.
"""
