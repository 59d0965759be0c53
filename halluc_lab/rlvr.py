"""RLVR: reinforcement learning from the task's verifier, with group baselines and an optional ``<bksp>``.

Chapter 10. Sources: 001 Part 2 §3 (RLVR, Listing 3: nanochat's simplified GRPO), 000 §7 (exposure bias,
§7.3 detect–backtrack–correct); Shao et al. 2024 (GRPO), Liu et al. 2025 (Dr. GRPO), Yu et al. 2025
(DAPO), Kalai et al. 2025 (rewarding abstention)::

    hist = rlvr(policy, reference, prompts, VerifierReward(task, tok, lam=3.0), RLVRConfig(), GRPO(),
                tok=tok, seed=0)

A round: ``prompts_per_iteration`` prompts, each prefilled once and continued ``samples_per_prompt`` = G
times at temperature 1 by the backspace controller (:mod:`halluc_lab.backtrack`: a sampled ``<bksp>``
takes back the last token, in the ``"keep"`` or ``"erase"`` context, or is masked out). The reward sees
what the answer finally says (after the take-backs) and pays +1 correct, 0 abstained, −λ wrong, minus an
optional cost per ``<bksp>``. Each rollout's advantage is its reward against its group's mean (divided by
the group's standard deviation when the loss asks); every token the rollout sampled — the erased ones and
the ``<bksp>`` included, each in the context it was sampled in — gets it. Then ``minibatches`` optimizer
steps, each on whole groups, minimise the loss the caller passes (:class:`Listing3`, :class:`GRPO`,
:class:`DrGRPO`, :class:`DAPO`: the formulas are :mod:`halluc_lab.losses`'), with an optional k3 KL term to
the reference policy; the KL is measured every round either way.

Under ``torchrun`` (:mod:`halluc_lab.distributed`) each rank rolls out its contiguous share of the round's
prompts on its own GPU, with its own sampling stream; the rollouts and rewards are gathered, so every rank
sees the whole round and the group statistics are the single process's. Each minibatch's whole groups are
shared out again, each rank's loss is weighed by its share of the loss's denominator (``denominator``: the
tokens, or the sequences, it divides by), and DDP's average of the gradients is then the global batch's.

Where the code departs from the documents: Listing 3 never calls ``loss.backward()`` before
``optimizer.step()``, so as printed it trains nothing; :class:`Listing3` is the listing with the backward
pass (and the mean over real tokens, not padding). π_old's log-probs come from a forward pass before the
round's first step (so the first ratio is 1); with one minibatch they are the step's own, detached.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain

import numpy as np
import torch
from torch import nn

from halluc_lab import distributed
from halluc_lab.backtrack import CONTEXTS, rollout, training_rows
from halluc_lab.data import IGNORE, pad, prompt_rounds
from halluc_lab.device import deterministic
from halluc_lab.evaluate import answer_budget, model_device
from halluc_lab.losses import (check_positive, dapo_loss, dr_grpo_loss, grpo_loss, group_advantages, kl_estimates,
                               listing3_loss, token_logprobs)
from halluc_lab.preference import preference_examples
from halluc_lab.progress import progress
from halluc_lab.reward_model import Reward, VerifierReward
from halluc_lab.step import Graphs, autocast, make_optimizer
from halluc_lab.tasks import make_task
from halluc_lab.tasks.base import check_count
from halluc_lab.tokenizer import Tokenizer
from halluc_lab.train import History, TrainConfig

Tensor = torch.Tensor


# -- the losses, as callables: the variant is the object passed -------------------------------------------
@dataclass(frozen=True)
class Listing3:
    """001's Listing 3 with its backward pass: −mean over tokens of log π · A, A = R − mean of the group."""

    scale_advantages = False  # mean-shifted only

    def denominator(self, mask, max_tokens) -> Tensor:
        """What the loss divides its sum by: the masked tokens."""
        return mask.sum()

    def __call__(self, logp, logp_old, advantages, mask, *, kl, beta, max_tokens) -> Tensor:
        if beta:
            raise ValueError("Listing 3 has no KL term: use beta=0, or GRPO for a KL-regularised loss")
        return listing3_loss(logp, advantages, mask)


