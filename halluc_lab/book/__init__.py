"""What the chapters use to show results: claim tables, interactive explorers, live widgets, the
chapter footer.

ARCHITECTURE.md §2 says which module of this package owns what.
"""
