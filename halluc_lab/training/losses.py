"""Losses as pure functions of logits or log-probs, labels and masks.

Every training stage of the book calls into this module: next-token cross-entropy for
pre-training and SFT (chapters 7–8), per-token and per-sequence log-probs, and the preference and
policy-gradient losses of chapters 9–10: Bradley–Terry, DPO, PPO's clipped surrogate, the KL
estimators and GAE. RLVR's policy gradients with group baselines (REINFORCE as in 001's Listing 3,
GRPO, Dr. GRPO, DAPO) are built on the clipped surrogate in :mod:`halluc_lab.training.rlvr_losses`.
Nothing here knows about models, tasks or tokenizers; the training loop
(:mod:`halluc_lab.training.train`) turns a model and a batch into logits and calls these. Sources:
000 §5.2–5.5 (the SFT loss, cross-entropy, the -100 label), 001 Part 1 eq. (9) and Part 2 §1 (the
KL-regularised objective, DPO), 004 §3.7 (label smoothing) and §9.1.2–9.2 (Bradley–Terry, eq.
9.1); Rafailov et al. 2023 (DPO, eq. 7), Schulman et al. 2017 (PPO, eq. 7), Schulman et al. 2016
(GAE), Schulman 2020, "Approximating KL divergence" (k1, k2, k3).

Conventions: ``labels`` has the shape of the inputs and ``labels[t]`` is the target of the
logits at ``t - 1`` (Hugging Face's convention; the shift happens here). :data:`IGNORE` marks a
position with no loss.

Departures: a mean over zero target tokens is undefined (PyTorch returns NaN); here it is an
error, so a batch with no targets is noticed instead of silently training on nothing. The
preference and policy-gradient losses check shapes and their scalar settings (β, ε, γ, λ) but not
the values inside their tensors: such a check would make the host wait for the device at every
step, and break a step captured as a CUDA graph. Labels are the exception: an id outside [0, V)
would be a raw IndexError (a device-side assert on a GPU) or, below 0, silently read as id 0, so
the functions that take labels check them by value on the CPU. On a GPU they do not: the check
would make the host wait for the device at every eager call (RLVR's and PPO's rounds make many),
and a captured or compiled step cannot hold it. There the rows were checked where they were built
(:mod:`halluc_lab.training.data` refuses ids that are not integers), and an id of V or more still
stops the step with PyTorch's device-side assert.
"""

from __future__ import annotations

import math
from numbers import Real
from typing import NamedTuple

import torch
import torch.nn.functional as F

IGNORE = -100  # the ignore_index of F.cross_entropy (000 §5.4)
REDUCTIONS = ("mean", "sum", "none")


def _check_pair(logits: torch.Tensor, labels: torch.Tensor) -> None:
    if not (isinstance(logits, torch.Tensor) and logits.is_floating_point()
            and isinstance(labels, torch.Tensor)):
        kind = lambda t: f"{t.dtype} tensor" if isinstance(t, torch.Tensor) else type(t).__name__
        raise TypeError(f"logits must be a float tensor and labels a tensor, got {kind(logits)} "
                        f"and {kind(labels)}")
    if logits.dim() != 3 or labels.shape != logits.shape[:2]:
        raise ValueError(f"logits must be (B, T, V) and labels (B, T); got {tuple(logits.shape)} "
                         f"and {tuple(labels.shape)}")
    if labels.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"labels must hold integer ids, got dtype {labels.dtype}")
    if labels.device.type != "cpu" or torch.compiler.is_compiling():
        return  # on a GPU a value check is a host sync: RL's eager rounds would wait at every call
    bad = (labels >= logits.shape[-1]) | ((labels < 0) & (labels != IGNORE))  # (B, T)
    if bool(bad.any()):
        raise ValueError(f"labels must be token ids in [0, {logits.shape[-1]}) (the logits' V) "
                         f"or IGNORE ({IGNORE}), got {labels[bad][0].item()}")


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
    smoothing = label_smoothing
    if isinstance(smoothing, bool) or not (isinstance(smoothing, Real) and 0 <= smoothing < 1):
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing!r}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    z, y = _shifted(logits, labels)
    if reduction == "mean" and not bool((y != IGNORE).any()):
        raise ValueError("every label is IGNORE: "
                         "the mean loss over zero target tokens is undefined")
    per_token = F.cross_entropy(z.flatten(0, 1), y.flatten(), ignore_index=IGNORE,
                                # (B, T-1)
                                label_smoothing=label_smoothing, reduction="none").view_as(y)
    if reduction == "none":
        return per_token
    total = per_token.sum()
    return total if reduction == "sum" else total / (y != IGNORE).sum()