@dataclass(frozen=True)
class GRPO:
    """GRPO (Shao et al. 2024): the clipped ratio, A scaled by the group's std, each sequence's tokens averaged."""

    clip: float = 0.2
    scale_advantages = True

    def denominator(self, mask, max_tokens) -> Tensor:
        """What the loss divides its sum of per-sequence means by: the sequences with a token."""
        return (mask.sum(1) > 0).sum()

    def __call__(self, logp, logp_old, advantages, mask, *, kl, beta, max_tokens) -> Tensor:
        return grpo_loss(logp, logp_old, advantages, mask, clip=self.clip, kl=kl, beta=beta)


@dataclass(frozen=True)
class DrGRPO:
    """Dr. GRPO (Liu et al. 2025): no std scaling of A, no per-sequence length average (a constant instead)."""

    clip: float = 0.2
    scale_advantages = False

    def denominator(self, mask, max_tokens) -> Tensor:
        """What the loss divides its sum by: rollouts × the generation budget."""
        return mask.new_tensor(mask.shape[0] * max_tokens, dtype=torch.long)

    def __call__(self, logp, logp_old, advantages, mask, *, kl, beta, max_tokens) -> Tensor:
        return dr_grpo_loss(logp, logp_old, advantages, mask, max_tokens=max_tokens, clip=self.clip, kl=kl, beta=beta)


@dataclass(frozen=True)
class DAPO:
    """DAPO (Yu et al. 2025): token-level average over the batch and clip-higher, [1 − ε_low, 1 + ε_high]."""

    clip_low: float = 0.2
    clip_high: float = 0.28
    scale_advantages = True

    def denominator(self, mask, max_tokens) -> Tensor:
        """What the loss divides its sum by: the masked tokens of the batch."""
        return mask.sum()

    def __call__(self, logp, logp_old, advantages, mask, *, kl, beta, max_tokens) -> Tensor:
        return dapo_loss(logp, logp_old, advantages, mask, clip_low=self.clip_low, clip_high=self.clip_high,
                         kl=kl, beta=beta)


POLICY_LOSSES = (Listing3, GRPO, DrGRPO, DAPO)


