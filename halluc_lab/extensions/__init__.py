"""Chapter 12's extensions: LoRA, continual learning, a vision-language model in miniature, and
retraction demonstrations.

ARCHITECTURE.md §2 says which module of this package owns what.
"""
