"""Continual learning's machinery: which parameters train, eq. (12)'s anchor, and the geometry of
forgetting.

Chapter 12. Source: 001 Part 4 §1. The document splits the parameters, θ = (θ_frozen, θ_trainable),
and updates only the trainable part on a new corpus D^(k+1), with a regulariser that keeps it near
the last solution (eq. 12)::

    θ_trainable^(k+1) = argmin_ϑ [ L^(k+1)(θ_frozen, ϑ) + λ Ω(ϑ, θ_trainable^(k)) ].

It explains forgetting by geometry: the new loss's gradient g^(k+1) "generically has a nonzero
projection onto the subspace spanned by the earlier task gradients" S^(k), so a step −η g^(k+1)
changes the old losses too, to first order by −η ⟨∇L^(i), g^(k+1)⟩. This module gives each piece as
a function of a model, so the chapter can measure them on the lab's models:

- :func:`grow_vocabulary` gives a model new token rows for the names a grown world adds
  (:mod:`halluc_lab.tasks.kb_growth`), every old weight kept;
- :func:`train_only` freezes every parameter but the chosen ones (``train.train``'s optimizer takes
  only those that require a gradient); :func:`block_parameters` names a block's;
- :func:`train_new_rows` lets a grown vocabulary's new embedding rows train while the old rows stay
  frozen;
- the methods the chapter compares, built from these pieces, are
  :mod:`halluc_lab.extensions.continual_methods`';
- :func:`old_prompt_kl` measures how far a fine-tuned model moved on old prompts: KL(old ‖ new) per
  token;
- :class:`Anchored` is a loss with λΩ added, Ω(ϑ, θ^(k)) = ½ ‖ϑ − θ^(k)‖² over the trainable
  parameters (the simplest Ω: it pulls on the weights, not on the hidden representations F_θ(E) the
  document names);
- :func:`flat_gradient` is ∇_θ L on a batch as one vector, :func:`span_share` the share of a
  gradient's squared norm inside the span of others (cos² of its angle to S^(k): 1 inside it, 0
  orthogonal to it), and :func:`first_order_change` the predicted change of an old loss after one
  step on the new one.

Departure: in the document θ_frozen holds the embeddings. A grown vocabulary's new names have no
embedding until they are trained, so every method (:mod:`~halluc_lab.extensions.continual_methods`)
trains the new rows (and only those rows, unless it trains everything).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import torch
from torch import nn

from halluc_lab.training.data import IGNORE, encode_example, pad
from halluc_lab.model.transformer import Transformer
from halluc_lab.tasks.base import Example
from halluc_lab.model.tokenizer import Tokenizer

Tensor = torch.Tensor


@torch.no_grad()
def grow_vocabulary(model: nn.Module, vocab_size: int, *, seed: int) -> nn.Module:
    """A copy of the lab's ``model`` with ``vocab_size`` tokens: the old rows of the embedding (and
    of an untied head) kept, the new rows drawn Normal(0, init_std) with ``seed``. On every old
    token the copy computes the old logits, with the new tokens' logits beside them."""
    old = model.config.vocab_size
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < old:
        raise ValueError(f"vocab_size must be an int >= the model's {old}, got {vocab_size!r}")
    device = next(model.parameters()).device
    grown = Transformer(dataclasses.replace(model.config, vocab_size=vocab_size)).to(device)
    state = model.state_dict()
    g = torch.Generator().manual_seed(seed)
    for name, p in grown.state_dict().items():
        if p.shape == state[name].shape:
            p.copy_(state[name])
        else:  # (vocab, hidden): the embedding, or an untied head
            new = torch.randn(vocab_size - old, p.shape[1], generator=g) * model.config.init_std
            p.copy_(torch.cat([state[name], new.to(p.device, p.dtype)]))
    return grown


def train_only(model: nn.Module, names: Sequence[str]) -> list[str]:
    """Make ``names`` (parameter names, as ``named_parameters`` gives them) θ_trainable and freeze
    the rest in place; return the trainable names in the model's order. Unknown names are an
    error."""
    params = dict(model.named_parameters())
    unknown = sorted(set(names) - set(params))
    if unknown or not names:
        raise ValueError("names must be a non-empty subset of the model's parameters; unknown: "
                         f"{unknown[:5]}")
    chosen = set(names)
    for name, p in params.items():
        p.requires_grad_(name in chosen)
    return [n for n in params if n in chosen]


