"""Pre-training as a recipe stage: next-token prediction on every token of a task's corpus, packed.

Chapter 7 (000 §5.7, packing). The training is the plain loop
(:func:`halluc_lab.training.train.train`, the stage default); what is pre-training's own is its
rows: the task's pre-training documents, one per sequence, packed. This module is small on purpose:
a pre-training recipe's cache key covers the code it imports, and pre-training is the costliest
stage to train again.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from halluc_lab.training.data import Batch, encode_document, pack
from halluc_lab.training.recipe import Recipe, Stage
from halluc_lab.tasks.base import make_task


@dataclass(frozen=True)
class Pretraining(Stage):
    """Next-token prediction on every token of the task's pre-training corpus, packed (chapter
    7)."""

    def rows(self, recipe: Recipe) -> Batch:
        return pretraining_rows(recipe.task, recipe.seq_len, recipe.seed)


@lru_cache(maxsize=4)
def pretraining_rows(task, seq_len: int, seed: int) -> Batch:
    """The task's pre-training corpus (drawn with ``seed``), a document per sequence, packed in rows
    of ``seq_len``."""
    t = make_task(task)
    tok = t.tokenizer()
    return pack([encode_document(tok, d) for d in t.pretraining_documents(seed)], seq_len,
                tok.pad_id)
