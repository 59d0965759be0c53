"""RLVR's policy gradients with group baselines (chapter 10): group advantages, REINFORCE as in
001's Listing 3, GRPO, Dr. GRPO and DAPO, as pure functions of log-probs, advantages and masks,
and as the callables a run is given (:class:`Listing3`, :class:`GRPO`, :class:`DrGRPO`,
:class:`DAPO`: the variant is the object passed, with what it divides by).

Each is PPO's clipped surrogate (:func:`~halluc_lab.training.losses.ppo_clipped_objective`,
re-exported here) with its own normalisation over tokens and sequences. Nothing here knows about
models, tasks or tokenizers; :mod:`halluc_lab.stages.rlvr` runs them. Sources: 001 Part 2 §3
Listing 3 (nanochat's simplified GRPO); Shao et al. 2024 (DeepSeekMath: GRPO, eq. 3), Liu et al.
2025, "Understanding R1-Zero-Like Training" (Dr. GRPO), Yu et al. 2025 (DAPO).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real

import torch

from halluc_lab.training.losses import (_check_mask, _check_same_shape, check_positive,
                                        ppo_clipped_objective)

__all__ = ["group_advantages", "listing3_loss", "grpo_loss", "dr_grpo_loss", "dapo_loss",
           "Listing3", "GRPO", "DrGRPO", "DAPO", "POLICY_LOSSES", "ppo_clipped_objective"]
Tensor = torch.Tensor


# -- policy gradients with group baselines: REINFORCE, GRPO, Dr. GRPO, DAPO (chapter 10) -----------
# Shared conventions: ``logp`` (B, T) log π_θ of each sampled token, differentiable; ``logp_old``
# (B, T) log π_old of the same tokens, detached (= logp.detach() on-policy: ρ = 1); ``advantages``
# (B,), one per sequence, or (B, T); ``mask`` (B, T) bool, the tokens the policy chose (sampled: not
# forced, not padding); ``kl`` (B, T) a per-token KL estimate (e.g. ``kl_estimates(...).k3``)
# weighted by ``beta`` ≥ 0. Each returns a scalar to *minimise*; none reads a tensor's values on the
# host (CUDA-graph safe).
def group_advantages(rewards: torch.Tensor, group_size: int, *, scale: bool = True,
                     eps: float = 1e-6) -> torch.Tensor:
    """A_i = r_i − mean(r of its group), divided by (std of the group + eps) if ``scale``.

    ``rewards``: (N,) ordered prompt-major (rows p·G … p·G + G − 1 are the G samples of prompt p);
    ``group_size`` G ≥ 2 divides N. The std is the sample std (Bessel's n − 1, torch.std, as TRL's
    GRPOTrainer): ``scale=True`` is GRPO's normalisation (Shao et al. 2024), ``scale=False``
    Dr. GRPO's (Liu et al. 2025: the std favours prompts that are too easy or too hard). A group
    whose rewards all tie gets exactly 0: it carries no signal. Returns (N,) float32 (float64 stays
    float64).

    >>> group_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0]), 2)      # ±0.5 / std √½; a tie
    tensor([ 0.7071, -0.7071,  0.0000,  0.0000])
    """
    if not isinstance(rewards, torch.Tensor) or rewards.dim() != 1 or rewards.numel() == 0:
        got = tuple(rewards.shape) if isinstance(rewards, torch.Tensor) else type(rewards).__name__
        raise ValueError(f"rewards must be a non-empty 1-D tensor (N,), got {got}")
    if isinstance(group_size, bool) or not isinstance(group_size, Integral) or group_size < 2:
        raise ValueError("a group baseline needs at least 2 samples: group_size must be an int >= "
                         f"2, got {group_size!r}")
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    check_positive("eps", eps)
    r = rewards.reshape(-1, group_size)  # (P, G): one prompt per row
    r = r if r.dtype == torch.float64 else r.float()
    adv = r - r.mean(1, keepdim=True)
    if scale:
        adv = adv / (r.std(1, keepdim=True) + eps)  # correction=1 (Bessel), defined since G ≥ 2
    tied = (r == r[:, :1]).all(1, keepdim=True)  # exact 0, not a rounding error of the mean
    return torch.where(tied, 0.0, adv).view(-1)


def _token_advantages(logp: torch.Tensor, advantages: torch.Tensor,
                      mask: torch.Tensor) -> torch.Tensor:
    """Checks logp (B, T), mask and advantages; returns the advantages as (B, T)."""
    if not isinstance(logp, torch.Tensor) or logp.dim() != 2 or logp.numel() == 0:
        got = tuple(logp.shape) if isinstance(logp, torch.Tensor) else type(logp).__name__
        raise ValueError(f"logp must be a non-empty (B, T) tensor, got {got}")
    _check_mask(mask, logp)
    if not isinstance(advantages, torch.Tensor):
        raise TypeError(f"advantages must be a torch.Tensor, got {type(advantages).__name__}")
    if advantages.shape not in (logp.shape[:1], logp.shape):
        raise ValueError(f"advantages must be (B,) = {tuple(logp.shape[:1])} or (B, T) = "
                         f"{tuple(logp.shape)}, "
                         f"got {tuple(advantages.shape)}")
    # one A per sequence
    return advantages[:, None].expand_as(logp) if advantages.dim() == 1 else advantages


def _pg_token_loss(logp, logp_old, advantages, mask, clip, clip_high, kl, beta) -> torch.Tensor:
    """−[min(ρA, clip(ρ, 1 − ε, 1 + ε_high) A) − β kl] per token: (B, T), 0 off the mask."""
    advantages = _token_advantages(logp, advantages, mask)
    loss = -ppo_clipped_objective(logp, logp_old, advantages, mask, clip, clip_high=clip_high)
    if isinstance(beta, bool) or not isinstance(beta, Real) or not 0 <= beta < math.inf:
        raise ValueError(f"beta must be a finite number >= 0, got {beta!r}")
    if kl is not None:
        _check_same_shape(logp=logp, kl=kl)
    if beta > 0:
        if kl is None:
            raise ValueError("beta > 0 needs kl, a per-token KL estimate such as "
                             "kl_estimates(...).k3")
        # in the loss, per token (Shao et al. eq. 3), not in the reward
        loss = loss + beta * torch.where(mask, kl, 0.0)
    return loss


def listing3_loss(logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """001's Listing 3, ``loss = -(log_probs * advantages).mean()``, done right: −Σ_mask
    logp·A / Σ_mask 1.

    On-policy REINFORCE with a mean-shifted baseline, no KL penalty, no clipping, no ratio. The
    listing's ``.mean()`` over a padded tensor counts the padding; here the mean runs over the
    masked tokens only (0 if there are none). The listing also calls ``optimizer.step()`` without
    ``loss.backward()``, so as printed it never changes the weights: the fix is the backward pass,
    which the caller does.

    >>> listing3_loss(torch.tensor([[-1.0, -2.0, 9.0]]), torch.tensor([2.0]),
    ...               torch.tensor([[True, True, False]]))
    tensor(3.)
    """
    advantages = _token_advantages(logp, advantages, mask)
    # where, not ×: padding may hold anything
    total = torch.where(mask, logp * advantages, 0.0).sum()
    return -total / mask.sum().clamp_min(1)


def grpo_loss(logp: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor,
              mask: torch.Tensor, *, clip: float = 0.2, kl: torch.Tensor | None = None,
              beta: float = 0.0) -> torch.Tensor:
    """GRPO (Shao et al. 2024, eq. 3): per token −[min(ρA, clip(ρ, 1 − ε, 1 + ε) A) − β kl],
    averaged over each sequence's own masked tokens (the 1/|o_i|), then over the sequences.

    A row with no masked token contributes 0 and is left out of the mean over sequences. Each
    sequence weighs the same whatever its length, so a token of a long one weighs less.

    >>> mask = torch.tensor([[True, False, False], [True, True, True]])    # lengths 1 and 3
    >>> grpo_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.tensor([1.0, -1.0]),
    ...           mask)  # (−1 + 1) / 2
    tensor(0.)
    """
    per_token = _pg_token_loss(logp, logp_old, advantages, mask, clip, None, kl, beta)
    lengths = mask.sum(1)  # (B,) |o_i|
    per_seq = per_token.sum(1) / lengths.clamp_min(1)  # 0 for an empty row, no 0/0
    return per_seq.sum() / (lengths > 0).sum().clamp_min(1)


def dr_grpo_loss(logp: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor,
                 mask: torch.Tensor, *, max_tokens: int, clip: float = 0.2,
                 kl: torch.Tensor | None = None, beta: float = 0.0) -> torch.Tensor:
    """Dr. GRPO (Liu et al. 2025): GRPO's per-token term summed over all masked tokens and divided
    by the constant B·``max_tokens`` (the generation budget), not by each sequence's length.

    The 1/|o_i| of GRPO shrinks the push on long wrong answers (and grows it on short right ones);
    a constant removes that length bias. Pair it with ``group_advantages(..., scale=False)``.

    >>> mask = torch.tensor([[True, False, False], [True, True, True]])
    >>> dr_grpo_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.tensor([1.0, -1.0]), mask,
    ...              max_tokens=4)  # (−1 + 3) / 8
    tensor(0.2500)
    """
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, Integral) or max_tokens < 1:
        raise ValueError("max_tokens must be an int >= 1 (the generation budget), got "
                         f"{max_tokens!r}")
    per_token = _pg_token_loss(logp, logp_old, advantages, mask, clip, None, kl, beta)
    return per_token.sum() / (logp.shape[0] * max_tokens)


def dapo_loss(logp: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor,
              mask: torch.Tensor, *, clip_low: float = 0.2, clip_high: float = 0.28,
              kl: torch.Tensor | None = None, beta: float = 0.0) -> torch.Tensor:
    """DAPO (Yu et al. 2025): per token −[min(ρA, clip(ρ, 1 − ε_low, 1 + ε_high) A) − β kl], summed
    over all masked tokens of the batch and divided by their number (token-level normalisation).

    Clip-higher (ε_high > ε_low) leaves more room to raise unlikely tokens, against entropy
    collapse; token-level normalisation weighs every token the same, so long sequences count in
    proportion.

    >>> dapo_loss(torch.tensor([[math.log(1.25)]]), torch.zeros(1, 1), torch.tensor([1.0]),
    ...           torch.tensor([[True]]))
    tensor(-1.2500)
    """
    per_token = _pg_token_loss(logp, logp_old, advantages, mask, clip_low, clip_high, kl, beta)
    return per_token.sum() / mask.sum().clamp_min(1)


# -- the losses, as callables: the variant is the object passed ------------------------------------
@dataclass(frozen=True)
class Listing3:
    """001's Listing 3 with its backward pass: −mean over tokens of log π · A, A = R − mean of the
    group."""

    scale_advantages = False  # mean-shifted only

    def denominator(self, mask, max_tokens) -> Tensor:
        """What the loss divides its sum by: the masked tokens."""
        return mask.sum()

    def __call__(self, logp, logp_old, advantages, mask, *, kl, beta, max_tokens) -> Tensor:
        if beta:
            raise ValueError("Listing 3 has no KL term: use beta=0, or GRPO for a "
                             "KL-regularised loss")
        return listing3_loss(logp, advantages, mask)


@dataclass(frozen=True)
class GRPO:
    """GRPO (Shao et al. 2024): the clipped ratio, A scaled by the group's std, each sequence's
    tokens averaged."""

    clip: float = 0.2
    scale_advantages = True

    def denominator(self, mask, max_tokens) -> Tensor:
        """What the loss divides its sum of per-sequence means by: the sequences with a token."""
        return (mask.sum(1) > 0).sum()

    def __call__(self, logp, logp_old, advantages, mask, *, kl, beta, max_tokens) -> Tensor:
        return grpo_loss(logp, logp_old, advantages, mask, clip=self.clip, kl=kl, beta=beta)


@dataclass(frozen=True)
class DrGRPO:
    """Dr. GRPO (Liu et al. 2025): no std scaling of A, no per-sequence length average (a constant
    instead)."""

    clip: float = 0.2
    scale_advantages = False

    def denominator(self, mask, max_tokens) -> Tensor:
        """What the loss divides its sum by: rollouts × the generation budget."""
        return mask.new_tensor(mask.shape[0] * max_tokens, dtype=torch.long)

    def __call__(self, logp, logp_old, advantages, mask, *, kl, beta, max_tokens) -> Tensor:
        return dr_grpo_loss(logp, logp_old, advantages, mask, max_tokens=max_tokens, clip=self.clip,
                            kl=kl, beta=beta)


@dataclass(frozen=True)
class DAPO:
    """DAPO (Yu et al. 2025): token-level average over the batch and clip-higher, [1 − ε_low,
    1 + ε_high]."""

    clip_low: float = 0.2
    clip_high: float = 0.28
    scale_advantages = True

    def denominator(self, mask, max_tokens) -> Tensor:
        """What the loss divides its sum by: the masked tokens of the batch."""
        return mask.sum()

    def __call__(self, logp, logp_old, advantages, mask, *, kl, beta, max_tokens) -> Tensor:
        return dapo_loss(logp, logp_old, advantages, mask, clip_low=self.clip_low,
                         clip_high=self.clip_high, kl=kl, beta=beta)


POLICY_LOSSES = (Listing3, GRPO, DrGRPO, DAPO)