def block_parameters(model: nn.Module, blocks: Sequence[int]) -> list[str]:
    """The names of the parameters of the lab model's blocks ``blocks`` (0 is the first)."""
    n = len(model.layers)
    if not blocks or any(isinstance(b, bool) or not isinstance(b, int) or not 0 <= b < n
                         for b in blocks):
        raise ValueError(f"blocks must be a non-empty list of block indices in [0, {n - 1}], got "
                         f"{list(blocks)!r}")
    prefixes = tuple(f"layers.{b}." for b in blocks)
    return [name for name, _ in model.named_parameters() if name.startswith(prefixes)]


class Anchored:
    """``loss`` plus eq. (12)'s λΩ(ϑ, θ^(k)), Ω = ½ ‖ϑ − θ^(k)‖² summed over the trainable
    parameters.

    ``loss(model, batch) -> (summed loss, count)`` as :data:`halluc_lab.training.step.Loss`; the
    training step divides by the count, so λΩ is added as λΩ·count and the step minimises mean
    loss + λΩ. ``anchor``: the trainable parameters' values at the start (θ^(k)), taken from
    ``model`` now. ``first_new``: a grown vocabulary's first new token; its rows and later ones of
    the token embedding and of an untied head are left out of Ω, as the new names had no θ^(k) to
    stay near (their start is a random draw).
    """

    def __init__(self, loss: Callable, model: nn.Module, lam: float, *,
                 first_new: int | None = None):
        if (isinstance(lam, bool) or not isinstance(lam, (int, float))
                or not (math.isfinite(lam) and lam >= 0)):
            raise ValueError(f"lam must be a finite number >= 0, got {lam!r}")
        self.loss, self.lam = loss, float(lam)
        self.anchor = {n: p.detach().clone() for n, p in model.named_parameters()
                       if p.requires_grad}
        if not self.anchor:
            raise ValueError("the model has no trainable parameter to anchor (call "
                             "train_only first?)")
        self.rows = {}  # parameter name -> how many leading rows Ω covers (all, if not named)
        if first_new is not None:
            for n, a in self.anchor.items():
                if n.endswith(_TOKEN_ROWS):
                    if (isinstance(first_new, bool) or not isinstance(first_new, int)
                            or not 0 < first_new < len(a)):
                        raise ValueError(f"first_new must be an int in [1, {len(a) - 1}], got "
                                         f"{first_new!r}")
                    self.rows[n] = first_new
        # rows Ω covers, every parameter
        self._kept = {n: self.rows.get(n, len(a)) for n, a in self.anchor.items()}

    def penalty(self, model: nn.Module) -> Tensor:
        """Ω(ϑ, θ^(k)) = ½ Σ ‖ϑ − θ^(k)‖² (the new token rows left out)."""
        params = dict(model.named_parameters())
        return 0.5 * sum(((params[n][:self._kept[n]] - a[:self._kept[n]]) ** 2).sum()
                         for n, a in self.anchor.items())

    def __call__(self, model: nn.Module, batch) -> tuple[Tensor, Tensor]:
        summed, count = self.loss(model, batch)
        if not self.lam:
            return summed, count
        return summed + self.lam * self.penalty(model) * count, count


