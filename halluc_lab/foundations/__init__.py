"""Chapters 1 and 2's teaching code, before any transformer: the chain rule and the RNN LM,
n-grams, entropy and its relatives, and classical NLP (lexical measures, TextRank, a hidden Markov
model).

ARCHITECTURE.md §2 says which module of this package owns what.
"""
