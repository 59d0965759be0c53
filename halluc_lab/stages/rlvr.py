"""RLVR: reinforcement learning from the task's verifier, with group baselines and an optional
``<bksp>``.

Chapter 10. Sources: 001 Part 2 §3 (RLVR, Listing 3: nanochat's simplified GRPO), 000 §7 (exposure
bias, §7.3 detect–backtrack–correct); Shao et al. 2024 (GRPO), Liu et al. 2025 (Dr. GRPO), Yu
et al. 2025 (DAPO), Kalai et al. 2025 (rewarding abstention)::

    hist = rlvr(policy, reference, prompts, VerifierReward(task, tok, lam=3.0), RLVRConfig(),
                GRPO(), tok=tok, seed=0)

A round: ``prompts_per_iteration`` prompts, each prefilled once and continued
``samples_per_prompt`` = G times at temperature 1 by the backspace controller
(:mod:`halluc_lab.generation.backtrack`: a sampled ``<bksp>`` takes back the last token, in the
``"keep"`` or ``"erase"`` context, or is masked out). The reward sees what the answer finally says
(after the take-backs) and pays +1 correct, 0 abstained, −λ wrong, minus an optional cost per
``<bksp>``. Each rollout's advantage is its reward against its group's mean (divided by the group's
standard deviation when the loss asks); every token the rollout sampled — the erased ones and the
``<bksp>`` included, each in the context it was sampled in — gets it. Then ``minibatches`` optimizer
steps, each on whole groups, minimise the loss the caller passes (:class:`Listing3`, :class:`GRPO`,
:class:`DrGRPO`, :class:`DAPO`: :mod:`halluc_lab.training.rlvr_losses`'), with an optional k3 KL
term to the reference policy; the KL is measured every round either way. The round's rows and
log-probs, and the optional update replayed as CUDA graphs, are
:mod:`halluc_lab.stages.rlvr_rounds`'.

Under ``torchrun`` (:mod:`halluc_lab.training.distributed`) each rank rolls out its contiguous share
of the round's prompts on its own GPU, with its own sampling stream; the rollouts and rewards are
gathered, so every rank sees the whole round and the group statistics are the single process's. Each
minibatch's whole groups are shared out again, each rank's loss is weighed by its share of the
loss's denominator (``denominator``: the tokens, or the sequences, it divides by), and DDP's average
of the gradients is then the global batch's.

Where the code departs from the documents: Listing 3 never calls ``loss.backward()`` before
``optimizer.step()``, so as printed it trains nothing; :class:`Listing3` is the listing with the
backward pass (and the mean over real tokens, not padding). π_old's log-probs come from a forward
pass before the round's first step (so the first ratio is 1); with one minibatch they are the step's
own, detached.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from halluc_lab.training import distributed
from halluc_lab.generation.backtrack import CONTEXTS, Rollout, rollout
from halluc_lab.training.data import prompt_rounds
from halluc_lab.device import deterministic, to_device
from halluc_lab.evaluation.evaluate import answer_budget, model_device
from halluc_lab.training.losses import check_positive, kl_estimates
from halluc_lab.stages.preference import preference_examples
from halluc_lab.progress import progress
from halluc_lab.training.recipe import Stage
from halluc_lab.training.rlvr_losses import (DAPO, GRPO, POLICY_LOSSES, DrGRPO, Listing3,
                                             group_advantages)
from halluc_lab.stages.reward_model import Reward, VerifierReward
from halluc_lab.stages.rlvr_rounds import CapturedUpdate, log_logprobs, pad_flags, round_rows
from halluc_lab.training.step import autocast, make_optimizer
from halluc_lab.tasks.base import check_count, make_task, reward_values
from halluc_lab.model.tokenizer import Tokenizer
from halluc_lab.training.train import History, TrainConfig

Tensor = torch.Tensor


@dataclass(frozen=True)
class RLVRConfig:
    """One RLVR run: rounds of group rollouts, each followed by ``minibatches`` optimizer steps."""

    iterations: int = 20  # rounds
    # prompts per round (a seeded order, cycling through the prompts)
    prompts_per_iteration: int = 16
    # G: rollouts per prompt from one prefill; the group baseline needs G >= 2
    samples_per_prompt: int = 8
    max_new_tokens: int = 16  # emitted tokens per rollout, take-backs included
    minibatches: int = 1  # optimizer steps per round, each on an equal share of the round's groups
    lr: float = 1e-5  # AdamW's rate (constant)
    grad_clip: float = 1.0  # global gradient-norm clip
    beta: float = 0.0  # weight of the k3 KL term to the reference in the loss (0: none)
    # what a <bksp> leaves in the context: "keep" or "erase" (halluc_lab.generation.backtrack)
    context: str = "keep"
    allow_bksp: bool = True  # False: <bksp> is masked out of rollouts and of the policy's log-probs
    # compile the rollouts' decode step (CUDA only; halluc_lab.generation.engine: other low bits)
    fused_decode: bool = False
    # each optimizer step one CUDA graph (CUDA, keep, one process; other low bits)
    captured_update: bool = False

    def __post_init__(self):
        for name in ("iterations", "prompts_per_iteration", "max_new_tokens", "minibatches"):
            check_count(name, getattr(self, name), 1)
        if (isinstance(self.samples_per_prompt, bool)
                or not isinstance(self.samples_per_prompt, int) or self.samples_per_prompt < 2):
            raise ValueError("samples_per_prompt must be an int >= 2 (a group baseline needs at "
                             "least 2 samples), "
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
            raise ValueError("captured_update needs context='keep' (a rollout is then one training "
                             "row of fixed "
                             f"width); got context={self.context!r}")
        if self.prompts_per_iteration % self.minibatches:
            raise ValueError(f"prompts_per_iteration={self.prompts_per_iteration} must split into "
                             f"minibatches={self.minibatches} equal shares of whole groups")


@dataclass
class RLVRHistory:
    """Per round, means over its rollouts."""

    reward: list[float] = field(default_factory=list)  # the reward optimised
    abstained: list[float] = field(default_factory=list)  # share whose final text holds <abstain>
    # Σ_t k3 per rollout: KL(π ‖ π_ref) estimated on its tokens
    kl: list[float] = field(default_factory=list)
    # emitted tokens per rollout, take-backs included
    length: list[float] = field(default_factory=list)
    bksp_rate: list[float] = field(default_factory=list)  # <bksp> per emitted token
    # share of groups whose rewards all tie (no signal)
    zero_groups: list[float] = field(default_factory=list)


def rlvr(policy: nn.Module, reference: nn.Module, prompts: Sequence[Sequence[int]], reward: Reward,
         cfg: RLVRConfig, loss=GRPO(), *, tok: Tokenizer, seed: int,
         autocast_dtype: torch.dtype | None = None, desc: str = "rlvr") -> RLVRHistory:
    """Train ``policy`` in place to maximise the verifier's reward (module docstring); its history.

    ``reference``: a frozen copy of the starting policy (the KL's π_ref); ``prompts``: token ids,
    ``<bos>`` first; ``reward``: ``(prompts, completions, **kw) -> list[float]`` on token ids, the
    completion being the rollout's whole log (the verifier applies the take-backs); ``loss``: one of
    :data:`POLICY_LOSSES`; ``tok``: the ids of ``<bksp>``, ``<abstain>``, ``<eos>`` and ``<pad>``.
    Sampling and minibatch order follow ``seed``.
    """
    if reference is policy:
        raise ValueError("reference must be a model of its own: a frozen copy of the "
                         "starting policy")
    if not isinstance(loss, POLICY_LOSSES):
        raise TypeError(f"loss must be one of {[c.__name__ for c in POLICY_LOSSES]}, got "
                        f"{type(loss).__name__}")
    if not prompts:
        raise ValueError("prompts must hold at least one prompt")
    device, G, M = model_device(policy), cfg.samples_per_prompt, cfg.max_new_tokens
    ranks = distributed.world_size()
    if cfg.prompts_per_iteration // cfg.minibatches < ranks:
        raise ValueError(f"a minibatch of {cfg.prompts_per_iteration // cfg.minibatches} groups "
                         "cannot give each of "
                         f"{ranks} processes a group: raise prompts_per_iteration or "
                         "lower minibatches")
    order_g = torch.Generator().manual_seed(seed)  # the same on every rank: prompts and minibatches
    sample_g = torch.Generator(device=device).manual_seed(
        seed + _RANK_SEED_STRIDE * distributed.rank())
    if cfg.captured_update and (device.type != "cuda" or ranks > 1):
        raise ValueError("captured_update replays a CUDA graph in one process: the policy is on "
                         f"{device} and "
                         f"{ranks} processes run")
    optimizer = make_optimizer(policy, TrainConfig(lr=cfg.lr, betas=(0.9, 0.999), weight_decay=0.0),
                               capturable=cfg.captured_update)
    banned = () if cfg.allow_bksp else (tok.bksp_id,)
    captured = CapturedUpdate(policy, reference, optimizer, loss, cfg, prompts, banned,
                              autocast_dtype, tok.pad_id) if cfg.captured_update else None
    was_training = policy.training
    reference.eval()
    trainable = distributed.wrap(policy)  # itself in one process
    next_prompts, hist, kl_sums = prompt_rounds(len(prompts), cfg.prompts_per_iteration,
                                                order_g), RLVRHistory(), []
    for _ in progress(range(cfg.iterations), desc=desc):
        todo = next(next_prompts)
        # this rank's whole groups of each minibatch
        parts = [groups[distributed.shard(len(groups))]
                 for groups in torch.randperm(cfg.prompts_per_iteration,
                                              generator=order_g).chunk(cfg.minibatches)]
        parts = [(groups[:, None] * G + torch.arange(G)).flatten() for groups in parts]
        policy.eval()
        # this rank rolls out its share of the round's prompts
        mine = todo[distributed.shard(len(todo))]
        # Captured, the reference scores the rollouts on the device while the host reads and judges
        # them.
        scoring = None if captured is None else lambda out: captured.score(todo, out, parts)
        samples = _gather(_sample(policy, [prompts[i] for i in mine], reward, cfg, tok, sample_g,
                                  autocast_dtype, while_judging=scoring))
        rewards = torch.tensor(samples.rewards)
        advantages = to_device(group_advantages(rewards, G, scale=loss.scale_advantages), device)
        mask = to_device(pad_flags(samples.sampled, M), device)  # (N, M)
        if captured is not None:
            kl_sum = captured.update(advantages, mask)
        else:
            kl_sum = _eager_update(policy, trainable, reference, optimizer, loss, cfg, samples,
                                   [prompts[i] for i in todo], parts, advantages, mask, banned, tok,
                                   autocast_dtype)
        # read at the end: reading it now would make the host wait for the step
        kl_sums.append(kl_sum)
        _record(hist, rewards, samples, tok, G)
    n = cfg.prompts_per_iteration * G
    hist.kl = [k / n for k in torch.stack(kl_sums).tolist()]  # Σ k3 per rollout, each round
    policy.train(was_training)
    return hist


def _eager_update(policy: nn.Module, trainable: nn.Module, reference: nn.Module, optimizer, loss,
                  cfg: RLVRConfig, samples: RoundSamples, prompts: list, parts: list[Tensor],
                  advantages: Tensor, mask: Tensor, banned: tuple[int, ...], tok: Tokenizer,
                  dtype: torch.dtype | None) -> Tensor:
    """:func:`rlvr`'s optimizer steps, eagerly, one per minibatch ``parts[k]`` (rollout indices into
    ``samples``, G per prompt of ``prompts``, the round's); ``trainable``: the policy as DDP wraps
    it. The sum of the k3 KL estimates over the round's tokens, over every rank, on the device."""
    device, G, M = advantages.device, cfg.samples_per_prompt, cfg.max_new_tokens
    ranks = distributed.world_size()
    repeated = [list(p) for p in prompts for _ in range(G)]
    rows = [round_rows([repeated[i] for i in part], [samples.logs[i] for i in part],
                       [samples.sampled[i] for i in part], M, bksp_id=tok.bksp_id,
                       context=cfg.context, pad_id=tok.pad_id).to(device)
            for part in map(Tensor.tolist, parts)]
    # before any step: π_ref, and π_old if it differs
    with torch.no_grad(), autocast(device, dtype):
        ref = [log_logprobs(reference, r, banned) for r in rows]
        old = [log_logprobs(policy, r, banned) for r in rows] if cfg.minibatches > 1 else None
    policy.train()
    kl_sum = torch.zeros((), device=device)
    for k, (part, r) in enumerate(zip(parts, rows)):
        part = to_device(part, device)
        m = mask[part]
        with autocast(device, dtype):
            logp = log_logprobs(trainable, r, banned)
        # measured every round; in the loss (with its gradient) if β > 0
        kl = kl_estimates(logp, ref[k], m).k3
        value = loss(logp, logp.detach() if old is None else old[k], advantages[part], m,
                     kl=kl if cfg.beta else None, beta=cfg.beta, max_tokens=M)
        # DDP averages the ranks' gradients: weigh each rank's loss by its share of the global
        if ranks > 1:
            # denominator, so that the average is the global batch's loss
            den = loss.denominator(m, M).float()
            value = value * (ranks * den.clamp_min(1) / distributed.all_sum(den).clamp_min(1))
        optimizer.zero_grad(set_to_none=True)
        value.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.grad_clip)
        optimizer.step()
        kl_sum += kl.detach().sum()
    return distributed.all_sum(kl_sum)