def label_smoothed_nll(logits: torch.Tensor, targets: torch.Tensor, epsilon: float) -> torch.Tensor:
    """Reference: the mean of -Σ_k q'(k) log p(k) with q' = (1 - ε)δ_{k,y} + ε/K (004 §3.7).

    logits (N, K), targets (N,) with no IGNORE; the readable version :func:`causal_lm_loss` agrees
    with.
    """
    logp = torch.log_softmax(logits, dim=-1)  # (N, K)
    k = logits.shape[-1]
    q = torch.full_like(logp, epsilon / k)  # (N, K) the uniform part ε u(k), u = 1/K
    # + (1 - ε) δ_{k,y}
    q.scatter_add_(1, targets[:, None], torch.full_like(logp[:, :1], 1.0 - epsilon))
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
            raise ValueError(f"mask must be a bool tensor of shape {tuple(lp.shape)} "
                             "(aligned with the "
                             f"shifted labels), got {mask.dtype} {tuple(mask.shape)}")
        lp = lp * mask
    return lp.sum(-1)


# -- preferences: Bradley–Terry and DPO (chapter 9) ------------------------------------------------
def _check_same_shape(**tensors: torch.Tensor) -> None:
    """ValueError unless every argument is a non-empty tensor of one shape."""
    shapes = {name: tuple(t.shape) for name, t in tensors.items() if isinstance(t, torch.Tensor)}
    if len(shapes) != len(tensors):
        bad = [name for name, t in tensors.items() if not isinstance(t, torch.Tensor)]
        raise TypeError(f"{', '.join(bad)} must be torch.Tensors")
    if len(set(shapes.values())) != 1:
        raise ValueError(f"{', '.join(shapes)} must have one shape, got {shapes}")
    if next(iter(tensors.values())).numel() == 0:
        raise ValueError(f"{', '.join(shapes)} are empty: there is nothing to compute a loss of")


def check_positive(name: str, value: float, upper: float = math.inf) -> None:
    """ValueError unless ``value`` is a finite real number in (0, upper] (a β, a clip ε, a learning
    rate)."""
    if isinstance(value, bool) or not isinstance(value, Real) or not (0 < value <= upper
                                                                      and math.isfinite(value)):
        raise ValueError(f"{name} must be a finite number in (0, {upper}], got {value!r}")


