"""The stages a recipe can train with: each a frozen dataclass that owns how its data are assembled and what
its training needs (the :class:`~halluc_lab.recipe_cache.Stage` interface); :mod:`halluc_lab.recipes` names
the recipes that use them and re-exports them.

:class:`Pretraining` (chapter 7), :class:`SFT` (chapter 8; chapter 11's with retrieved passages in its prompts),
:class:`DPO` and :class:`RSFT` (chapter 9, which learn from the starting model's own samples ranked by the task's
verifier), :class:`PPO` (chapter 9: on the verifier, or RLHF on a reward model; chapter 12's with agreeable
raters), :class:`OwnErrorsSFT` and :class:`RLVR` (chapter 10). Nothing chooses a stage by its name. Sources:
000 §5.4 (completion-only loss), §5.7 (packing), §7.3 (backspace demonstrations); 002 ("Scheduled Sampling");
001 Part 2 §1–2 (DPO, RSFT), Part 3 §3 (RAG).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import nn

from halluc_lab.data import Batch, encode_document, encode_example, pack
from halluc_lab.preference import DPOTraining, OwnErrorsTraining, RSFTTraining
from halluc_lab.recipe_cache import Prepare, Recipe, Stage
from halluc_lab.rlhf import PPOTraining
from halluc_lab.rlvr import RLVRTraining
from halluc_lab.sft import BackspaceConfig, RetrievedContext, backspace_demonstration, scheduled_sampling
from halluc_lab.tasks import TaskConfig, make_task

__all__ = ["Pretraining", "SFT", "ScheduledSampling", "DPO", "RSFT", "PPO", "OwnErrorsSFT", "RLVR"]


@dataclass(frozen=True)
class Pretraining(Stage):
    """Next-token prediction on every token of the task's pre-training corpus, packed (chapter 7)."""

    def rows(self, recipe: Recipe) -> Batch:
        return _pretraining_rows(recipe.task, recipe.seq_len, recipe.seed)


@dataclass(frozen=True)
class SFT(Stage):
    """Supervised fine-tuning on the task's train split (chapter 8), with the variants the book compares."""

    n_examples: int  # training examples drawn from the task's train split
    completion_only: bool = True  # loss on the completion only (000 §5.4)
    replay_fraction: float = 0.0  # pre-training documents mixed in, per SFT example (against forgetting)
    backspace: BackspaceConfig | None = None  # inject errors + <bksp> + correction (000 §7.3); None: clean
    scheduled_sampling: float = 0.0  # final rate of scheduled sampling, ramped up linearly from 0 (002)
    retrieved: RetrievedContext | None = None  # passages prepended to a share of the prompts (001 eq. 11); None: plain

    def __post_init__(self):
        if not isinstance(self.n_examples, int) or isinstance(self.n_examples, bool) or self.n_examples < 1:
            raise ValueError(f"n_examples must be an int >= 1, got {self.n_examples!r}")
        if not isinstance(self.completion_only, bool):
            raise TypeError(f"completion_only must be a bool, got {self.completion_only!r}")
        if not (isinstance(self.replay_fraction, (int, float)) and math.isfinite(self.replay_fraction)
                and self.replay_fraction >= 0):
            raise ValueError(f"replay_fraction must be a finite number >= 0, got {self.replay_fraction!r}")
        if self.backspace is not None and not isinstance(self.backspace, BackspaceConfig):
            raise TypeError(f"backspace must be a BackspaceConfig or None, got {type(self.backspace).__name__}")
        if not (isinstance(self.scheduled_sampling, (int, float)) and 0.0 <= self.scheduled_sampling <= 1.0):
            raise ValueError(f"scheduled_sampling must be in [0, 1], got {self.scheduled_sampling!r}")
        if self.retrieved is not None and not isinstance(self.retrieved, RetrievedContext):
            raise TypeError(f"retrieved must be a RetrievedContext or None, got {type(self.retrieved).__name__}")

    def rows(self, recipe: Recipe) -> Batch:
        """The examples (with retrieved passages and backspace demonstrations if asked), the replayed documents,
        shuffled and packed.

        Retrieved context (:meth:`RetrievedContext.augment`) replaces an example's prompt after the examples
        are drawn, with the stage's ``rng``; with backspace demonstrations as well, errors are injected in
        the augmented example's completion (the passages are prompt: never a target). Replayed documents
        come from the corpus of the chain's pre-training recipe (its seed), also when this recipe starts
        from another SFT recipe.
        """
        task = make_task(recipe.task)
        tok = task.tokenizer()
        rng = random.Random(recipe.seed)
        seqs = []
        for ex in task.examples("train", self.n_examples, seed=recipe.seed):
            if self.retrieved is not None:
                ex = self.retrieved.augment(task, ex, rng)
            if self.backspace is not None:
                seqs += backspace_demonstration(tok, task, ex, self.backspace, rng)
            else:
                seqs.append(encode_example(tok, ex, completion_only=self.completion_only))
        if self.replay_fraction > 0:
            docs = task.pretraining_documents(seed=recipe.pretraining.seed)
            seqs += [encode_document(tok, d) for d in rng.sample(docs, int(self.replay_fraction * self.n_examples))]
        rng.shuffle(seqs)
        return pack(seqs, recipe.seq_len, tok.pad_id)

    def prepare(self, recipe: Recipe) -> Prepare | None:
        """Scheduled sampling when its rate is above 0, else nothing."""
        if self.scheduled_sampling == 0:
            return None
        return ScheduledSampling(self.scheduled_sampling, recipe.train.steps, recipe.seed)


