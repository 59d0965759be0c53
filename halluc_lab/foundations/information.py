"""Information theory on probability tensors: entropy, cross-entropy, KL, total variation,
perplexity, surprisal.

Chapter 1 (autoregressive language models). Sources: 002 "Information Theory" and "Entropy"
(surprisal in bits, entropy of the next-token distribution), 002 "Perplexity", 004 §2.1.1
(perplexity of a model with an entropy of three bits is 8) and §2.1.2 (H(P, Q) = H(P) + KL),
000 §5.3 Proposition 2 (L_SFT = KL + H).

Every function takes probabilities (not logits), works over any leading batch dimensions, and
reduces over ``dim``; ``unit`` is ``"nats"`` (natural log, the default of the whole book) or
``"bits"`` (log base 2). The conventions, where the documents leave them implicit:

- ``0 · log 0 = 0`` (the limit of p log p as p → 0), so zero-probability outcomes add nothing to
  an entropy and nothing to a cross-entropy or KL where the *first* argument is zero.
- Where the first distribution puts mass on an outcome the second gives probability 0, the
  cross-entropy and the KL divergence are ``+inf`` (their true value), never NaN.
- A distribution must be finite, non-negative and sum to 1 along ``dim`` within a tolerance
  that depends on the dtype (:func:`sum_tolerance`); anything else raises ``ValueError``.
- Low-precision inputs (bf16, fp16) are computed in float32; float64 stays float64.

Departure from the documents: 004 §2.1.1 writes the perplexity both as 2^H and as exp(CE)
without naming the units; here :func:`perplexity` is ``exp(H in nats) = 2 ** (H in bits)``,
the same number either way (chapter 1 shows it).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Sequence

import torch

UNITS = ("nats", "bits")


def sum_tolerance(dtype: torch.dtype) -> float:
    """How far from 1 a row of ``dtype`` probabilities may sum: 1e3 machine epsilons, in
    [1e-6, 1e-2]."""
    return min(1e-2, max(1e-6, 1e3 * torch.finfo(dtype).eps))


def _log_base(unit: str) -> float:
    """The divisor that turns natural logs into ``unit``."""
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {UNITS}, got {unit!r}")
    return 1.0 if unit == "nats" else math.log(2.0)


def _work_dtype(t: torch.Tensor) -> torch.Tensor:
    """Promote half precision to float32 so that logs are accurate; keep float32/float64."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _check_dim(name: str, t: torch.Tensor, dim: int) -> None:
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise TypeError(f"dim must be an int, got {type(dim).__name__}")
    if t.dim() == 0:
        raise ValueError(f"{name} must have at least one dimension (the outcomes), got a scalar")
    if not -t.dim() <= dim < t.dim():
        raise ValueError(f"dim must be in [{-t.dim()}, {t.dim() - 1}] for {name} of shape "
                         f"{tuple(t.shape)}, got {dim}")


def _check_probabilities(name: str, t: torch.Tensor) -> None:
    """Entries must be finite floats in [0, 1]."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor of probabilities, got {t.dtype}")
    if t.numel() and not bool(torch.isfinite(t).all()):
        raise ValueError(
            f"{name} has non-finite entries (NaN or inf); probabilities must be finite"
        )
    if t.numel() and bool((t < 0).any()):
        raise ValueError(f"{name} has negative entries (smallest {t.min().item():.3g}); "
                         "probabilities must be in [0, 1]")
    if t.numel() and bool((t > 1).any()):
        raise ValueError(f"{name} has entries above 1 (largest {t.max().item():.6g}); "
                         "probabilities must be in [0, 1]")


def check_distribution(probs: torch.Tensor, dim: int = -1, name: str = "probs") -> None:
    """Raise unless ``probs`` holds distributions along ``dim`` (finite, ≥ 0, summing to 1).

    The tolerance on the sum is :func:`sum_tolerance` of the dtype (1.2e-4 for float32).
    """
    _check_probabilities(name, probs)
    _check_dim(name, probs, dim)
    if probs.shape[dim] == 0:
        raise ValueError(f"{name} has no outcomes along dim {dim} (size 0)")
    total = _work_dtype(probs).sum(dim=dim)
    tol = sum_tolerance(probs.dtype)
    # an empty batch has no bad row
    worst = (total - 1).abs().max().item() if total.numel() else 0.0
    if worst > tol:
        raise ValueError(f"{name} must sum to 1 along dim {dim} (tolerance {tol:.1e} for "
                         f"{probs.dtype}); the worst row is off by {worst:.3g}")


def _pair(p: torch.Tensor, q: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two distributions of one shape, checked, in one working dtype (p's)."""
    check_distribution(p, dim, "p")
    check_distribution(q, dim, "q")
    if p.shape != q.shape:
        raise ValueError(
            f"p and q must have the same shape, got {tuple(p.shape)} and {tuple(q.shape)}"
        )
    pw = _work_dtype(p)
    return pw, _work_dtype(q).to(pw.dtype)


