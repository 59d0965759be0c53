"""The continual-learning methods chapter 12 compares, as frozen dataclasses with one interface.

Chapter 12. Source: 001 Part 4 §1 (eq. 12: θ = (θ_frozen, θ_trainable), only θ_trainable updated on
the new corpus, optionally anchored near the last solution). Each method has one interface:
``prepare`` a copy of the lab's model for training, its training ``loss`` and ``sequences``,
``finish`` back to the lab's model:

- :class:`FullFineTune` (θ_trainable = θ), :class:`FrozenBlocks` (chosen blocks), :class:`LoRA`
  (adapters through :mod:`halluc_lab.extensions.lora`);
- the wrappers :class:`Replay` (old data mixed in) and :class:`Anchor` (eq. 12's λΩ,
  :class:`~halluc_lab.extensions.continual.Anchored`).

Every method trains a grown vocabulary's new rows
(:func:`~halluc_lab.extensions.continual.train_new_rows`), and only those rows unless it trains
everything. The pieces they are built from are :mod:`halluc_lab.extensions.continual`'s.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import random
import weakref
from collections.abc import Callable, Sequence

from torch import nn

from halluc_lab.training.data import Encoded
from halluc_lab.extensions.lora import ALL_LINEAR, ATTENTION, LoraSpec, merge, with_lora
from halluc_lab.extensions.continual import Anchored, block_parameters, train_new_rows, train_only
from halluc_lab.model.transformer import Transformer


def _clean(net: nn.Module) -> Transformer:
    """A fresh copy of a lab model's weights: every parameter trainable again, no hook left, in eval
    mode."""
    out = Transformer(net.config).to(next(net.parameters()).device)
    out.load_state_dict(net.state_dict())
    return out.eval()


def _check_model(model) -> None:
    if not isinstance(model, Transformer):
        raise TypeError(f"model must be the lab's Transformer, got {type(model).__name__}")


class Method:
    """What every method shares: ``prepare`` a trainable copy of the lab's model, the training loss
    and sequences, ``finish`` back to the lab's model. ``cuda_graph``: passed to ``train.train``
    (None: its default)."""

    cuda_graph: bool | None = None

    def prepare(self, model: Transformer, first_new: int, *, seed: int) -> nn.Module:
        """A copy of ``model`` whose θ_trainable requires a gradient; rows ``first_new`` … V − 1
        train in every method."""
        raise NotImplementedError

    def finish(self, net: nn.Module) -> Transformer:
        """The lab's model the trained copy computes (eval mode), for the engine and the
        evaluation."""
        return _clean(net)

    def loss(self, net: nn.Module, base: Callable) -> Callable:
        """The training loss on ``net``: ``base`` itself, unless a wrapper adds to it."""
        return base

    def sequences(self, new: Sequence[Encoded], old: Sequence[Encoded], *,
                  seed: int) -> list[Encoded]:
        """The sequences to train on: the new data, unless a wrapper mixes old data in."""
        return list(new)


@dataclasses.dataclass(frozen=True)
class FullFineTune(Method):
    """θ_trainable = θ: every parameter trains. Continuing training from a checkpoint does this
    (001's remark on nanoGPT and nanochat): the naive baseline."""

    @property
    def label(self) -> str:
        return "full fine-tuning"

    def prepare(self, model: Transformer, first_new: int, *, seed: int) -> nn.Module:
        _check_model(model)
        return copy.deepcopy(model).requires_grad_(True).train()


@dataclasses.dataclass(frozen=True)
class FrozenBlocks(Method):
    """θ_trainable = the parameters of ``blocks`` (and the new embedding rows); the rest of the
    backbone frozen."""

    blocks: tuple[int, ...]  # indices of the blocks that train (0 is the first)

    def __post_init__(self):
        if not isinstance(self.blocks, tuple) or not self.blocks:
            raise ValueError("blocks must be a non-empty tuple of block indices, got "
                             f"{self.blocks!r}")

    @property
    def label(self) -> str:
        blocks = ", ".join(map(str, self.blocks))
        return f"frozen backbone, block{'s' * (len(self.blocks) > 1)} {blocks} trained"

    def prepare(self, model: Transformer, first_new: int, *, seed: int) -> nn.Module:
        _check_model(model)
        net = copy.deepcopy(model).train()
        train_only(net, block_parameters(net, list(self.blocks)))
        train_new_rows(net, first_new)
        return net


@dataclasses.dataclass(frozen=True)
class LoRA(Method):
    """θ_trainable = LoRA adapters (:mod:`halluc_lab.extensions.lora`) and the new embedding rows;
    merged back when done."""

    spec: LoraSpec  # rank, α and which linear layers

    # the Hugging Face twin's forward is run eagerly: it is not checked under graph capture
    cuda_graph = False

    def __post_init__(self):
        if not isinstance(self.spec, LoraSpec):
            raise TypeError(f"spec must be a LoraSpec, got {type(self.spec).__name__}")

    @property
    def label(self) -> str:
        names = {frozenset(ALL_LINEAR): "all linear", frozenset(ATTENTION): "attention"}
        where = names.get(frozenset(self.spec.targets), ", ".join(self.spec.targets))
        return f"LoRA r={self.spec.rank} ({where})"

    def prepare(self, model: Transformer, first_new: int, *, seed: int) -> nn.Module:
        _check_model(model)
        vocab = model.config.vocab_size
        if (isinstance(first_new, bool) or not isinstance(first_new, int)
                or not 0 < first_new < vocab):
            raise ValueError(f"first_new must be an int in [1, {vocab - 1}] (the first new token), "
                             f"got {first_new!r}")
        return with_lora(model, self.spec, seed=seed, new_tokens=range(first_new, vocab)).train()

    def finish(self, net: nn.Module) -> Transformer:
        return merge(net).eval()


@dataclasses.dataclass(frozen=True)
class _Wrapper(Method):
    """A method that trains what ``method`` trains, with something added: all it does not override
    is ``method``'s."""

    method: Method  # the method whose parameters train

    def __post_init__(self):
        if not isinstance(self.method, Method):
            raise TypeError(f"method must be a Method, got {type(self.method).__name__}")

    cuda_graph = property(lambda self: self.method.cuda_graph)
    prepare = property(lambda self: self.method.prepare)
    finish = property(lambda self: self.method.finish)
    loss = property(lambda self: self.method.loss)
    sequences = property(lambda self: self.method.sequences)


@dataclasses.dataclass(frozen=True)
class Replay(_Wrapper):
    """``method`` trained on the new sequences with old ones mixed in: ``fraction`` old sequences
    per new one, drawn without replacement and shuffled in (seeded)."""

    fraction: float  # old sequences per new sequence

    def __post_init__(self):
        super().__post_init__()
        if isinstance(self.fraction, bool) or not isinstance(self.fraction, (int, float)) or not (
                math.isfinite(self.fraction) and self.fraction > 0):
            raise ValueError(f"fraction must be a finite number > 0, got {self.fraction!r}")

    label = property(lambda self: f"{self.method.label} + replay {self.fraction:g}")

    def sequences(self, new: Sequence[Encoded], old: Sequence[Encoded], *,
                  seed: int) -> list[Encoded]:
        k = round(self.fraction * len(new))
        if k > len(old):
            raise ValueError(f"replay needs {k} old sequences ({self.fraction:g} per new one), "
                             f"got {len(old)}")
        rng = random.Random(f"replay-{seed}")
        out = self.method.sequences(new, old, seed=seed) + rng.sample(list(old), k)
        rng.shuffle(out)
        return out


@dataclasses.dataclass(frozen=True)
class Anchor(_Wrapper):
    """``method`` with eq. (12)'s λΩ added to its loss (:class:`Anchored`: Ω = ½ ‖ϑ − θ^(k)‖² over
    its trainable parameters, θ^(k) their values when training starts)."""

    lam: float  # λ

    def __post_init__(self):
        super().__post_init__()
        if isinstance(self.lam, bool) or not isinstance(self.lam, (int, float)) or not (
                math.isfinite(self.lam) and self.lam >= 0):
            raise ValueError(f"lam must be a finite number >= 0, got {self.lam!r}")

    label = property(lambda self: f"{self.method.label} + anchor λ={self.lam:g}")

    def prepare(self, model: Transformer, first_new: int, *, seed: int) -> nn.Module:
        net = self.method.prepare(model, first_new, seed=seed)
        _FIRST_NEW[net] = first_new  # the loss, built from the net, leaves the new rows out of Ω
        return net

    def loss(self, net: nn.Module, base: Callable) -> Callable:
        return Anchored(self.method.loss(net, base), net, self.lam, first_new=_FIRST_NEW.get(net))


# net prepared by an Anchor -> its first new token
_FIRST_NEW: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