def flat_gradient(model: nn.Module, loss: Callable, batch) -> Tensor:
    """∇_θ of the batch's mean loss, ``loss(model, batch) -> (summed, count)``, over the parameters
    that require a gradient, concatenated in the model's order (float32). The model's ``.grad``
    fields are left as they were."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no parameter that requires a gradient")
    summed, count = loss(model, batch)
    grads = torch.autograd.grad(summed / count.clamp_min(1), params, allow_unused=True)
    return torch.cat([(torch.zeros_like(p) if g is None else g).float().flatten()
                      for p, g in zip(params, grads)])


def span_share(g: Tensor, others: Sequence[Tensor]) -> float:
    """‖P g‖² / ‖g‖²: the share of ``g``'s squared norm in the span of ``others`` (P the orthogonal
    projection).

    It is cos² of the angle between g and the subspace: 1 for g inside it, 0 for g orthogonal to it.

    >>> span_share(torch.tensor([1.0, 1.0, 0.0]), [torch.tensor([1.0, 0.0, 0.0])])
    0.5
    """
    if g.dim() != 1 or not others or any(o.shape != g.shape for o in others):
        raise ValueError("g must be 1-D and others a non-empty list of vectors of its shape "
                         f"{tuple(g.shape)}")
    norm2 = float(g.double().pow(2).sum())
    if norm2 == 0:
        raise ValueError("g is the zero vector: it has no direction")
    basis = torch.stack([o.double() for o in others], 1)  # (P, k)
    q, r = torch.linalg.qr(basis)  # reduced: q (P, k) orthonormal columns spanning the others
    # drop dependent columns
    keep = r.diagonal().abs() > 1e-12 * max(float(r.diagonal().abs().max()), 1e-300)
    coeff = q[:, keep].T @ g.double()
    return float(coeff.pow(2).sum()) / norm2


def first_order_change(g_old: Tensor, g_new: Tensor, lr: float) -> float:
    """The change of an old loss after one plain gradient step θ ← θ − η g_new, to first order: −η
    ⟨g_old, g_new⟩.

    >>> first_order_change(torch.tensor([1.0, 2.0]), torch.tensor([3.0, -1.0]), 0.1)
    -0.1
    """
    if g_old.shape != g_new.shape or g_old.dim() != 1:
        raise ValueError(f"g_old and g_new must be vectors of one shape, got {tuple(g_old.shape)} "
                         f"and {tuple(g_new.shape)}")
    return -lr * float(g_old.double() @ g_new.double())


# the lab model's parameters with a row per token
_TOKEN_ROWS = ("embed_tokens.weight", "lm_head.weight")


# -- which parameters train -------------------------------------------------------
def train_new_rows(model: nn.Module, first_new: int) -> list:
    """Let the embedding rows of tokens ``first_new`` … V − 1 (a grown vocabulary's new names)
    train, and an untied head's: the weight requires a gradient, and a hook zeroes the gradient of
    every older row. With AdamW at weight decay 0 an old row then never moves (a zero gradient gives
    Adam a zero update). Returns the hooks' handles."""
    emb = model.embed_tokens.weight
    if (isinstance(first_new, bool) or not isinstance(first_new, int)
            or not 0 < first_new < emb.shape[0]):
        raise ValueError(f"first_new must be an int in [1, {emb.shape[0] - 1}] (the first new "
                         f"token), got {first_new!r}")
    weights = [emb] + ([] if model.lm_head is None else [model.lm_head.weight])
    handles = []
    for w in weights:
        # (V, 1): 1 on the new rows
        keep = torch.zeros(w.shape[0], 1, device=w.device, dtype=w.dtype)
        keep[first_new:] = 1
        w.requires_grad_(True)
        handles.append(w.register_hook(lambda g, keep=keep: g * keep))
    return handles


# -- how far the old behaviour moved ---------------------------------------------------------------
@torch.no_grad()
def old_prompt_kl(old: nn.Module, new: nn.Module, tok: Tokenizer,
                  examples: Sequence[Example]) -> list[float]:
    """Per example, the mean over its completion tokens (``<eos>`` included) of KL(p_old ‖ p_new) of
    the next-token distributions, teacher-forced on the gold completion (nats). ``old`` may know
    fewer tokens than ``new`` (a grown vocabulary, old ids first): p_old puts no mass on the new
    ones, and p_new is not renormalised, so the mass a fine-tuned model moved to new tokens counts.
    ``tok`` must encode the examples for both."""
    if not examples:
        raise ValueError("examples must hold at least one Example")
    b = pad([encode_example(tok, e) for e in examples],
            tok.pad_id).to(next(new.parameters()).device)
    was = old.training, new.training
    old.eval(), new.eval()
    try:
        lp_old = torch.log_softmax(old(b.input_ids).double(), -1)  # (B, T, V_old)
        lp_new = torch.log_softmax(new(b.input_ids).double(), -1)  # (B, T, V_new)
    finally:
        old.train(was[0]), new.train(was[1])
    v_old, v_new = lp_old.shape[-1], lp_new.shape[-1]
    if v_old > v_new:
        raise ValueError(f"old knows {v_old} tokens, more than new's {v_new}: pass the models the "
                         "other way round")
    # (B, T-1): the token at t+1 predicted
    kl = (lp_old.exp() * (lp_old - lp_new[..., :v_old])).sum(-1)[:, :-1]
    mask = (b.labels[:, 1:] != IGNORE).double()  # (B, T-1) completion tokens
    return ((kl * mask).sum(1) / mask.sum(1)).tolist()