def _xlogy(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x · log y with 0 · log 0 = 0 (and 0 · log y = 0 for any y)."""
    return torch.special.xlogy(x, y)


def entropy(probs: torch.Tensor, dim: int = -1, unit: str = "nats") -> torch.Tensor:
    """Shannon entropy H(p) = -Σ p log p along ``dim``.

    Args:
        probs: (..., V, ...) distributions along ``dim``.
        dim: the outcome dimension.
        unit: "nats" (ln) or "bits" (log2).

    Returns:
        (...) the entropy of each distribution, ``dim`` removed.

    Example:
        >>> entropy(torch.full((8,), 1 / 8), unit="bits")   # 004 §2.1.1: three bits
        tensor(3.0000)
    """
    base = _log_base(unit)
    check_distribution(probs, dim)
    p = _work_dtype(probs)
    return -_xlogy(p, p).sum(dim=dim) / base


def cross_entropy(
    p: torch.Tensor, q: torch.Tensor, dim: int = -1, unit: str = "nats"
) -> torch.Tensor:
    """Cross-entropy H(p, q) = -Σ p log q along ``dim`` (004 §2.1.2).

    ``+inf`` where q is 0 on an outcome p gives mass to.

    Args:
        p: (..., V) the reference ("true", data) distributions.
        q: (..., V) the model distributions, same shape as ``p``.

    Returns:
        (...) cross-entropies.

    Example:
        >>> p, q = torch.tensor([0.5, 0.5]), torch.tensor([0.9, 0.1])
        >>> torch.allclose(cross_entropy(p, q), entropy(p) + kl_divergence(p, q))
        True
    """
    base = _log_base(unit)
    pw, qw = _pair(p, q, dim)
    return -_xlogy(pw, qw).sum(dim=dim) / base


def kl_divergence(
    p: torch.Tensor, q: torch.Tensor, dim: int = -1, unit: str = "nats"
) -> torch.Tensor:
    """Kullback–Leibler divergence KL(p ‖ q) = Σ p log(p / q) along ``dim``; ≥ 0, 0 iff p = q.

    ``+inf`` where q is 0 on an outcome p gives mass to.

    Args:
        p: (..., V) the reference distributions.
        q: (..., V) the model distributions, same shape as ``p``.

    Returns:
        (...) divergences, each ≥ 0.

    Example:
        >>> kl_divergence(torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.5]), unit="bits")
        tensor(1.)
    """
    base = _log_base(unit)
    pw, qw = _pair(p, q, dim)
    # Σ p log p − Σ p log q, each term with 0 · log 0 = 0; clamp the float rounding of an exact 0
    # at 0 (KL is never negative) — it moves the result by at most a few ulps.
    kl = (_xlogy(pw, pw) - _xlogy(pw, qw)).sum(dim=dim) / base
    return kl.clamp_min(0.0)


def total_variation(p: torch.Tensor, q: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Total-variation distance ½ Σ |p − q| along ``dim``: the most probability the two
    distributions give differently to any one event; 0 iff p = q, 1 for disjoint supports.

    >>> total_variation(torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.5]))
    tensor(0.5000)
    """
    pw, qw = _pair(p, q, dim)
    return 0.5 * (pw - qw).abs().sum(dim=dim)


