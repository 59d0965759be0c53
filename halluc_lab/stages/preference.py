"""Learning from preferences: preference pairs from the policy's own samples, DPO and RSFT
(best-of-N and its soft variant) — one task, one verifier. RLHF's PPO is
:mod:`halluc_lab.stages.rlhf`.

Chapter 9. Sources: 001 Part 2 §1 (the reward model, the KL-regularised objective, DPO and its
Remark), §2 (RSFT and its N → ∞ claim), the "unified view"; 004 §9.1–9.2 (Bradley–Terry, eq. 9.1);
Rafailov et al. 2023 (DPO), Schulman et al. 2017 (PPO), Ouyang et al. 2022 (InstructGPT).

The task's verifier plays both parts a person plays in RLHF: the annotator who ranks the policy's
samples (correct ≻ abstained ≻ wrong, ties dropped, a seeded share of labels flipped) and the gold
judge a learned reward model only approximates. That preference data — :func:`sample_groups`,
:func:`rank_pairs`, :func:`build_pairs`, :class:`PreferencePairs` — is defined in
:mod:`halluc_lab.stages.preference_data` and re-exported here. Each method is a loss
callable for :func:`halluc_lab.training.train.train` or one plain loop::

    # the policy's own answers, then π_ref once
    groups = sample_groups(sft, tok, task, examples, n_samples=8, seed=0)
    pairs = precompute_reference_logps(sft, build_pairs(groups, flip_rate=0.1, seed=0))
    train(policy, batches(pairs.rows(), 32, seed=0), cfg, loss=DPOLoss(0.1, pairs.reference))
    rows = rsft_rows(groups, best_of_n(groups.rewards), seq_len=64)           # then SFT on them

Design. A pair is one packed row (:func:`~halluc_lab.stages.preference_data.pair_rows`), so rows
stay whole under shuffling, micro-batching and CUDA-graph capture. DPO's reference log-probs are
computed once, before training, into ``PreferencePairs.reference`` ``(P, 2)``, and :class:`DPOLoss`
looks each row's up by the pair number its segment ids carry: no reference forward pass during
training. :class:`DPO`, :class:`RSFT` and :class:`OwnErrorsSFT` are the recipe stages
(:class:`halluc_lab.training.recipe.Stage`): each overrides ``fit``, which samples from the starting
model and builds its rows before the first step, then runs the plain loop over them; a killed run
builds the same rows from the same starting model and resumes from its last checkpoint.

Where the code departs from the documents:

- RSFT's N → ∞ claim (001 §2) holds for the soft rule, not for best-of-N: the arg max of N samples
  tends to the highest-reward completion itself. :func:`soft_best_of_n` keeps one of the N with
  probability softmax(R/β) (sampling-importance-resampling); as N → ∞ the kept sample is distributed
  as π_ref(y|x) exp(R(y)/β)/Z, the optimum of the KL-regularised objective with β = τ.
- 001 writes the reward at the optimum as R = β⁻¹ log(π/π_ref) + C (it is β log(π/π_ref) + β log Z)
  and its Bradley–Terry step as σ(β(R⁺ − R⁻)); its Remark, multiplying the two, drops β, its loss
  keeps it. The loss here is Rafailov et al.'s eq. 7 (:func:`~halluc_lab.training.losses.dpo_loss`):
  σ(β Δ log-ratio).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from torch import nn

from halluc_lab.training.data import IGNORE, Batch, Encoded, batches, pack
from halluc_lab.training.losses import check_positive, dpo_loss, token_logprobs
# the preference data, re-exported
from halluc_lab.stages.preference_data import (check_rate, PreferencePairs,  # noqa: F401
                                               SampleGroups, build_pairs, pair_index,  # noqa: F401
                                               pair_masks, rank_pairs, sample_groups)  # noqa: F401
from halluc_lab.stages.reward_model import VerifierReward  # noqa: F401 (re-exported)
from halluc_lab.evaluation.evaluate import distinct_examples, model_device
from halluc_lab.stages.sft import own_error_demonstration
from halluc_lab.training.recipe import Recipe, Stage
from halluc_lab.tasks.base import Example, Task, check_count, make_task
from halluc_lab.training.train import History, Loss, NextTokenLoss, train

CHUNK = 512  # rows per generation or forward pass



# -- prompts: the held-out split, in a learning and an evaluated part ----------------------------
def preference_examples(task: Task, n: int, seed: int) -> list[Example]:
    """``n`` held-out examples (drawn with repeats, seeded) whose prompts lie in the part of the
    held-out split the chapter-9 methods learn from (:meth:`Task.learning_part`). Not the train
    split: the SFT model answers its prompts the same way every time, so its samples there give the
    annotator nothing to rank; :func:`evaluation_examples` is the other part."""
    check_count("n", n, 1)
    out: list[Example] = []
    for round_ in range(50):
        drawn = task.examples("heldout", n, seed=seed + 7919 * round_)
        out += [e for e in drawn if task.learning_part(e.prompt)]
        if len(out) >= n:
            return out[:n]
    raise ValueError(f"found {len(out)} of {n} held-out prompts in the learning part in 50 rounds "
                     "of draws")


def evaluation_examples(task: Task, n: int, seed: int) -> list[Example]:
    """Up to ``n`` distinct held-out examples whose prompts lie in the other part: what the methods
    never saw."""
    drawn = distinct_examples(task, "heldout", 2 * n, seed)
    return [e for e in drawn if not task.learning_part(e.prompt)][:n]


# -- DPO (001 Part 2 §1; 004 §9.2) -----------------------------------------------------------------
def pair_logps(model: nn.Module, batch: Batch) -> torch.Tensor:
    """``(B, 2)``: log π(chosen | x) and log π(rejected | x) of each pair row (sums over completion
    tokens)."""
    lp = token_logprobs(model(batch.input_ids, **batch.model_kwargs()), batch.labels)  # (B, T-1)
    chosen, rejected = pair_masks(batch)
    return torch.stack([(lp * chosen).sum(-1), (lp * rejected).sum(-1)], dim=1)


@torch.no_grad()
def precompute_reference_logps(ref_model: nn.Module, pairs: PreferencePairs,
                               chunk: int = CHUNK) -> PreferencePairs:
    """The pairs with ``reference`` filled: π_ref's log-probs of every chosen and rejected
    completion, computed once (one forward pass per ``chunk`` pairs) on the reference model's
    device. Run it under the autocast the training will use for identical numerics at step 0."""
    rows, device = pairs.rows(), model_device(ref_model)
    was_training = ref_model.training
    ref_model.eval()
    try:
        out = [pair_logps(ref_model, rows[i:i + chunk].to(device)).float()
               for i in range(0, len(pairs), chunk)]
    finally:
        ref_model.train(was_training)
    return dataclasses.replace(pairs, reference=torch.cat(out))


@dataclass(frozen=True, eq=False)
class DPOLoss:
    """``loss(model, batch) -> (summed DPO loss, pairs)`` over rows of :meth:`PreferencePairs.rows`.

    Each row's reference log-probs are looked up in ``reference`` by its pair number: the reference
    model never runs during training.
    """

    beta: float  # β: the KL weight of the objective DPO solves
    reference: torch.Tensor  # (P, 2) PreferencePairs.reference, on the training device
    label_smoothing: float = 0.0  # ε of conservative DPO: the assumed share of flipped labels

    def __post_init__(self):
        if (not isinstance(self.reference, torch.Tensor) or self.reference.dim() != 2
                or self.reference.shape[1] != 2):
            raise ValueError("reference must be a (P, 2) tensor: pairs = "
                             "precompute_reference_logps(ref_model, pairs), "
                             "then DPOLoss(beta, pairs.reference); got "
                             f"{type(self.reference).__name__}")
        check_positive("beta", self.beta)
        if not (isinstance(self.label_smoothing, (int, float)) and 0 <= self.label_smoothing < 0.5):
            raise ValueError(f"label_smoothing must be in [0, 0.5), got {self.label_smoothing!r}")

    def __call__(self, model: nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        if self.reference.device != batch.input_ids.device:
            raise ValueError(f"reference is on {self.reference.device} and the batch on "
                             f"{batch.input_ids.device}: "
                             "move the reference to the training device first")
        policy = pair_logps(model, batch)  # (B, 2)
        ref = self.reference[pair_index(batch)]  # (B, 2) computed once, before training
        terms = dpo_loss(policy[:, 0], policy[:, 1], ref[:, 0], ref[:, 1], self.beta,
                         label_smoothing=self.label_smoothing, reduction="sum")
        return terms.loss, batch.input_ids.new_full((), policy.shape[0])


# -- RSFT (001 Part 2 §2) --------------------------------------------------------------------------
def best_of_n(rewards: torch.Tensor) -> torch.Tensor:
    """``(P,)``: the index of each row's highest reward ``(P, N)``; ties go to the first
    (torch.argmax's rule)."""
    if not isinstance(rewards, torch.Tensor) or rewards.dim() != 2 or rewards.numel() == 0:
        raise ValueError("rewards must be a non-empty (P, N) tensor, got "
                         f"{getattr(rewards, 'shape', rewards)!r}")
    return rewards.argmax(dim=1)


def soft_best_of_n(rewards: torch.Tensor, beta: float, generator: torch.Generator) -> torch.Tensor:
    """``(P,)``: one index per row of ``rewards`` ``(P, N)``, drawn with probability softmax(R/β)
    over the N.

    Sampling-importance-resampling: when the N are samples of π_ref, the kept one tends to be
    distributed as π_ref(y) exp(R(y)/β)/Z as N → ∞ (the claim 001 §2 makes for best-of-N); as β → 0
    it keeps a best one.
    """
    best_of_n(rewards)  # checks the shape
    check_positive("beta", beta)
    if not bool(torch.isfinite(rewards).all()):
        raise ValueError("rewards must be finite")
    probs = torch.softmax(rewards.double() / beta, dim=1)  # (P, N)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


def rsft_rows(groups: SampleGroups, picks: torch.Tensor, seq_len: int, *,
              min_reward: float | None = None) -> Batch:
    """SFT rows from each prompt's picked sample (labels on its completion), packed in rows of
    ``seq_len``; a pick whose reward is below ``min_reward`` is left out (None: every pick is kept,
    as 001 §2 says)."""
    if tuple(picks.shape) != (len(groups.prompts),):
        raise ValueError(f"picks must hold one index per prompt ({len(groups.prompts)}), "
                         f"got shape {tuple(picks.shape)}")
    seqs = []
    for p, i in enumerate(picks.tolist()):
        if min_reward is None or float(groups.rewards[p, i]) >= min_reward:
            prompt, completion = groups.prompts[p], groups.completions[p][i]
            seqs.append(Encoded((*prompt, *completion), (IGNORE,) * len(prompt) + completion))
    if not seqs:
        raise ValueError(f"no pick has a reward >= min_reward={min_reward}: "
                         "nothing to fine-tune on")
    return pack(seqs, seq_len, groups.pad_id)


# -- recipe stages: DPO, RSFT and own-errors SFT on the starting model's own samples ---------------
@dataclass(frozen=True)
class _FromOwnSamples(Stage):
    """A stage that learns from the starting model's samples: ``n_prompts`` prompts of
    :func:`preference_examples` (the recipe's seed), :meth:`build` turning them into rows and a
    loss, then the plain loop over those rows."""

    def rows(self, recipe: Recipe) -> Batch:
        raise ValueError(f"{type(self).__name__} builds its rows from the starting model's "
                         "samples, so they cannot "
                         "be listed beforehand: give the stage its steps in the task's plan")

    def build(self, model: nn.Module, tok, task: Task, examples: list[Example],
              recipe: Recipe) -> tuple[Batch, Loss]:
        """The rows to train on and the loss, from ``model``, the starting model."""
        raise NotImplementedError(f"{type(self).__name__} must define build(...)")

    def fit(self, recipe: Recipe, model: nn.Module, device: torch.device, dtype: torch.dtype,
            checkpoints: str) -> History:
        """Sample from ``model`` (the parent's weights, before any step) and build the rows, then
        train on them.

        The rows are built before :func:`~halluc_lab.training.train.train` loads a checkpoint, so a
        resumed run builds the same rows from the same starting model and goes on from its last
        checkpoint."""
        task = make_task(recipe.task)
        examples = preference_examples(task, self.n_prompts, seed=recipe.seed)
        rows, loss = self.build(model, task.tokenizer(), task, examples, recipe)
        if rows.input_ids.shape[0] < recipe.batch_size:
            raise ValueError(f"{type(self).__name__}: the starting model's samples gave "
                             f"{rows.input_ids.shape[0]} "
                             f"rows, fewer than batch_size={recipe.batch_size}: draw more "
                             "prompts or samples")
        data = batches(rows.to(device), recipe.batch_size, recipe.seed)
        return train(model, data, recipe.train, checkpoint_dir=checkpoints, resume=True, loss=loss,
                     autocast_dtype=dtype, desc=recipe.name)


@dataclass(frozen=True)
class DPO(_FromOwnSamples):
    """DPO on pairs of the starting model's samples ranked by the task's verifier, with a share of
    the labels flipped (chapter 9). A pair row is as long as the longest pair; ``recipe.seq_len``
    does not apply."""

    n_prompts: int  # prompts drawn by preference_examples (with the recipe's seed)
    samples: int = 4  # G completions per prompt, ranked by the verifier
    beta: float = 0.1  # β of the DPO loss
    flip_rate: float = 0.0  # share of preference labels the annotator flips
    pairs_per_prompt: int = 1  # pairs drawn from each prompt's ranked samples

    def __post_init__(self):
        check_count("n_prompts", self.n_prompts, 1)
        check_count("samples", self.samples, 2)
        check_count("pairs_per_prompt", self.pairs_per_prompt, 1)
        check_rate("flip_rate", self.flip_rate)
        check_positive("beta", self.beta)

    def build(self, model, tok, task, examples, recipe) -> tuple[Batch, Loss]:
        groups = sample_groups(model, tok, task, examples, self.samples, seed=recipe.seed)
        pairs = build_pairs(groups, flip_rate=self.flip_rate,
                            pairs_per_prompt=self.pairs_per_prompt, seed=recipe.seed)
        pairs = precompute_reference_logps(model, pairs)  # the starting model is the reference
        return pairs.rows(), DPOLoss(self.beta, pairs.reference)


@dataclass(frozen=True)
class RSFT(_FromOwnSamples):
    """RSFT (001 §2): N samples per prompt from the starting model, keep one by the verifier's
    reward, SFT on it — the best (``beta=None``) or one drawn with probability softmax(R/β)
    (:func:`soft_best_of_n`).

    Its loss is next-token cross-entropy on the kept completions, packed in ``recipe.seq_len`` rows.
    """

    n_prompts: int  # prompts drawn by preference_examples (with the recipe's seed)
    samples: int = 8  # N completions per prompt
    beta: float | None = None  # None: best of N; a number: the soft rule's temperature β
    lam: float = 1.0  # the verifier's reward: +1 correct, 0 abstained, −λ wrong
    # drop a prompt whose pick scores below this (None: keep all, as 001 §2)
    min_reward: float | None = None

    def __post_init__(self):
        check_count("n_prompts", self.n_prompts, 1)
        check_count("samples", self.samples, 1)
        if self.beta is not None:
            check_positive("beta", self.beta)
        if not (isinstance(self.lam, (int, float)) and math.isfinite(self.lam) and self.lam >= 0):
            raise ValueError(f"lam must be a finite number >= 0, got {self.lam!r}")

    def build(self, model, tok, task, examples, recipe) -> tuple[Batch, Loss]:
        groups = sample_groups(model, tok, task, examples, self.samples, seed=recipe.seed,
                               lam=self.lam)
        picks = (best_of_n(groups.rewards) if self.beta is None
                 else soft_best_of_n(groups.rewards, self.beta,
                                     torch.Generator().manual_seed(recipe.seed)))
        return rsft_rows(groups, picks, recipe.seq_len, min_reward=self.min_reward), NextTokenLoss()


def own_error_sequences(tok, examples, completions, *, take_back: bool = True,
                        direct: bool = False) -> list:
    """Chapter 10's own-errors SFT data: each sampled answer (``completions[i]``: the answers to
    ``examples[i]``) as :func:`~halluc_lab.stages.sft.own_error_demonstration` makes it.

    In a take-back the gold token at the first error is a target only after the wrong token and
    ``<bksp>``, a state greedy decoding rarely reaches, while the control (``take_back=False``)
    makes it a direct target. ``direct=True`` adds, after each take-back, the clean example of the
    same answer, so the gold token is also a direct target, as in the control: the take-back arm
    then differs from the control by the take-backs alone, not by where the labels sit.
    """
    if direct and not take_back:
        raise ValueError(
            "direct=True adds clean examples beside take-backs; take_back must be True"
        )
    seqs = []
    for ex, answers in zip(examples, completions, strict=True):
        for completion in answers:
            demo = own_error_demonstration(tok, ex, completion, take_back=take_back)
            seqs.append(demo)
            if direct and tok.bksp_id in demo.ids:
                seqs.append(own_error_demonstration(tok, ex, completion, take_back=False))
    return seqs


@dataclass(frozen=True)
class OwnErrorsSFT(_FromOwnSamples):
    """Backspace SFT on the starting model's own errors (chapter 10, DAgger-style): ``samples``
    answers per prompt at τ = 1, each turned by :func:`own_error_sequences` into its prefix up to
    its first wrong symbol, ``<bksp>`` and the gold answer from there (a right answer: the clean
    example), packed in ``recipe.seq_len`` rows; the loss is the stage default, next-token
    cross-entropy on the targets."""

    n_prompts: int  # prompts drawn by preference_examples (with the recipe's seed)
    samples: int = 2  # answers sampled per prompt
    # False: the gold answers alone, no <bksp> (the control for what the correction tells)
    take_back: bool = True
    # True: each take-back also as its clean example (the gold token a direct target too)
    direct: bool = False

    def __post_init__(self):
        check_count("n_prompts", self.n_prompts, 1)
        check_count("samples", self.samples, 1)
        for name in ("take_back", "direct"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.direct and not self.take_back:
            raise ValueError(
                "direct=True adds clean examples beside take-backs; take_back must be True"
            )

    def build(self, model, tok, task, examples, recipe) -> tuple[Batch, Loss]:
        groups = sample_groups(model, tok, task, examples, self.samples, seed=recipe.seed)
        seqs = own_error_sequences(tok, examples, groups.completions, take_back=self.take_back,
                                   direct=self.direct)
        return pack(seqs, recipe.seq_len, tok.pad_id), NextTokenLoss()
