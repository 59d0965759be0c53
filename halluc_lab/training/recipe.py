"""What determines a trained model: a :class:`Recipe`, and the :class:`Stage` interface its
training goes through.

Chapters 7–12 train their models through named recipes (:mod:`halluc_lab.recipes`, the registry)
that a cache trains once (:mod:`halluc_lab.recipes.cache`). This module is the small part both
need: the recipe itself and what a stage must offer. Each stage lives beside its training —
pre-training in :mod:`halluc_lab.stages.pretraining`, SFT in :mod:`halluc_lab.stages.sft`, DPO,
RSFT and own-errors SFT in :mod:`halluc_lab.stages.preference`, PPO in
:mod:`halluc_lab.stages.rlhf`, RLVR in :mod:`halluc_lab.stages.rlvr` — so a recipe's cache key
covers the code of its own stage and not the others'.

**A stage** is a frozen dataclass that owns how its data are assembled and what its training
needs. The cache calls one method, ``fit(recipe, model, device, dtype, checkpoints) -> History``,
whose default runs :func:`halluc_lab.training.train.train` over three more: ``rows(recipe)``
(every packed row it trains on), ``prepare(recipe)`` (``prepare(model, batch, step) -> batch``
before each step, or None) and ``loss(recipe)``. A stage that trains otherwise — on the starting
model's own samples (DPO, RSFT), or in rounds of rollouts and updates (PPO, RLVR) — overrides
``fit`` and reads top to bottom there.

**A recipe's optimisation** may be given as :class:`Deferred`, computed on its first read: the
registry's pre-training recipes train one pass over a corpus that takes seconds to build, which
reading a recipe's name, stage or parents never needs.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from halluc_lab.training.data import Batch, batches
from halluc_lab.training.train import History, Loss, NextTokenLoss, TrainConfig, train

if TYPE_CHECKING:  # names for annotations only: importing them would add every task to every key
    from halluc_lab.model.config import ModelConfig
    from halluc_lab.tasks import TaskConfig

SCALES = ("smoke", "full")
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")  # a recipe name is one safe path component


@dataclass(frozen=True)
class Deferred:
    """A recipe's ``train`` computed on its first read: ``fn()``, a :class:`TrainConfig`. ``fn``
    must pickle (a module-level function or a ``functools.partial`` of one): recipes travel to the
    processes that train them."""

    fn: Callable[[], TrainConfig]


class _OnFirstRead:
    """:attr:`Recipe.train`: a :class:`Deferred` stored there is called on the first read and
    replaced by its value, so every reader (the key, equality, the loop) sees a TrainConfig."""

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, recipe, owner=None):
        if recipe is None:
            raise AttributeError(self.name)  # for dataclasses: the field has no default
        value = recipe.__dict__[self.name]
        if isinstance(value, Deferred):
            value = value.fn()
            if not isinstance(value, TrainConfig):
                raise TypeError(f"{recipe.name}: its deferred train must give a TrainConfig, "
                                f"got {type(value).__name__}")
            recipe.__dict__[self.name] = value
        return value

    def __set__(self, recipe, value):
        recipe.__dict__[self.name] = value


@dataclass(frozen=True)
class Recipe:
    """Everything that determines a trained model."""

    name: str  # "<task>-<stage>", e.g. "kb_walk-sft-clean"; one path component, the cache's folder
    scale: str  # "smoke" or "full"
    task: TaskConfig  # the task's world, splits and corpus
    model: ModelConfig  # the decoder's shape (a recipe with a parent repeats the parent's)
    train: TrainConfig = _OnFirstRead()  # optimisation; given as a Deferred, computed on first read
    batch_size: int  # packed rows per optimizer step
    seq_len: int  # tokens per packed row
    stage: Stage  # what it trains on and how (Pretraining, SFT, DPO, RSFT, PPO, OwnErrorsSFT, RLVR)
    parent: Recipe | None = None  # the recipe whose weights it starts from (None: random init)
    seed: int = 0  # model initialisation, data order and data draws

    def __post_init__(self):
        if not isinstance(self.name, str) or not NAME.fullmatch(self.name) or ".." in self.name:
            raise ValueError(f"name must be letters, digits and _ . + - (no '/', no '..', not "
                             f"starting with '.' or '-'): it names a folder of the cache; "
                             f"got {self.name!r}")
        if self.scale not in SCALES:
            raise ValueError(f"scale must be one of {SCALES}, got {self.scale!r}")
        for name, low in (("batch_size", 1), ("seq_len", 1), ("seed", 0)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise ValueError(f"{name} must be an int >= {low}, got {v!r}")
        if not isinstance(self.stage, Stage):
            raise TypeError(f"stage must be a Stage (recipes.Pretraining, recipes.SFT, ...), "
                            f"got {type(self.stage).__name__}")
        if self.parent is not None and not isinstance(self.parent, Recipe):
            raise TypeError(f"parent must be a Recipe or None, got {type(self.parent).__name__}")
        if self.parent is not None and self.parent.model != self.model:
            raise ValueError(f"{self.name}: its model config differs from its parent's "
                             f"({self.parent.name})")

    @property
    def pretraining(self) -> Recipe:
        """The recipe at the root of this one's parents (itself for a pre-training recipe)."""
        return self if self.parent is None else self.parent.pretraining


def lineage(recipe: Recipe) -> list[Recipe]:
    """The recipe's chain from its pre-training root down to itself."""
    return ([] if recipe.parent is None else lineage(recipe.parent)) + [recipe]


def with_seed(recipe: Recipe, seed: int) -> Recipe:
    """The same chain under another seed: the root's seed becomes ``seed`` and every parent's moves
    by as much, so each keeps its own draws (``with_seed(r, 0)`` is the registry's ``r``)."""
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")
    shift = seed - recipe.pretraining.seed
    parent = None if recipe.parent is None else with_seed(recipe.parent, seed)  # the same shift
    return dataclasses.replace(recipe, seed=recipe.seed + shift, parent=parent)


Prepare = Callable[[nn.Module, Batch, int], Batch]
"""``prepare(model, batch, step) -> batch``: what is done to a batch before its optimizer step."""


@dataclass(frozen=True)
class Stage:
    """What every stage offers; a subclass defines :meth:`rows`, or overrides :meth:`fit`."""

    def rows(self, recipe: Recipe) -> Batch:
        """Every packed row the stage trains on."""
        raise NotImplementedError(f"{type(self).__name__} must define rows(recipe)")

    def prepare(self, recipe: Recipe) -> Prepare | None:
        """What is done to each batch before its step (None: nothing)."""
        return None

    def loss(self, recipe: Recipe) -> Loss:
        """The loss the loop minimises: next-token cross-entropy on the batch's labels."""
        return NextTokenLoss()

    def fit(self, recipe: Recipe, model: nn.Module, device: torch.device, dtype: torch.dtype,
            checkpoints: str) -> History:
        """Train ``model`` in place (resuming from ``checkpoints``); its history. By default the
        loss-agnostic loop over :meth:`rows` (``recipe.batch_size`` rows a step, each epoch in a
        fresh seeded order, so a resumed run sees what an uninterrupted one would), :meth:`prepare`
        and :meth:`loss`."""
        data = batches(self.rows(recipe).to(device), recipe.batch_size, recipe.seed)
        return train(model, data, recipe.train, checkpoint_dir=checkpoints, resume=True,
                     loss=self.loss(recipe), prepare=self.prepare(recipe), autocast_dtype=dtype,
                     desc=recipe.name)