def sample_total_variation(a: Sequence[Hashable], b: Sequence[Hashable]) -> float:
    """Total-variation distance between the empirical distributions of two samples of outcomes.
    Summed in integer counts, with one division at the end, so the value does not depend on the
    (hash-seeded) order in which a set lists the outcomes.

    >>> sample_total_variation("aab", "abb")
    0.3333333333333333
    """
    if not len(a) or not len(b):
        raise ValueError(f"both samples need outcomes, got {len(a)} and {len(b)}")
    ca, cb = Counter(a), Counter(b)
    diff = sum(abs(ca[x] * len(b) - cb[x] * len(a)) for x in ca.keys() | cb.keys())
    return diff / (2 * len(a) * len(b))


def perplexity(probs: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Perplexity of a distribution, exp(H in nats) = 2 ** (H in bits): its effective number of
    outcomes.

    A uniform distribution over k outcomes has perplexity exactly k (002 "Perplexity": "choosing
    among 10 options"); any other distribution over k outcomes has less.

    Args:
        probs: (..., V) distributions along ``dim``.

    Returns:
        (...) perplexities in [1, V].

    Example:
        >>> perplexity(torch.full((10,), 0.1))
        tensor(10.0000)
    """
    return torch.exp(entropy(probs, dim=dim, unit="nats"))


def sequence_perplexity(token_log_probs: torch.Tensor, mask: torch.Tensor | None = None,
                        dim: int | None = None) -> torch.Tensor:
    """Perplexity of a model on observed tokens: exp(-mean log q(x_i | x_<i)) (002, 004 eq.
    2.2–2.6).

    Args:
        token_log_probs: (..., T) natural-log probabilities the model gave the observed tokens;
            each ≤ 0, ``-inf`` allowed (a token the model ruled out: perplexity ``+inf``).
        mask: optional (..., T) bool, True where a token counts (e.g. not padding).
        dim: reduce only this dimension (one perplexity per sequence); None pools every token.

    Returns:
        the pooled perplexity (a scalar) or one per sequence.

    Example:
        >>> sequence_perplexity(torch.log(torch.tensor([0.5, 0.5, 0.25, 0.125])))
        tensor(3.3636)
    """
    lp = token_log_probs
    if not isinstance(lp, torch.Tensor) or not lp.is_floating_point():
        raise TypeError("token_log_probs must be a floating-point tensor of log-probabilities")
    if bool(torch.isnan(lp).any()) or bool((lp == math.inf).any()):
        raise ValueError(
            "token_log_probs has NaN or +inf entries; log-probabilities are in [-inf, 0]"
        )
    if bool((lp > 1e-6).any()):
        raise ValueError(
            "token_log_probs must be ≤ 0 (log of a probability), "
            f"largest is {lp.max().item():.3g}"
        )
    if mask is None:
        mask = torch.ones_like(lp, dtype=torch.bool)
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.shape != lp.shape:
        raise ValueError(f"mask must be a bool tensor of shape {tuple(lp.shape)}")
    if dim is not None:
        _check_dim("token_log_probs", lp, dim)
    lp = _work_dtype(lp)
    nll = torch.where(mask, -lp, torch.zeros_like(lp))  # masked positions add nothing
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    if bool((count == 0).any()):
        raise ValueError(
            "mask leaves no token to average over (a sequence has zero counted tokens)"
        )
    total = nll.sum() if dim is None else nll.sum(dim=dim)
    return torch.exp(total / count)


def surprisal(probs: torch.Tensor, unit: str = "nats") -> torch.Tensor:
    """Surprisal (self-information) I = -log p of each probability, elementwise (002 "Information
    Theory").

    ``+inf`` for p = 0. No normalisation is required: each entry is one event's probability.

    Args:
        probs: (...) probabilities in [0, 1].

    Returns:
        (...) surprisals, same shape.

    Example:
        >>> surprisal(torch.tensor([0.5, 0.125]), unit="bits")
        tensor([1., 3.])
    """
    base = _log_base(unit)
    _check_probabilities("probs", probs)
    return -torch.log(_work_dtype(probs)) / base
