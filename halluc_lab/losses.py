"""Losses as pure functions of logits or log-probs, labels and masks.

Every training stage of the book calls into this module: next-token cross-entropy for
pre-training and SFT (chapters 7–8), per-token and per-sequence log-probs for preference
optimisation and policy gradients (chapters 9–10). Nothing here knows about models, tasks or
tokenizers; the training loop (:mod:`halluc_lab.train`) turns a model and a batch into logits
and calls these. Sources: 000 §5.2–5.5 (the SFT loss, cross-entropy, the -100 label), 001 Part 1
eq. (9), 004 §3.7 (label smoothing).

Conventions: ``labels`` has the shape of the inputs and ``labels[t]`` is the target of the
logits at ``t - 1`` (Hugging Face's convention; the shift happens here). :data:`IGNORE` marks a
position with no loss.

Departure: a mean over zero target tokens is undefined (PyTorch returns NaN); here it is an
error, so a batch with no targets is noticed instead of silently training on nothing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE = -100  # the ignore_index of F.cross_entropy (000 §5.4)
REDUCTIONS = ("mean", "sum", "none")


def _check_pair(logits: torch.Tensor, labels: torch.Tensor) -> None:
    if logits.dim() != 3 or labels.shape != logits.shape[:2]:
        raise ValueError(f"logits must be (B, T, V) and labels (B, T); got {tuple(logits.shape)} "
                         f"and {tuple(labels.shape)}")
    if labels.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"labels must hold integer ids, got dtype {labels.dtype}")


def _shifted(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits at t (float32 at least) and the targets at t + 1."""
    z = logits[:, :-1]  # (B, T-1, V)
    z = z.float() if z.dtype in (torch.float16, torch.bfloat16) else z
    return z, labels[:, 1:]  # (B, T-1)


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor, *, label_smoothing: float = 0.0,
                   reduction: str = "mean") -> torch.Tensor:
    """Next-token cross-entropy: logits at t score ``labels[t + 1]``; IGNORE labels are skipped.

    Args:
        logits: (B, T, V); computed in float32 at least.
        labels: (B, T) ids or IGNORE.
        label_smoothing: ε of 004 §3.7: the target becomes (1 - ε)·onehot + ε/V.
        reduction: "mean" over target tokens (000 §5.2 per token), "sum", or "none": a (B, T-1)
            tensor of per-position losses, 0 where the label is IGNORE.

    Raises ValueError for ``reduction="mean"`` when no label is a target (the mean is undefined).

    Example:
        >>> logits = torch.zeros(1, 3, 5); labels = torch.tensor([[-100, 2, 4]])
        >>> round(float(causal_lm_loss(logits, labels)), 4)   # log 5
        1.6094
    """
    _check_pair(logits, labels)
    if not (isinstance(label_smoothing, (int, float)) and 0.0 <= label_smoothing < 1.0):
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing!r}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    z, y = _shifted(logits, labels)
    if reduction == "mean" and not bool((y != IGNORE).any()):
        raise ValueError("every label is IGNORE: the mean loss over zero target tokens is undefined")
    per_token = F.cross_entropy(z.flatten(0, 1), y.flatten(), ignore_index=IGNORE,
                                label_smoothing=label_smoothing, reduction="none").view_as(y)  # (B, T-1)
    if reduction == "none":
        return per_token
    total = per_token.sum()
    return total if reduction == "sum" else total / (y != IGNORE).sum()


def label_smoothed_nll(logits: torch.Tensor, targets: torch.Tensor, epsilon: float) -> torch.Tensor:
    """Reference: the mean of -Σ_k q'(k) log p(k) with q' = (1 - ε)δ_{k,y} + ε/K (004 §3.7).

    logits (N, K), targets (N,) with no IGNORE; the readable version :func:`causal_lm_loss` agrees with.
    """
    logp = torch.log_softmax(logits, dim=-1)  # (N, K)
    k = logits.shape[-1]
    q = torch.full_like(logp, epsilon / k)  # (N, K) the uniform part ε u(k), u = 1/K
    q.scatter_add_(1, targets[:, None], torch.full_like(logp[:, :1], 1.0 - epsilon))  # + (1 - ε) δ_{k,y}
    return -(q * logp).sum(-1).mean()


def token_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log p_θ(labels[t+1] | ids[≤t]) at every position, 0 where the label is IGNORE: (B, T-1).

    Differentiable; the building block of DPO (chapter 9) and policy gradients (chapter 10).

    >>> logits = torch.zeros(1, 3, 4); labels = torch.tensor([[-100, 1, -100]])
    >>> token_logprobs(logits, labels)     # log 1/4 where there is a target
    tensor([[-1.3863,  0.0000]])
    """
    _check_pair(logits, labels)
    z, y = _shifted(logits, labels)
    target = y != IGNORE  # (B, T-1)
    logp = torch.log_softmax(z, dim=-1).gather(-1, y.clamp_min(0)[..., None])[..., 0]  # (B, T-1)
    return torch.where(target, logp, torch.zeros_like(logp))


def sequence_logprobs(logits: torch.Tensor, labels: torch.Tensor,
                      mask: torch.Tensor | None = None) -> torch.Tensor:
    """Σ_t log p_θ(y_t | ·) over each row's target tokens: (B,).

    ``mask`` (B, T-1) bool, aligned with :func:`token_logprobs`, leaves further positions out — the
    tokens a rollout erased with ``<bksp>`` or that the caller forced, whose probability the policy
    did not choose.
    """
    lp = token_logprobs(logits, labels)  # (B, T-1)
    if mask is not None:
        if mask.shape != lp.shape or mask.dtype != torch.bool:
            raise ValueError(f"mask must be a bool tensor of shape {tuple(lp.shape)} (aligned with the "
                             f"shifted labels), got {mask.dtype} {tuple(mask.shape)}")
        lp = lp * mask
    return lp.sum(-1)
