"""What every training run shares: batches and losses, the optimizer step, the loop, data
parallelism, and ``recipe``, what determines a trained model (the ``Recipe`` and the ``Stage``
interface).

ARCHITECTURE.md §2 says which module of this package owns what.
"""