# rank r samples with seed + r·stride; rank 0's stream is the single process's
_RANK_SEED_STRIDE = 1_000_003


@dataclass(frozen=True)
class RoundSamples:
    """A round's rollouts as lists, prompt-major (G per prompt): one rank's share, or all ranks'
    gathered."""

    logs: list[list[int]]  # every emitted token, take-backs included
    sampled: list[list[bool]]  # whether each logged token was sampled (not forced)
    texts: list[list[int]]  # what each rollout finally says
    rewards: list[float]  # the reward of each

    @classmethod
    def concat(cls, parts: Sequence[RoundSamples]) -> RoundSamples:
        """The rollouts of ``parts`` laid end to end, in order."""
        return cls(*([x for p in parts for x in getattr(p, f.name)]
                     for f in dataclasses.fields(cls)))


def _sample(policy: nn.Module, prompts: list, reward: Reward, cfg: RLVRConfig, tok: Tokenizer,
            generator: torch.Generator, dtype: torch.dtype | None,
            while_judging: Callable[[Rollout], None] | None = None) -> RoundSamples:
    """G rollouts of each prompt from one prefill, and their rewards. ``while_judging(rollouts)``,
    given the rollouts on the device, queues device work that needs no reward, to run while the host
    judges them."""
    G = cfg.samples_per_prompt
    out = rollout(policy, prompts, cfg.max_new_tokens, bksp_id=tok.bksp_id, context=cfg.context,
                  allow_bksp=cfg.allow_bksp, stop_tokens=(tok.eos_id,), generator=generator,
                  dtype=dtype, n_samples=G, fused=cfg.fused_decode)
    on_host = out.to_host()
    if while_judging is not None:
        while_judging(out)
    out = on_host()  # waits for the copies only
    logs = out.token_lists()
    scores = reward_values(reward, [list(p) for p in prompts for _ in range(G)], logs)
    return RoundSamples(logs, out.sampled_lists(), out.text_lists(), scores)