@dataclass(frozen=True)
class ScheduledSampling:
    """``prepare(model, batch, step)``: :func:`~halluc_lab.sft.scheduled_sampling` at a rate ramped
    linearly from 0 to ``final_rate`` over the run, its draws seeded by the step (so a resumed run
    draws what an uninterrupted one would)."""

    final_rate: float  # the rate at the last step
    steps: int  # the run's optimizer steps
    seed: int  # the recipe's seed

    def __call__(self, model: nn.Module, batch: Batch, step: int) -> Batch:
        g = torch.Generator(device=batch.input_ids.device).manual_seed(self.seed * 1_000_003 + step)
        return scheduled_sampling(model, batch, self.final_rate * step / self.steps, g)


@dataclass(frozen=True)
class DPO(DPOTraining, Stage):
    """DPO on pairs of the starting model's own samples, ranked by the task's verifier with a share of the
    labels flipped (chapter 9; :class:`halluc_lab.preference.DPOTraining` says how)."""


@dataclass(frozen=True)
class RSFT(RSFTTraining, Stage):
    """RSFT: SFT on one of N own samples per prompt, the best by the verifier's reward or one drawn with
    probability softmax(R/β) (chapter 9; :class:`halluc_lab.preference.RSFTTraining` says how)."""


@dataclass(frozen=True)
class PPO(PPOTraining, Stage):
    """PPO with a KL penalty from the starting model, against the task's verifier or (RLHF) a reward model fit
    first to the starting model's ranked samples (chapter 9; :class:`halluc_lab.rlhf.PPOTraining` says how)."""


@dataclass(frozen=True)
class OwnErrorsSFT(OwnErrorsTraining, Stage):
    """Backspace SFT on the starting model's own errors: cut at the first wrong symbol, ``<bksp>``, the gold answer
    from there (chapter 10; :class:`halluc_lab.preference.OwnErrorsTraining` says how)."""


@dataclass(frozen=True)
class RLVR(RLVRTraining, Stage):
    """RLVR with group baselines on the task's verifier, ``<bksp>`` allowed or masked (chapter 10;
    :class:`halluc_lab.rlvr.RLVRTraining` says how)."""


@lru_cache(maxsize=4)
def _pretraining_rows(task: TaskConfig, seq_len: int, seed: int) -> Batch:
    """The task's pre-training corpus (drawn with ``seed``), a document per sequence, packed in rows of ``seq_len``."""
    t = make_task(task)
    tok = t.tokenizer()
    return pack([encode_document(tok, d) for d in t.pretraining_documents(seed)], seq_len, tok.pad_id)