@dataclass(frozen=True)
class RLVRConfig:
    """One RLVR run: rounds of group rollouts, each followed by ``minibatches`` optimizer steps."""

    iterations: int = 20  # rounds
    prompts_per_iteration: int = 16  # prompts per round (a seeded order, cycling through the prompts)
    samples_per_prompt: int = 8  # G: rollouts per prompt from one prefill; the group baseline needs G >= 2
    max_new_tokens: int = 16  # emitted tokens per rollout, take-backs included
    minibatches: int = 1  # optimizer steps per round, each on an equal share of the round's groups
    lr: float = 1e-5  # AdamW's rate (constant)
    grad_clip: float = 1.0  # global gradient-norm clip
    beta: float = 0.0  # weight of the k3 KL term to the reference in the loss (0: none)
    context: str = "keep"  # what a <bksp> leaves in the context: "keep" or "erase" (halluc_lab.backtrack)
    allow_bksp: bool = True  # False: <bksp> is masked out of rollouts and of the policy's log-probs
    fused_decode: bool = False  # compile the rollouts' decode step (CUDA only; halluc_lab.engine: other low bits)
    captured_update: bool = False  # each optimizer step one CUDA graph (CUDA, keep, one process; other low bits)

    def __post_init__(self):
        for name in ("iterations", "prompts_per_iteration", "max_new_tokens", "minibatches"):
            check_count(name, getattr(self, name), 1)
        if isinstance(self.samples_per_prompt, bool) or not isinstance(self.samples_per_prompt, int) \
                or self.samples_per_prompt < 2:
            raise ValueError(f"samples_per_prompt must be an int >= 2 (a group baseline needs at least 2 samples), "
                             f"got {self.samples_per_prompt!r}")
        for name in ("lr", "grad_clip"):
            check_positive(name, getattr(self, name))
        if isinstance(self.beta, bool) or not isinstance(self.beta, (int, float)) or not (
                math.isfinite(self.beta) and self.beta >= 0):
            raise ValueError(f"beta must be a finite number >= 0, got {self.beta!r}")
        if self.context not in CONTEXTS:
            raise ValueError(f"context must be one of {CONTEXTS}, got {self.context!r}")
        for name in ("allow_bksp", "fused_decode", "captured_update"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.captured_update and self.context != "keep":
            raise ValueError("captured_update needs context='keep' (a rollout is then one training row of fixed "
                             f"width); got context={self.context!r}")
        if self.prompts_per_iteration % self.minibatches:
            raise ValueError(f"prompts_per_iteration={self.prompts_per_iteration} must split into "
                             f"minibatches={self.minibatches} equal shares of whole groups")


@dataclass
class RLVRHistory:
    """Per round, means over its rollouts."""

    reward: list[float] = field(default_factory=list)  # the reward optimised
    abstained: list[float] = field(default_factory=list)  # share whose final text holds <abstain>
    kl: list[float] = field(default_factory=list)  # Σ_t k3 per rollout: KL(π ‖ π_ref) estimated on its tokens
    length: list[float] = field(default_factory=list)  # emitted tokens per rollout, take-backs included
    bksp_rate: list[float] = field(default_factory=list)  # <bksp> per emitted token
    zero_groups: list[float] = field(default_factory=list)  # share of groups whose rewards all tie (no signal)


# -- a round's tensors --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RoundRows:
    """Rollouts as training rows, and where each row's targets go in the rollouts' (N, M) log."""

    input_ids: Tensor  # (R, W) prompt + context + targets, padded
    labels: Tensor  # (R, W) the sampled tokens as targets, IGNORE elsewhere
    slot: Tensor  # (K,) index into the flattened (N, M) log of each target, in the rows' target order
    shape: tuple[int, int]  # (N, M): rollouts, log columns

    def to(self, device) -> "RoundRows":
        return RoundRows(self.input_ids.to(device), self.labels.to(device), self.slot.to(device), self.shape)


def round_rows(prompts: Sequence[Sequence[int]], logs: Sequence[Sequence[int]], sampled: Sequence[Sequence[bool]],
               width: int, *, bksp_id: int, context: str, pad_id: int) -> RoundRows:
    """Every sampled token of every rollout as a target in the context it was sampled in
    (:func:`~halluc_lab.backtrack.training_rows`), and each target's place in a log ``width`` columns wide.

    In the keep context a rollout's one row is its prompt and its whole log; those rows are laid out for the
    whole round at once (the rows ``training_rows`` and ``pad`` give, without a Python step per token).
    """
    if len(prompts) != len(logs) or len(sampled) != len(logs):
        raise ValueError(f"prompts, logs and sampled must be as long, got {len(prompts)}, {len(logs)}, {len(sampled)}")
    if not logs:
        raise ValueError("a round needs at least one rollout")
    if max(map(len, logs)) > width:
        raise ValueError(f"a log of {max(map(len, logs))} tokens does not fit in width={width} columns")
    if context == "keep":
        return _keep_rows(prompts, logs, sampled, width, pad_id)
    seqs, slots = [], []
    for i, (prompt, toks, flags) in enumerate(zip(prompts, logs, sampled)):
        seqs += training_rows(prompt, toks, flags, bksp_id, context)
        slots += [i * width + j for j, s in enumerate(flags) if s]  # training_rows keeps the log's order
    batch = pad(seqs, pad_id)
    return RoundRows(batch.input_ids, batch.labels, torch.tensor(slots, dtype=torch.long), (len(logs), width))


def _ragged(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row and column of each element of rows ``lengths`` long, laid end to end."""
    row = np.repeat(np.arange(len(lengths)), lengths)
    return row, np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)


def _keep_rows(prompts, logs, sampled, width: int, pad_id: int) -> RoundRows:
    """:func:`round_rows` in the keep context (its arguments checked there): row i is ``prompts[i] + logs[i]``,
    right-padded, its targets the sampled log tokens."""
    n_prompt, n_log = (np.fromiter(map(len, x), dtype=np.int64, count=len(x)) for x in (prompts, logs))
    if not n_prompt.all():
        raise ValueError("every rollout needs a prompt of at least one token (<bos>)")
    if any(len(t) != len(s) for t, s in zip(logs, sampled)):
        raise ValueError("each rollout's tokens and sampled flags must have one length")
    R, W = len(logs), int((n_prompt + n_log).max())
    ids = np.full((R, W), pad_id, dtype=np.int64)
    labels = np.full((R, W), IGNORE, dtype=np.int64)
    row, col = _ragged(n_prompt + n_log)
    ids[row, col] = np.fromiter(chain.from_iterable(chain(p, t) for p, t in zip(prompts, logs)), dtype=np.int64,
                                count=len(row))
    row, col = _ragged(n_log)  # the logs' tokens: targets where sampled
    flags = np.fromiter(chain.from_iterable(sampled), dtype=bool, count=len(row))
    tokens = np.fromiter(chain.from_iterable(logs), dtype=np.int64, count=len(row))
    labels[row[flags], n_prompt[row[flags]] + col[flags]] = tokens[flags]
    return RoundRows(torch.from_numpy(ids), torch.from_numpy(labels), torch.from_numpy(row[flags] * width + col[flags]),
                     (R, width))


def log_logprobs(model: nn.Module, rows: RoundRows, banned: Sequence[int] = ()) -> Tensor:
    """``(N, M)`` log π of each rollout's sampled tokens, in log order (0 elsewhere); ``banned`` tokens' logits
    are masked first (the policy that never emits them)."""
    logits = model(rows.input_ids)  # (R, W, V)
    if banned:
        logits = logits.index_fill(-1, torch.tensor(list(banned), device=logits.device), float("-inf"))
    lp = token_logprobs(logits, rows.labels).float()  # (R, W-1)
    flat = torch.zeros(rows.shape[0] * rows.shape[1], device=lp.device)
    return flat.index_put((rows.slot,), lp[rows.labels[:, 1:] != IGNORE]).view(rows.shape)


def rlvr(policy: nn.Module, reference: nn.Module, prompts: Sequence[Sequence[int]], reward: Reward, cfg: RLVRConfig,
         loss=GRPO(), *, tok: Tokenizer, seed: int, autocast_dtype: torch.dtype | None = None,
         desc: str = "rlvr") -> RLVRHistory:
    """Train ``policy`` in place to maximise the verifier's reward (module docstring); its history.

    ``reference``: a frozen copy of the starting policy (the KL's π_ref); ``prompts``: token ids, ``<bos>``
    first; ``reward``: ``(prompts, completions, **kw) -> list[float]`` on token ids, the completion being the
    rollout's whole log (the verifier applies the take-backs); ``loss``: one of :data:`POLICY_LOSSES`;
    ``tok``: the ids of ``<bksp>``, ``<abstain>``, ``<eos>`` and ``<pad>``. Sampling and minibatch order
    follow ``seed``.
    """
    if reference is policy:
        raise ValueError("reference must be a model of its own: a frozen copy of the starting policy")
    if not isinstance(loss, POLICY_LOSSES):
        raise TypeError(f"loss must be one of {[c.__name__ for c in POLICY_LOSSES]}, got {type(loss).__name__}")
    if not prompts:
        raise ValueError("prompts must hold at least one prompt")
    device, G, M = model_device(policy), cfg.samples_per_prompt, cfg.max_new_tokens
    ranks = distributed.world_size()
    if cfg.prompts_per_iteration // cfg.minibatches < ranks:
        raise ValueError(f"a minibatch of {cfg.prompts_per_iteration // cfg.minibatches} groups cannot give each of "
                         f"{ranks} processes a group: raise prompts_per_iteration or lower minibatches")
    order_g = torch.Generator().manual_seed(seed)  # the same on every rank: prompts and minibatches
    sample_g = torch.Generator(device=device).manual_seed(seed + _RANK_SEED_STRIDE * distributed.rank())
    if cfg.captured_update and (device.type != "cuda" or ranks > 1):
        raise ValueError(f"captured_update replays a CUDA graph in one process: the policy is on {device} and "
                         f"{ranks} processes run")
    optimizer = make_optimizer(policy, TrainConfig(lr=cfg.lr, betas=(0.9, 0.999), weight_decay=0.0),
                               capturable=cfg.captured_update)
    banned = () if cfg.allow_bksp else (tok.bksp_id,)
    captured = _CapturedUpdate(policy, reference, optimizer, loss, cfg, max(map(len, prompts)), banned,
                               autocast_dtype) if cfg.captured_update else None
    was_training = policy.training
    reference.eval()
    trainable = distributed.wrap(policy)  # itself in one process
    next_prompts, hist = prompt_rounds(len(prompts), cfg.prompts_per_iteration, order_g), RLVRHistory()
    for _ in progress(range(cfg.iterations), desc=desc):
        todo = next(next_prompts)
        repeated = [list(prompts[i]) for i in todo for _ in range(G)]
        policy.eval()
        mine = todo[distributed.shard(len(todo))]  # this rank rolls out its share of the round's prompts
        samples = _gather(_sample(policy, [prompts[i] for i in mine], reward, cfg, tok, sample_g, autocast_dtype))
        rewards = torch.tensor(samples.rewards)
        advantages = group_advantages(rewards, G, scale=loss.scale_advantages).to(device)
        mask = _pad_flags(samples.sampled, M).to(device)  # (N, M)
        parts = [groups[distributed.shard(len(groups))]  # this rank's whole groups of each minibatch
                 for groups in torch.randperm(cfg.prompts_per_iteration, generator=order_g).chunk(cfg.minibatches)]
        parts = [(groups[:, None] * G + torch.arange(G)).flatten() for groups in parts]
        if captured is not None:
            kl_sum = captured.round([[repeated[i] for i in part] for part in parts], samples, parts, advantages, mask,
                                    tok)
            _record(hist, rewards, samples, float(kl_sum) / len(samples.logs), tok, G)
            continue
        rows = [round_rows([repeated[i] for i in part], [samples.logs[i] for i in part],
                           [samples.sampled[i] for i in part], M, bksp_id=tok.bksp_id, context=cfg.context,
                           pad_id=tok.pad_id).to(device) for part in parts]
        with torch.no_grad(), autocast(device, autocast_dtype):  # before any step: π_ref, and π_old if it differs
            ref = [log_logprobs(reference, r, banned) for r in rows]
            old = [log_logprobs(policy, r, banned) for r in rows] if cfg.minibatches > 1 else None
        policy.train()
        kl_sum = torch.zeros((), device=device)
        for k, (part, r) in enumerate(zip(parts, rows)):
            part = part.to(device)
            m = mask[part]
            with autocast(device, autocast_dtype):
                logp = log_logprobs(trainable, r, banned)
            kl = kl_estimates(logp, ref[k], m).k3  # measured every round; in the loss (with its gradient) if β > 0
            value = loss(logp, logp.detach() if old is None else old[k], advantages[part], m,
                         kl=kl if cfg.beta else None, beta=cfg.beta, max_tokens=M)
            if ranks > 1:  # DDP averages the ranks' gradients: weigh each rank's loss by its share of the global
                den = loss.denominator(m, M).float()  # denominator, so that the average is the global batch's loss
                value = value * (ranks * den.clamp_min(1) / distributed.all_sum(den).clamp_min(1))
            optimizer.zero_grad(set_to_none=True)
            value.backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.grad_clip)
            optimizer.step()
            kl_sum += kl.detach().sum()
        _record(hist, rewards, samples, float(distributed.all_sum(kl_sum)) / len(samples.logs), tok, G)
    policy.train(was_training)
    return hist


class _CapturedUpdate:
    """RLVR's optimizer step as one CUDA graph (``RLVRConfig.captured_update``), as PPO's update is
    (:mod:`halluc_lab.rlhf`): the policy's forward pass, the loss, the backward pass, clipping and AdamW,
    replayed once per minibatch on rows copied into fixed buffers; the reference's forward pass (and π_old's)
    is a second graph.

    In the keep context a rollout is one training row, its prompt then its whole log; here every row is padded
    to one width, the longest prompt plus the generation budget, so the shapes never change, and log token j
    of rollout i is read from the row's log-prob at column ``len(prompt_i) − 1 + j`` (a gather, where the eager
    path scatters by slot; the same values for the same logits). The optimizer is capturable (its rate and
    step counts on the device). The numbers differ from the eager path's in their low bits: other matrix
    shapes, and AdamW's step computed on the device.
    """

    def __init__(self, policy: nn.Module, reference: nn.Module, optimizer, loss, cfg: RLVRConfig, longest_prompt: int,
                 banned: Sequence[int], dtype: torch.dtype | None):
        self.policy, self.reference, self.optimizer, self.loss, self.cfg, self.dtype = (
            policy, reference, optimizer, loss, cfg, dtype)
        self.device = model_device(policy)
        n, M = cfg.prompts_per_iteration * cfg.samples_per_prompt // cfg.minibatches, cfg.max_new_tokens
        self.width = longest_prompt + M
        z = lambda *shape, dt=torch.long: torch.zeros(*shape, dtype=dt, device=self.device)  # noqa: E731
        self.buf = {"ids": z(n, self.width), "labels": z(n, self.width), "index": z(n, M),
                    "mask": z(n, M, dt=torch.bool), "adv": z(n, dt=torch.float32), "ref": z(n, M, dt=torch.float32),
                    "old": z(n, M, dt=torch.float32)}
        self.banned = torch.tensor(list(banned), dtype=torch.long, device=self.device) if banned else None
        self.graphs = Graphs()  # "score" and "update"

    def rows(self, prompts: list, logs: list, sampled: list, tok: Tokenizer) -> dict:
        """The ids, labels and gather index of a minibatch's rollouts, on the device, at the fixed width."""
        r = round_rows(prompts, logs, sampled, self.cfg.max_new_tokens, bksp_id=tok.bksp_id, context="keep",
                       pad_id=tok.pad_id)
        extra = (0, self.width - r.input_ids.shape[1])
        index = torch.tensor([len(p) - 1 for p in prompts])[:, None] + torch.arange(self.cfg.max_new_tokens)
        return {"ids": torch.nn.functional.pad(r.input_ids, extra, value=tok.pad_id).to(self.device),
                "labels": torch.nn.functional.pad(r.labels, extra, value=IGNORE).to(self.device),
                "index": index.to(self.device)}

    def logprobs(self, model: nn.Module, rows: dict) -> Tensor:
        """``(n, M)`` log π of each rollout's log tokens (0 where not sampled or past the log)."""
        logits = model(rows["ids"])  # (n, W, V)
        if self.banned is not None:
            logits = logits.index_fill(-1, self.banned, float("-inf"))
        return token_logprobs(logits, rows["labels"]).float().gather(1, rows["index"])

    @torch.no_grad()
    def _score_body(self) -> tuple[Tensor, Tensor]:
        """π_ref's log-probs of the rows in the buffers, and π_old's (the policy's, needed before any step when a
        round takes several)."""
        with autocast(self.device, self.dtype):
            ref = self.logprobs(self.reference, self.buf)
            return ref, self.logprobs(self.policy, self.buf) if self.cfg.minibatches > 1 else ref

    def _update_body(self) -> Tensor:
        b, cfg = self.buf, self.cfg
        with autocast(self.device, self.dtype):
            logp = self.logprobs(self.policy, b)
        kl = kl_estimates(logp, b["ref"], b["mask"]).k3
        old = logp.detach() if cfg.minibatches == 1 else b["old"]
        value = self.loss(logp, old, b["adv"], b["mask"], kl=kl if cfg.beta else None, beta=cfg.beta,
                          max_tokens=cfg.max_new_tokens)
        value.backward()
        torch.nn.utils.clip_grad_norm_(self.policy.parameters(), cfg.grad_clip)
        self.optimizer.step()
        return kl.detach().sum()

    def round(self, prompts: list[list], samples: RoundSamples, parts: list[Tensor], advantages: Tensor, mask: Tensor,
              tok: Tokenizer) -> Tensor:
        """One round's updates, a minibatch ``parts[k]`` (rollout indices; ``prompts[k]`` their prompts) at a time;
        the sum of the k3 KL estimates over the round's tokens, on the device."""
        rows = [self.rows(p, [samples.logs[i] for i in part], [samples.sampled[i] for i in part], tok)
                for p, part in zip(prompts, parts)]
        scored = []
        for r in rows:  # before any step: π_ref, and π_old if it differs
            self._load(r)
            scored.append([x.clone() for x in self.graphs.run("score", self._score_body)])
        self.policy.train()
        kl_sum = torch.zeros((), device=self.device)
        for part, r, (ref, old) in zip(parts, rows, scored):
            part = part.to(self.device)
            self._load({**r, "mask": mask[part], "adv": advantages[part], "ref": ref, "old": old})
            kl_sum += self.graphs.run("update", self._update_body, [self.optimizer])
        return kl_sum

    def _load(self, values: dict) -> None:
        for name, value in values.items():
            self.buf[name].copy_(value)


_RANK_SEED_STRIDE = 1_000_003  # rank r samples with seed + r·stride; rank 0's stream is the single process's


@dataclass(frozen=True)
class RoundSamples:
    """A round's rollouts as lists, prompt-major (G per prompt): one rank's share, or all ranks' gathered."""

    logs: list[list[int]]  # every emitted token, take-backs included
    sampled: list[list[bool]]  # whether each logged token was sampled (not forced)
    texts: list[list[int]]  # what each rollout finally says
    rewards: list[float]  # the reward of each

    @classmethod
    def concat(cls, parts: Sequence[RoundSamples]) -> RoundSamples:
        """The rollouts of ``parts`` laid end to end, in order."""
        return cls(*([x for p in parts for x in getattr(p, f.name)] for f in dataclasses.fields(cls)))


def _sample(policy: nn.Module, prompts: list, reward: Reward, cfg: RLVRConfig, tok: Tokenizer,
            generator: torch.Generator, dtype: torch.dtype | None) -> RoundSamples:
    """G rollouts of each prompt from one prefill, and their rewards."""
    G = cfg.samples_per_prompt
    out = rollout(policy, prompts, cfg.max_new_tokens, bksp_id=tok.bksp_id, context=cfg.context,
                  allow_bksp=cfg.allow_bksp, stop_tokens=(tok.eos_id,), generator=generator, dtype=dtype, n_samples=G,
                  fused=cfg.fused_decode)
    logs = out.token_lists()
    scores = [float(r) for r in reward([list(p) for p in prompts for _ in range(G)], logs)]
    if len(scores) != len(logs) or not all(math.isfinite(r) for r in scores):
        raise ValueError(f"reward must return one finite number per completion ({len(logs)}), got {scores[:8]}")
    return RoundSamples(logs, out.sampled_lists(), out.text_lists(), scores)


def _gather(samples: RoundSamples) -> RoundSamples:
    """Every rank's rollouts, in rank order (the round's prompt order): the group statistics see them all."""
    parts = distributed.gather_objects(samples)
    return samples if len(parts) == 1 else RoundSamples.concat(parts)


def _pad_flags(flags: list[list[bool]], width: int) -> Tensor:
    """``(N, width)`` bool: each row's flags, then False."""
    out = np.zeros((len(flags), width), dtype=bool)
    row, col = _ragged(np.fromiter(map(len, flags), dtype=np.int64, count=len(flags)))
    out[row, col] = np.fromiter(chain.from_iterable(flags), dtype=bool, count=len(row))
    return torch.from_numpy(out)


def _record(hist: RLVRHistory, rewards: Tensor, samples: RoundSamples, kl: float, tok: Tokenizer, G: int) -> None:
    """Append a round's means to ``hist``."""
    texts, emitted = samples.texts, sum(len(log) for log in samples.logs)
    tied = (rewards.view(-1, G) == rewards.view(-1, G)[:, :1]).all(1)
    for name, v in (("reward", rewards.mean().item()), ("abstained", sum(tok.abstain_id in t for t in texts) / len(texts)),
                    ("kl", kl), ("length", emitted / len(texts)),
                    ("bksp_rate", sum(log.count(tok.bksp_id) for log in samples.logs) / max(emitted, 1)),
                    ("zero_groups", tied.float().mean().item())):
        getattr(hist, name).append(v)


# -- the recipe stage ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RLVRTraining:
    """RLVR from the starting model on ``n_prompts`` prompts of :func:`~halluc_lab.preference.preference_examples`
    (the recipe's seed; chapter 9's methods learn from the same), rewarded by the task's verifier: +1 correct,
    0 abstained, −``lam`` wrong, −``bksp_cost`` per ``<bksp>``.

    The registry's stage is ``@dataclass(frozen=True) class RLVR(RLVRTraining, Stage)``. Of ``config``, the
    recipe's ``train.steps`` replaces ``iterations``, ``train.lr`` replaces ``lr`` and the prompts' answer budget
    ``max_new_tokens``. The history has one entry per round (loss: −mean reward) and the :class:`RLVRHistory`
    series under ``metrics``. A killed run starts over.
    """

    n_prompts: int  # prompts drawn by preference_examples (with the recipe's seed)
    config: RLVRConfig = RLVRConfig()  # rollouts per round, G, minibatches, β, context, allow_bksp
    policy_loss: Listing3 | GRPO | DrGRPO | DAPO = GRPO()  # the loss (not ``loss``: a Stage's method of that name)
    lam: float = 1.0  # λ: a wrong answer pays −λ, so answering pays when P(correct) > λ/(1 + λ)
    bksp_cost: float = 0.0  # reward subtracted per <bksp>

    def __post_init__(self):
        check_count("n_prompts", self.n_prompts, 1)
        if not isinstance(self.config, RLVRConfig):
            raise TypeError(f"config must be an RLVRConfig, got {type(self.config).__name__}")
        if not isinstance(self.policy_loss, POLICY_LOSSES):
            raise TypeError(f"policy_loss must be one of {[c.__name__ for c in POLICY_LOSSES]}, "
                            f"got {type(self.policy_loss).__name__}")
        for name in ("lam", "bksp_cost"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")

    def rows(self, recipe):
        raise ValueError(f"{type(self).__name__} samples its rollouts from the policy as it trains: it has no rows")

    def fit(self, recipe, model: nn.Module, device: torch.device, dtype: torch.dtype | None, checkpoints: str) -> History:
        """Train ``model`` (the parent's weights) in place; its history."""
        task = make_task(recipe.task)
        tok = task.tokenizer()
        examples = preference_examples(task, self.n_prompts, seed=recipe.seed)
        cfg = dataclasses.replace(self.config, iterations=recipe.train.steps, lr=recipe.train.lr,
                                  max_new_tokens=answer_budget(examples))
        with deterministic():
            reference = copy.deepcopy(model).eval().requires_grad_(False)  # π_ref: the starting model, frozen
            h = rlvr(model, reference, [(tok.bos_id, *tok.encode(e.prompt)) for e in examples],
                     VerifierReward(task, tok, self.lam, self.bksp_cost), cfg, self.policy_loss, tok=tok, seed=recipe.seed,
                     autocast_dtype=dtype, desc=recipe.name)
        return History(step=list(range(1, cfg.iterations + 1)), loss=[-r for r in h.reward], lr=[cfg.lr] * cfg.iterations,
                       metrics=dataclasses.asdict(h))