def _reduce(per_item: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    return (per_item if reduction == "none" else per_item.sum() if reduction == "sum"
            else per_item.mean())


def bradley_terry_loss(r_chosen: torch.Tensor, r_rejected: torch.Tensor, *,
                       reduction: str = "mean") -> torch.Tensor:
    """−log σ(r⁺ − r⁻): the negative log-likelihood of "chosen ≻ rejected" under Bradley–Terry.

    004 §9.1.2: P(y₁ ≻ y₂ | x) = σ(r(x, y₁) − r(x, y₂)), which is p₁/(p₁ + p₂) for scores r = log p.
    ``r_chosen`` and ``r_rejected``: the reward model's scores, one shape (any, non-empty);
    ``reduction``: "mean", "sum" or "none" (per pair, that shape).

    >>> round(float(bradley_terry_loss(torch.tensor([2.0]), torch.tensor([2.0]))), 4)   # log 2
    0.6931
    """
    _check_same_shape(r_chosen=r_chosen, r_rejected=r_rejected)
    return _reduce(-F.logsigmoid(r_chosen - r_rejected), reduction)  # softplus(r⁻ − r⁺), stable


class DPOTerms(NamedTuple):
    """What :func:`dpo_loss` returns."""

    loss: torch.Tensor  # reduced as asked
    # β (log π(y⁺|x) − log π_ref(y⁺|x)): DPO's implicit reward, detached
    chosen_rewards: torch.Tensor
    rejected_rewards: torch.Tensor  # β (log π(y⁻|x) − log π_ref(y⁻|x)), detached


def dpo_loss(policy_chosen_logps: torch.Tensor, policy_rejected_logps: torch.Tensor,
             ref_chosen_logps: torch.Tensor, ref_rejected_logps: torch.Tensor, beta: float, *,
             label_smoothing: float = 0.0, reduction: str = "mean") -> DPOTerms:
    """Sigmoid DPO (Rafailov et al. 2023, eq. 7; 004 eq. 9.1; 001 Part 2 §1):
    −log σ(β [(log π(y⁺|x) − log π_ref(y⁺|x)) − (log π(y⁻|x) − log π_ref(y⁻|x))]).

    The four log-probs are sequence log-probs (sums over each completion's tokens), one shape
    (any, non-empty), e.g. ``(P,)`` for P pairs. ``beta`` > 0: the KL weight β of the objective the
    loss comes from. ``label_smoothing`` ε in [0, 0.5): conservative DPO (Mitchell 2023), the loss
    under labels that are flipped with probability ε: −(1 − ε) log σ(z) − ε log σ(−z).
    Returns :class:`DPOTerms`: the loss and the implicit rewards β (log π − log π_ref) of each side.

    >>> t = dpo_loss(torch.tensor([-1.0]), torch.tensor([-2.0]), torch.tensor([-1.0]),
    ...              torch.tensor([-2.0]), 0.5)
    >>> round(float(t.loss), 4)      # the policy is still the reference: log 2
    0.6931
    """
    _check_same_shape(policy_chosen_logps=policy_chosen_logps,
                      policy_rejected_logps=policy_rejected_logps,
                      ref_chosen_logps=ref_chosen_logps, ref_rejected_logps=ref_rejected_logps)
    check_positive("beta", beta)
    if (isinstance(label_smoothing, bool) or not isinstance(label_smoothing, Real)
            or not 0 <= label_smoothing < 0.5):
        raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing!r}")
    # implicit reward of y⁺ (its C(x) cancels, 001 Remark)
    chosen = beta * (policy_chosen_logps - ref_chosen_logps)
    rejected = beta * (policy_rejected_logps - ref_rejected_logps)
    z = chosen - rejected
    per_pair = -(1 - label_smoothing) * F.logsigmoid(z) - label_smoothing * F.logsigmoid(-z)
    return DPOTerms(_reduce(per_pair, reduction), chosen.detach(), rejected.detach())


# -- policy gradients: PPO's surrogate, KL estimators, GAE (chapters 9–10) -------------------------
def _check_mask(mask: torch.Tensor, like: torch.Tensor) -> None:
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.shape != like.shape:
        got = (f"{mask.dtype} {tuple(mask.shape)}" if isinstance(mask, torch.Tensor)
               else type(mask).__name__)
        raise ValueError(f"mask must be a bool tensor of shape {tuple(like.shape)}, got {got}")


def ppo_clipped_objective(logp_new: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor,
                          mask: torch.Tensor, clip: float, *,
                          clip_high: float | None = None) -> torch.Tensor:
    """PPO's clipped surrogate per token (Schulman et al. 2017, eq. 7), to be *maximised*:
    min(ρ A, clip(ρ, 1 − ε, 1 + ε) A) with ρ = π_new(a|s)/π_old(a|s) = exp(logp_new − logp_old).

    All four tensors ``(B, T)`` (``mask`` bool: the tokens the policy chose); ``clip`` ε > 0;
    ``clip_high`` > 0, if given, replaces the upper ε: the ratio is clipped to [1 − ε, 1 + ε_high]
    (DAPO's clip-higher, Yu et al. 2025). Returns ``(B, T)``, 0 where ``mask`` is False. Where the
    ratio has left the interval in the direction the advantage pushes it, the term is constant and
    gives no gradient.

    >>> ppo_clipped_objective(torch.tensor([[0.0, 1.0]]), torch.zeros(1, 2), torch.ones(1, 2),
    ...                       torch.tensor([[True, True]]), clip=0.2)
    tensor([[1.0000, 1.2000]])
    """
    _check_same_shape(logp_new=logp_new, logp_old=logp_old, advantages=advantages)
    _check_mask(mask, logp_new)
    check_positive("clip", clip)
    high = clip if clip_high is None else clip_high
    check_positive("clip_high", high)
    # (B, T); 1 off the mask: no inf, no NaN gradient
    ratio = torch.exp(torch.where(mask, logp_new - logp_old, 0.0))
    objective = torch.minimum(ratio * advantages, ratio.clamp(1 - clip, 1 + high) * advantages)
    # where, not ×: off-mask A may be inf or NaN
    return torch.where(mask, objective, torch.zeros_like(objective))