def _gather(samples: RoundSamples) -> RoundSamples:
    """Every rank's rollouts, in rank order (the round's prompt order): the group statistics see
    them all."""
    parts = distributed.gather_objects(samples)
    return samples if len(parts) == 1 else RoundSamples.concat(parts)


def _record(hist: RLVRHistory, rewards: Tensor, samples: RoundSamples, tok: Tokenizer,
            G: int) -> None:
    """Append a round's means to ``hist`` (all but the KL, which :func:`rlvr` reads at the end)."""
    texts, emitted = samples.texts, sum(len(log) for log in samples.logs)
    tied = (rewards.view(-1, G) == rewards.view(-1, G)[:, :1]).all(1)
    for name, v in (("reward", rewards.mean().item()),
                    ("abstained", sum(tok.abstain_id in t for t in texts) / len(texts)),
                    ("length", emitted / len(texts)),
                    ("bksp_rate",
                     sum(log.count(tok.bksp_id) for log in samples.logs) / max(emitted, 1)),
                    ("zero_groups", tied.float().mean().item())):
        getattr(hist, name).append(v)


# -- the recipe stage ------------------------------------------------------------------------------
@dataclass(frozen=True)
class RLVR(Stage):
    """RLVR from the starting model on ``n_prompts`` prompts of
    :func:`~halluc_lab.stages.preference.preference_examples` (the recipe's seed; chapter 9's
    methods learn from the same), rewarded by the task's verifier: +1 correct, 0 abstained, −``lam``
    wrong, −``bksp_cost`` per ``<bksp>``.

    Of ``config``, the
    recipe's ``train.steps`` replaces ``iterations``, ``train.lr`` replaces ``lr`` and the prompts'
    answer budget ``max_new_tokens``. The history has one entry per round (loss: −mean reward) and
    the :class:`RLVRHistory` series under ``metrics``. A killed run starts over.
    """

    n_prompts: int  # prompts drawn by preference_examples (with the recipe's seed)
    config: RLVRConfig = RLVRConfig()  # rollouts per round, G, minibatches, β, context, allow_bksp
    # the loss (not ``loss``: a Stage's method of that name)
    policy_loss: Listing3 | GRPO | DrGRPO | DAPO = GRPO()
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
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not (math.isfinite(value) and value >= 0)):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")

    def rows(self, recipe):
        raise ValueError(f"{type(self).__name__} samples its rollouts from the policy as it "
                         "trains: it has no rows")

    def fit(self, recipe, model: nn.Module, device: torch.device, dtype: torch.dtype | None,
            checkpoints: str) -> History:
        """Train ``model`` (the parent's weights) in place; its history."""
        task = make_task(recipe.task)
        tok = task.tokenizer()
        examples = preference_examples(task, self.n_prompts, seed=recipe.seed)
        cfg = dataclasses.replace(self.config, iterations=recipe.train.steps, lr=recipe.train.lr,
                                  max_new_tokens=answer_budget(examples))
        with deterministic():
            # π_ref: the starting model, frozen
            reference = copy.deepcopy(model).eval().requires_grad_(False)
            h = rlvr(model, reference, [(tok.bos_id, *tok.encode(e.prompt)) for e in examples],
                     VerifierReward(task, tok, self.lam, self.bksp_cost), cfg, self.policy_loss,
                     tok=tok, seed=recipe.seed, autocast_dtype=dtype, desc=recipe.name)
        return History(step=list(range(1, cfg.iterations + 1)), loss=[-r for r in h.reward],
                       lr=[cfg.lr] * cfg.iterations, metrics=dataclasses.asdict(h))
