"""RLHF and RL on the verifier: PPO with a KL penalty to the reference policy, its rollout scoring
and its update each replayed as one CUDA graph, and the recipe stages that run it.

Chapter 9 (chapter 10 starts from these models and this loop). Sources: 001 Part 2 §1.B (the
KL-regularised objective, "token-level log-probability regularisation"), §3 (the verifier as
reward); Schulman et al. 2017 (PPO), 2016 (GAE); Ouyang et al. 2022 (InstructGPT's per-token KL
penalty)::

    hist = ppo(policy, sft, RewardModel.from_lm(sft), prompts, VerifierReward(task, tok),
               PPOConfig(), pad_id=tok.pad_id, seed=0, stop_tokens=(tok.eos_id,))
    rm = fit_reward_model(sft, tok, task, examples, RewardModelPlan(), seed=0)  # RLHF's proxy, then
    ppo(policy, sft, RewardModel.from_lm(sft), prompts, LearnedReward(rm, tok.pad_id), cfg, ...,
        gold=VerifierReward(task, tok))                                         # the verifier only
        watches

A round: the engine samples ``samples_per_prompt`` answers to each of ``prompts_per_iteration``
prompts at temperature 1; the reward scores them; one forward pass each of policy, reference and
value model gives log π_old, the KL penalty and V; GAE turns rewards into advantages (whitened per
round) and returns; then ``epochs`` passes of ``minibatches`` clipped updates train policy and value
model together (one backward, each model's gradient clipped on its own, AdamW each).

Why graphs. The lab's models are small, so an eager forward and backward is mostly the host
launching kernels (about 15 ms a minibatch for the 4 × 256 model on an H100, whatever its size). On
CUDA the round's scoring (three forwards, KL, GAE, whitening) and the minibatch update (two
forwards, one backward, two clippings, two fused AdamW steps) are each captured once and replayed
(:class:`halluc_lab.training.step.Graphs`). Graphs need fixed shapes: every rollout row is padded to
the longest prompt plus the answer budget, and the rollouts split into equal minibatches
(``PPOConfig`` checks). Nothing in a round waits for the device but the engine's token read-back and
one read of the round's statistics. ``cuda_graph=False`` runs the same code eagerly (the reference
the GPU tests compare the graphs with).

Where the code departs from the documents:

- The KL penalty enters the reward per token as k1 = log π − log π_ref (InstructGPT's); k3 is
  reported beside it. The task reward is added at the last token. Advantages are GAE (γ, λ) against
  a separate value model; π_old's log-probs are recomputed by a forward pass rather than taken from
  the engine, so the first ratio is exactly 1. Rollouts sample at temperature 1: anything else is
  not π's distribution.
- RLHF here learns its reward model from the SFT model's own samples ranked by the verifier with a
  share of labels flipped (the annotator of :mod:`halluc_lab.stages.preference_data`), not from
  people.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from halluc_lab.training.data import IGNORE, batches, prompt_rounds, rollout_batch
from halluc_lab.device import deterministic
from halluc_lab.generation.engine import generate
from halluc_lab.evaluation.evaluate import answer_budget, model_device
from halluc_lab.training.losses import (check_positive, gae_advantages, kl_estimates,
                                       ppo_clipped_objective, token_logprobs)
from halluc_lab.stages.preference import preference_examples
from halluc_lab.progress import progress
from halluc_lab.training.recipe import Stage
from halluc_lab.stages.preference_data import (AgreeableAnnotator, PreferencePairs, SampleGroups,
                                               build_pairs, check_rate, sample_groups)
from halluc_lab.stages.reward_model import (BradleyTerryLoss, LearnedReward, Reward, RewardModel,
                                            VerifierReward)
from halluc_lab.training.step import Graphs, autocast, make_optimizer
from halluc_lab.tasks.base import check_count, make_task, reward_values
from halluc_lab.training.train import History, TrainConfig, train


@dataclass(frozen=True)
class PPOConfig:
    """One PPO run: rounds of rollouts, each followed by a few epochs of clipped updates."""

    iterations: int = 20  # rounds of rollouts then updates
    prompts_per_iteration: int = 16  # prompts drawn per round (in a seeded order, cycling)
    samples_per_prompt: int = 4  # rollouts per prompt: one prefill, G continuations
    max_new_tokens: int = 16  # the answer budget
    epochs: int = 2  # passes over each round's rollouts
    minibatches: int = 2  # optimizer steps per epoch, each on an equal share of the rollouts
    clip: float = 0.2  # ε of the clipped ratio
    kl_coef: float = 0.05  # β: weight of the per-token KL penalty (k1) in the reward
    gamma: float = 1.0  # discount γ
    gae_lambda: float = 0.95  # λ of GAE (1: Monte-Carlo returns minus the value)
    lr: float = 1e-4  # the policy's AdamW rate
    value_lr: float = 1e-4  # the value model's AdamW rate
    grad_clip: float = 1.0  # global gradient-norm clip, each model

    def __post_init__(self):
        for name in ("iterations", "prompts_per_iteration", "samples_per_prompt", "max_new_tokens",
                     "epochs", "minibatches"):
            check_count(name, getattr(self, name), 1)
        for name in ("clip", "lr", "value_lr", "grad_clip"):
            check_positive(name, getattr(self, name))
        if not (self.kl_coef >= 0 and math.isfinite(self.kl_coef)):
            raise ValueError(f"kl_coef must be a finite number >= 0, got {self.kl_coef!r}")
        check_rate("gamma", self.gamma)
        check_rate("gae_lambda", self.gae_lambda)
        rollouts = self.prompts_per_iteration * self.samples_per_prompt
        if rollouts % self.minibatches:
            raise ValueError(f"the {rollouts} rollouts of a round (prompts_per_iteration × "
                             "samples_per_prompt) must "
                             f"split into minibatches={self.minibatches} equal ones")


@dataclass
class PPOHistory:
    """Per round, means over its rollouts."""

    reward: list[float] = field(default_factory=list)  # the task reward R (without the KL penalty)
    # the watched reward (``gold``), if one was given
    gold: list[float] = field(default_factory=list)
    # Σ_t k1 per completion: the penalised KL estimate
    kl_k1: list[float] = field(default_factory=list)
    # Σ_t k3 per completion: unbiased, ≥ 0 per token
    kl_k3: list[float] = field(default_factory=list)
    length: list[float] = field(default_factory=list)  # completion tokens
    # share of token updates with the ratio off [1 ± ε]
    clip_fraction: list[float] = field(default_factory=list)
    # ½ (V − return)² per token, the round's last minibatch
    value_loss: list[float] = field(default_factory=list)


class _Rounds:
    """The tensors of one PPO run and the two computations on them, eager or replayed as CUDA
    graphs.

    ``self.rows`` (input ids, labels, task rewards) is what a round writes in; :meth:`score` returns
    the round's log π_old, advantages, returns and statistics; :meth:`update` copies the minibatch
    rows ``idx`` into ``self.mini`` and trains on them. Every tensor keeps its address for the run,
    as a graph needs; the update's graph is captured with the optimizers, whose warm-up steps it
    undoes.
    """

    def __init__(self, policy, reference, value, cfg: PPOConfig, width: int, dtype,
                 cuda_graph: bool):
        self.policy, self.reference, self.value = policy, reference, value
        self.cfg, self.dtype = cfg, dtype
        self.device = model_device(policy)
        n = cfg.prompts_per_iteration * cfg.samples_per_prompt
        z = lambda *shape, dt=torch.long: torch.zeros(*shape, dtype=dt, device=self.device)
        self.rows = {"input_ids": z(n, width), "labels": z(n, width),
                     "scores": z(n, dt=torch.float32)}
        self.mini = {k: z(n // cfg.minibatches, width - 1, dt=torch.float32)
                     for k in ("logp_old", "adv", "returns")}
        self.mini |= {"input_ids": z(n // cfg.minibatches, width),
                      "labels": z(n // cfg.minibatches, width)}
        # Capturable on CUDA also when run eagerly: the same update arithmetic with and without
        # graphs.
        opt = lambda m, lr: make_optimizer(m,
                                           TrainConfig(lr=lr, betas=(0.9, 0.999), weight_decay=0.0),
                                           capturable=self.device.type == "cuda")
        self.optimizers = [opt(policy, cfg.lr), opt(value, cfg.value_lr)]
        self.graphs = Graphs(cuda_graph)

    @torch.no_grad()
    def _score_body(self) -> dict:
        cfg, ids, labels = self.cfg, self.rows["input_ids"], self.rows["labels"]
        mask = labels[:, 1:] != IGNORE  # (B, W-1) the tokens the policy chose
        with autocast(self.device, self.dtype):
            logp_old = token_logprobs(self.policy(ids), labels).float()  # (B, W-1)
            logp_ref = token_logprobs(self.reference(ids), labels).float()
            # (B, W-1) V(s_t), s_t: the context before token t+1
            values = self.value(ids)[:, :-1].float() * mask
        kl = kl_estimates(logp_old, logp_ref, mask)
        rewards = -cfg.kl_coef * kl.k1  # (B, W-1) the KL penalty per token, InstructGPT's
        # (B, 1) each row's last completion token
        last = mask.long().cumsum(1).argmax(1, keepdim=True)
        rewards = rewards.scatter_add(1, last, self.rows["scores"][:, None])
        adv, returns = gae_advantages(rewards, values, mask, cfg.gamma, cfg.gae_lambda)
        m, n = mask.float(), mask.sum().clamp_min(1)
        mean = (adv * m).sum() / n
        std = ((((adv - mean) * m) ** 2).sum() / n).sqrt()
        # whitened per round, over its tokens
        adv = torch.where(mask, (adv - mean) / (std + 1e-8), 0.0)
        stats = torch.stack([kl.k1.sum(1).mean(), kl.k3.sum(1).mean(), m.sum(1).mean()])
        return {"logp_old": logp_old, "adv": adv, "returns": returns, "stats": stats}

    def score(self, input_ids, labels, scores) -> dict:
        for name, new in (("input_ids", input_ids), ("labels", labels), ("scores", scores)):
            self.rows[name].copy_(new)
        return self.graphs.run("score", self._score_body)

    def _update_body(self) -> torch.Tensor:
        cfg, b = self.cfg, self.mini
        mask = b["labels"][:, 1:] != IGNORE
        n = mask.sum().clamp_min(1)
        with autocast(self.device, self.dtype):
            logp = token_logprobs(self.policy(b["input_ids"]), b["labels"]).float()  # (b, W-1)
            v = self.value(b["input_ids"])[:, :-1].float()  # (b, W-1)
        objective = ppo_clipped_objective(logp, b["logp_old"], b["adv"], mask, cfg.clip)
        value_loss = 0.5 * (((v - b["returns"]) ** 2) * mask).sum() / n
        # two models, two losses: one backward serves both
        (-objective.sum() / n + value_loss).backward()
        for model, opt in zip((self.policy, self.value), self.optimizers):
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
        clipped = ((((logp.detach() - b["logp_old"]).exp() - 1).abs() > cfg.clip) & mask).sum()
        return torch.stack([clipped.float(), mask.sum().float(), value_loss.detach()])

    def update(self, scored: dict, idx: torch.Tensor) -> torch.Tensor:
        """One clipped update on rows ``idx``: (clipped tokens, tokens, value loss) as a device
        tensor."""
        for name, src in (("input_ids", self.rows["input_ids"]), ("labels", self.rows["labels"]),
                          ("logp_old", scored["logp_old"]), ("adv", scored["adv"]),
                          ("returns", scored["returns"])):
            torch.index_select(src, 0, idx, out=self.mini[name])
        out = self.graphs.run("update", self._update_body, self.optimizers)
        if not self.graphs.enabled:
            for opt in self.optimizers:
                opt.zero_grad(set_to_none=True)
        return out.clone()


def ppo(policy: nn.Module, reference: nn.Module, value: RewardModel,
        prompts: Sequence[Sequence[int]], reward: Reward, cfg: PPOConfig, *, pad_id: int, seed: int,
        stop_tokens: Sequence[int] = (), gold: Reward | None = None,
        autocast_dtype: torch.dtype | None = None, cuda_graph: bool | None = None,
        desc: str = "ppo") -> PPOHistory:
    """RLHF's policy optimisation: maximise E[R(x, y)] − β KL(π ‖ π_ref) with PPO (see the module
    docstring).

    ``policy`` is trained in place; ``reference`` (a frozen copy of the starting policy) scores the
    KL penalty; ``value`` (e.g. :meth:`RewardModel.from_lm` of the policy, or a trained reward
    model) is fit to the returns. ``prompts``: token ids, ``<bos>`` first; ``reward``: a
    :data:`~halluc_lab.stages.reward_model.Reward`, the gold :class:`VerifierReward` or RLHF's
    :class:`LearnedReward`; ``gold``: a second reward recorded each round and never optimised (the
    verifier, while PPO maximises a learned proxy). ``autocast_dtype``: e.g. ``torch.bfloat16``;
    ``cuda_graph``: replay scoring and update as CUDA graphs (default: on CUDA). Sampling and
    minibatch order follow ``seed``.
    """
    if reference is policy or value is policy:
        raise ValueError("reference and value must be models of their own (the reference a frozen "
                         "copy of the policy)")
    if not prompts:
        raise ValueError("prompts must hold at least one prompt")
    device = model_device(policy)
    cuda_graph = device.type == "cuda" if cuda_graph is None else bool(cuda_graph)
    if cuda_graph and device.type != "cuda":
        raise ValueError(f"cuda_graph=True needs the models on a CUDA device, they are on {device}")
    order_g = torch.Generator().manual_seed(seed)
    sample_g = torch.Generator(device=device).manual_seed(seed)
    # every rollout row, padded: graphs need one shape
    width = max(len(p) for p in prompts) + cfg.max_new_tokens
    rounds = _Rounds(policy, reference, value, cfg, width, autocast_dtype, cuda_graph)
    was_training = policy.training
    reference.eval()
    next_prompts, hist = prompt_rounds(len(prompts), cfg.prompts_per_iteration,
                                       order_g), PPOHistory()
    for _ in progress(range(cfg.iterations), desc=desc):
        todo = next(next_prompts)
        repeated = [list(prompts[i]) for i in todo for _ in range(cfg.samples_per_prompt)]
        policy.eval()
        completions = generate(policy, [prompts[i] for i in todo], cfg.max_new_tokens,
                               stop_tokens=stop_tokens, generator=sample_g,
                               n_samples=cfg.samples_per_prompt, dtype=autocast_dtype).token_lists()
        scores = reward_values(reward, repeated, completions)
        batch = rollout_batch(repeated, completions, pad_id)
        grow = width - batch.input_ids.shape[1]
        ids = torch.nn.functional.pad(batch.input_ids, (0, grow), value=pad_id)
        labels = torch.nn.functional.pad(batch.labels, (0, grow), value=IGNORE)
        scored = rounds.score(ids.to(device), labels.to(device),
                              torch.tensor(scores, device=device))
        policy.train()
        value.train()
        seen = [rounds.update(scored, idx.to(device)) for _ in range(cfg.epochs)
                for idx in torch.randperm(len(scores), generator=order_g).chunk(cfg.minibatches)]
        k1, k3, length = scored["stats"].tolist()  # the round's one read of the device
        clipped, tokens, value_loss = torch.stack(seen).T.tolist()  # per update
        for name, v in (("reward", sum(scores) / len(scores)), ("kl_k1", k1), ("kl_k3", k3),
                        ("length", length), ("clip_fraction", sum(clipped) / max(sum(tokens), 1)),
                        ("value_loss", value_loss[-1])):
            getattr(hist, name).append(v)
        if gold is not None:
            hist.gold.append(sum(float(r) for r in gold(repeated, completions)) / len(completions))
    policy.train(was_training)
    return hist


# -- RLHF's reward model, and the recipe stage -----------------------------------------------------
@dataclass(frozen=True)
class RewardModelPlan:
    """How RLHF's reward model is fit: Bradley–Terry on pairs of the SFT model's own samples, ranked
    by the verifier with a share of labels flipped (the simulated annotators of
    :func:`~halluc_lab.stages.preference_data.build_pairs`), or first re-ranked by annotators with a
    bias (chapter 12: :class:`~halluc_lab.stages.preference_data.AgreeableAnnotator`)."""

    flip_rate: float = 0.1  # share of preference labels the annotator flips
    samples: int = 8  # answers sampled per prompt, to be ranked
    pairs_per_prompt: int = 2  # pairs drawn from each prompt's ranked answers
    steps: int = 300  # AdamW steps
    lr: float = 1e-4  # peak learning rate (a tenth of the steps warm up)
    batch_size: int = 128  # pairs per step
    # raters with a bias of their own (None: the verifier's ranking)
    annotator: AgreeableAnnotator | None = None

    def __post_init__(self):
        check_rate("flip_rate", self.flip_rate)
        if self.annotator is not None and not isinstance(self.annotator, AgreeableAnnotator):
            raise TypeError("annotator must be an AgreeableAnnotator or None, got "
                            f"{type(self.annotator).__name__}")
        check_count("samples", self.samples, 2)
        for name in ("pairs_per_prompt", "steps", "batch_size"):
            check_count(name, getattr(self, name), 1)
        check_positive("lr", self.lr)


def fit_reward_model(lm: nn.Module, groups: SampleGroups, plan: RewardModelPlan, *, seed: int,
                     autocast_dtype: torch.dtype | None = None) -> tuple[RewardModel,
                                                                         PreferencePairs]:
    """A :class:`RewardModel` (trunk: a copy of ``lm``) fit to pairs of ``groups``
    (:func:`sample_groups` of ``lm``'s answers, ``plan.samples`` per prompt) under deterministic
    kernels; ``(model, the pairs it saw)``."""
    pairs = build_pairs(groups, flip_rate=plan.flip_rate, pairs_per_prompt=plan.pairs_per_prompt,
                        seed=seed)
    rm = RewardModel.from_lm(lm, seed=seed)
    cfg = TrainConfig(steps=plan.steps, lr=plan.lr, warmup_steps=plan.steps // 10, weight_decay=0.0,
                      log_every=plan.steps)
    data = batches(pairs.rows().to(model_device(lm)), min(len(pairs), plan.batch_size), seed)
    train(rm, data, cfg, loss=BradleyTerryLoss(), autocast_dtype=autocast_dtype,
          desc="reward model")
    return rm.eval(), pairs


@dataclass(frozen=True)
class PPO(Stage):
    """PPO from the starting model on ``n_prompts`` prompts of
    :func:`~halluc_lab.stages.preference.preference_examples` (the recipe's seed): against the
    task's verifier (``reward_model=None``), or RLHF — against a reward model fit first as
    ``reward_model`` says, the verifier watching as the gold judge (what a PPO stage trains).

    Of ``config``, the
    recipe's training settings replace ``iterations`` (``recipe.train.steps``) and ``lr``
    (``recipe.train.lr``), and the prompts' answer budget replaces ``max_new_tokens``. The recorded
    history has one entry per round: loss −(R − β Σk1), and every :class:`PPOHistory` series under
    ``metrics``. A killed run starts over.
    """

    n_prompts: int  # prompts drawn by preference_examples (with the recipe's seed)
    config: PPOConfig = PPOConfig()  # rollouts per round, epochs, minibatches, β, ε, ...
    reward_model: RewardModelPlan | None = None  # None: the verifier is the reward; a plan: RLHF

    def __post_init__(self):
        check_count("n_prompts", self.n_prompts, 1)
        if not isinstance(self.config, PPOConfig):
            raise TypeError(f"config must be a PPOConfig, got {type(self.config).__name__}")
        if self.reward_model is not None and not isinstance(self.reward_model, RewardModelPlan):
            raise TypeError("reward_model must be a RewardModelPlan or None, got "
                            f"{type(self.reward_model).__name__}")

    def rows(self, recipe):
        raise ValueError(f"{type(self).__name__} samples its rollouts from the policy as it "
                         "trains: it has no rows")

    def reward_model_of(self, recipe, model: nn.Module,
                        dtype: torch.dtype | None) -> tuple[RewardModel, PreferencePairs]:
        """RLHF's reward model as :meth:`fit` fits it from ``model`` (the starting model, the
        recipe's parent), and its pairs: ``reward_model.samples`` answers to each prompt, ranked;
        the same bits when called again."""
        if self.reward_model is None:
            raise ValueError(f"{recipe.name}: this PPO stage optimises the verifier and fits no "
                             "reward model")
        task = make_task(recipe.task)
        examples = preference_examples(task, self.n_prompts, seed=recipe.seed)
        with deterministic():
            groups = sample_groups(model, task.tokenizer(), task, examples,
                                   self.reward_model.samples, seed=recipe.seed)
            if self.reward_model.annotator is not None:
                groups = self.reward_model.annotator.rerank(groups, task, task.tokenizer())
            return fit_reward_model(model, groups, self.reward_model, seed=recipe.seed,
                                    autocast_dtype=dtype)

    def fit(self, recipe, model: nn.Module, device: torch.device, dtype: torch.dtype | None,
            checkpoints: str) -> History:
        """Train ``model`` (the parent's weights) in place; its history."""
        task = make_task(recipe.task)
        tok = task.tokenizer()
        examples = preference_examples(task, self.n_prompts, seed=recipe.seed)
        verifier, reward = VerifierReward(task, tok), None
        with deterministic():
            if self.reward_model is not None:
                reward = LearnedReward(self.reward_model_of(recipe, model, dtype)[0], tok.pad_id)
            cfg = dataclasses.replace(self.config, iterations=recipe.train.steps,
                                      lr=recipe.train.lr, max_new_tokens=answer_budget(examples))
            # π_ref: the starting model, frozen
            reference = copy.deepcopy(model).eval().requires_grad_(False)
            h = ppo(model, reference, RewardModel.from_lm(model, seed=recipe.seed),
                    [(tok.bos_id, *tok.encode(e.prompt)) for e in examples], reward or verifier,
                    cfg, pad_id=tok.pad_id, seed=recipe.seed, stop_tokens=(tok.eos_id,),
                    gold=verifier, autocast_dtype=dtype, desc=recipe.name)
        return History(step=list(range(1, cfg.iterations + 1)),
                       loss=[cfg.kl_coef * k - r for r, k in zip(h.reward, h.kl_k1)],
                       lr=[cfg.lr] * cfg.iterations, metrics=dataclasses.asdict(h))