class KLEstimates(NamedTuple):
    """Per-token estimators of KL(π ‖ π_ref) from tokens sampled from π (Schulman 2020); each
    ``(B, T)``."""

    k1: torch.Tensor  # log π − log π_ref: unbiased, high variance, can be negative
    k2: torch.Tensor  # ½ (log π_ref − log π)²: biased (exact to second order), low variance, ≥ 0
    k3: torch.Tensor  # r − 1 − log r, r = π_ref/π: unbiased, low variance, ≥ 0


def kl_estimates(logp: torch.Tensor, logp_ref: torch.Tensor, mask: torch.Tensor) -> KLEstimates:
    """k1, k2 and k3 of Schulman's "Approximating KL divergence" at every token, 0 where ``mask`` is
    False.

    ``logp``: log π(x_t | ·) of tokens sampled from π; ``logp_ref``: log π_ref of the same tokens;
    ``mask``: bool, all ``(B, T)``. Averaged over samples from π, k1 and k3 tend to KL(π ‖ π_ref)
    (E[r] = 1 makes E[r − 1] vanish), k2 only approximately.

    >>> kl_estimates(torch.tensor([[-1.0]]), torch.tensor([[-1.0]]), torch.tensor([[True]])).k3
    tensor([[0.]])
    """
    _check_same_shape(logp=logp, logp_ref=logp_ref)
    _check_mask(mask, logp)
    log_r = logp_ref - logp  # (B, T) log(π_ref/π)
    zero = torch.zeros_like(log_r)
    keep = lambda x: torch.where(mask, x, zero)
    return KLEstimates(keep(-log_r), keep(0.5 * log_r ** 2), keep(torch.expm1(log_r) - log_r))


def gae_advantages(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                   gamma: float = 1.0, lam: float = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimates (Schulman et al. 2016) and the returns the value model is fit
    to.

    ``rewards``, ``values``: ``(B, T)`` per token (r_t, V(s_t)); ``mask``: bool ``(B, T)``, True on
    the tokens of each row's episode, which must be contiguous (a completion, then padding).
    δ_t = r_t + γ V(s_{t+1}) − V(s_t) with V = 0 after the episode's last token; A_t = δ_t + γλ
    A_{t+1}. Returns ``(advantages, returns = advantages + values)``, both ``(B, T)`` and 0 off the
    mask. λ = 1 gives the Monte-Carlo return minus the value (unbiased, high variance); λ = 0 the
    one-step δ_t.

    >>> adv, ret = gae_advantages(torch.tensor([[0.0, 1.0]]), torch.zeros(1, 2),
    ...                           torch.tensor([[True, True]]))
    >>> [round(a, 4) for a in adv[0].tolist()]     # A_1 = r_1 = 1, A_0 = γλ A_1
    [0.95, 1.0]
    """
    _check_same_shape(rewards=rewards, values=values)
    _check_mask(mask, rewards)
    if rewards.dim() != 2:
        raise ValueError(f"rewards and values must be (B, T), got {tuple(rewards.shape)}")
    check_positive("gamma", gamma, upper=1.0)
    if isinstance(lam, bool) or not isinstance(lam, Real) or not 0 <= lam <= 1:
        raise ValueError(f"lam must be in [0, 1], got {lam!r}")
    m = mask.to(values.dtype)  # (B, T)
    values = values * m
    advantages = torch.zeros_like(values)
    running = torch.zeros_like(values[:, 0])  # (B,) A_{t+1}
    for t in reversed(range(values.shape[1])):
        # (B,) s_{t+1} in the episode
        next_in = m[:, t + 1] if t + 1 < values.shape[1] else torch.zeros_like(running)
        next_value = values[:, t + 1] if t + 1 < values.shape[1] else torch.zeros_like(running)
        delta = rewards[:, t] + gamma * next_value * next_in - values[:, t]
        running = (delta + gamma * lam * next_in * running) * m[:, t]
        advantages[:, t] = running
    return advantages, (advantages + values) * m
