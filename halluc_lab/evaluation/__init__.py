"""Judging and measuring: scoring answers on a task's verifier, running models on held-out prompts,
statistics and intervals, chapter 11's hallucination measures, propagation and retrieval.

ARCHITECTURE.md §2 says which module of this package owns what.
"""
