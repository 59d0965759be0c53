"""Reward models: a scalar score for a prompt and completion, fit to pairwise preferences that the
task's verifier hands out (:mod:`halluc_lab.stages.preference_data`: the pairs, the annotators).

Chapter 9. Sources: 001 Part 2 §1.A (annotators rank model completions; a reward model R_φ is
trained from the comparisons, e.g. by Bradley–Terry); 004 §9.1.1–9.1.2 (InstructGPT's reward model;
P(y₁ ≻ y₂ | x) = σ(r(x, y₁) − r(x, y₂))).

**Rewards on token ids** (:data:`Reward`, what PPO maximises): :class:`VerifierReward`, the gold one
(+1 / 0 / −λ), and :class:`LearnedReward`, a trained reward model's score.

**The model.** :class:`RewardModel` is the lab's :class:`~halluc_lab.model.transformer.Transformer`
with its vocabulary head replaced by a scalar head ``nn.Linear(d, 1)``: the decoder's own forward
computes the final hidden state and the head turns it into a score, at the positions
``logits_to_keep`` names (the last token of a sequence; every position for a value model,
:mod:`halluc_lab.stages.preference`). :meth:`RewardModel.from_lm` starts it from a trained language
model, as InstructGPT does.

Departures: the score is read at the last token of the completion (its ``<eos>`` when it stopped),
as InstructGPT and Hugging Face's sequence classifiers do; the documents do not say where. Pair
accuracy counts a tie (r⁺ = r⁻) as wrong.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from scipy import stats
from torch import nn

from halluc_lab.training.data import IGNORE, Batch, Encoded, pad
from halluc_lab.evaluation.evaluate import score_answers
from halluc_lab.training.losses import bradley_terry_loss
from halluc_lab.model.config import ModelConfig
from halluc_lab.model.transformer import Transformer
from halluc_lab.tasks.base import Task
from halluc_lab.model.tokenizer import Tokenizer
from halluc_lab.stages.preference_data import (CHUNK,
                                               AgreeableAnnotator,  # noqa: F401 (re-exported)
                                               check_ids, check_pairs, pair_ends)

__all__ = ["RewardModel", "pair_rewards", "BradleyTerryLoss", "pair_accuracy", "score",
           "Correlation", "reward_correlation", "Reward", "VerifierReward", "LearnedReward"]


# -- the model -------------------------------------------------------------------------------------
class RewardModel(nn.Module):
    """``model(input_ids, position_ids, segment_ids, *, at) -> scores``: the decoder with a scalar
    head.

    ``at`` ``(B, K)`` or ``(K,)`` positions: scores ``(B, K)`` there; None: a score at every
    position, ``(B, T)`` (a value model). Example::

        rm = RewardModel.from_lm(sft_model)
        r = rm(ids, at=torch.tensor([[n - 1] for n in lengths]))[:, 0]  # (B,) a score per sequence
    """

    def __init__(self, config: ModelConfig, *, seed: int = 0) -> None:
        super().__init__()
        if not isinstance(config, ModelConfig):
            raise TypeError(f"config must be a ModelConfig, got {type(config).__name__}")
        # the embedding keeps its own weights
        self.config = dataclasses.replace(config, tie_embeddings=False)
        self.trunk = Transformer(self.config, seed=seed)
        # r = w·h + b in place of the vocabulary head
        self.trunk.lm_head = nn.Linear(config.hidden_size, 1)
        with torch.no_grad():
            g = torch.Generator().manual_seed(seed)
            self.trunk.lm_head.weight.copy_(torch.randn(1, config.hidden_size,
                                                        generator=g) * config.init_std)
            self.trunk.lm_head.bias.zero_()

    @classmethod
    def from_lm(cls, lm: Transformer, *, seed: int = 0) -> RewardModel:
        """A reward model whose trunk is a copy of ``lm``'s weights (on its device and dtype); a
        fresh head."""
        if not isinstance(lm, Transformer):
            raise TypeError(f"lm must be a model.Transformer, got {type(lm).__name__}")
        weight = lm.embed_tokens.weight
        rm = cls(lm.config, seed=seed).to(device=weight.device, dtype=weight.dtype)
        trunk = {k: v for k, v in lm.state_dict().items() if not k.startswith("lm_head.")}
        missing, unexpected = rm.trunk.load_state_dict(trunk, strict=False)
        if sorted(missing) != ["lm_head.bias", "lm_head.weight"] or unexpected:
            raise RuntimeError(f"copying the language model left {missing} missing and "
                               f"{unexpected} unexpected")
        return rm

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                segment_ids: torch.Tensor | None = None, *,
                at: torch.Tensor | None = None) -> torch.Tensor:
        # (B, K, 1)
        out = self.trunk(input_ids, position_ids, segment_ids,
                         logits_to_keep=0 if at is None else at)
        return out[..., 0]


def pair_rewards(model: RewardModel, batch: Batch) -> torch.Tensor:
    """``(B, 2)``: the scores of each row's chosen and rejected sequence (at their last tokens)."""
    return model(batch.input_ids, batch.position_ids, batch.segment_ids, at=pair_ends(batch))


@dataclass(frozen=True)
class BradleyTerryLoss:
    """``loss(model, batch) -> (summed loss, pairs)``: Bradley–Terry over a :func:`pair_rows` batch
    (004 §9.1.2), the loss callable :func:`halluc_lab.training.train.train` takes to fit a
    :class:`RewardModel`."""

    def __call__(self, model: RewardModel, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        r = pair_rewards(model, batch)  # (B, 2)
        return bradley_terry_loss(r[:, 0], r[:, 1],
                                  reduction="sum"), batch.input_ids.new_full((), r.shape[0])


@contextlib.contextmanager
def _scoring(model: nn.Module):
    """No gradients, eval mode for the block, then back to the mode it was in."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


def pair_accuracy(model: RewardModel, pairs: Batch, chunk: int = CHUNK) -> float:
    """Share of pairs whose chosen sequence scores strictly higher than the rejected one."""
    check_pairs(pairs)
    device = next(model.parameters()).device
    hits = 0
    with _scoring(model):
        for i in range(0, pairs.input_ids.shape[0], chunk):
            r = pair_rewards(model, pairs[i:i + chunk].to(device))  # (b, 2)
            hits += int((r[:, 0] > r[:, 1]).sum())
    return hits / pairs.input_ids.shape[0]


def score(model: RewardModel, prompts: Sequence[Sequence[int]],
          completions: Sequence[Sequence[int]], pad_id: int, chunk: int = CHUNK) -> torch.Tensor:
    """``(N,)`` float32 on the CPU: the score of each ``prompt + completion`` at its last token."""
    if len(prompts) != len(completions) or not prompts:
        raise ValueError("prompts and completions must be non-empty and of one length, got "
                         f"{len(prompts)} "
                         f"and {len(completions)}")
    check_ids("prompts", prompts)
    check_ids("completions", completions)
    device = next(model.parameters()).device
    out = []
    with _scoring(model):
        for i in range(0, len(prompts), chunk):
            seqs = [(*p, *c) for p, c in zip(prompts[i:i + chunk], completions[i:i + chunk])]
            # (b, T)
            ids = pad([Encoded(s, (IGNORE,) * len(s)) for s in seqs], pad_id).input_ids.to(device)
            last = torch.tensor([[len(s) - 1] for s in seqs], device=device)  # (b, 1)
            out.append(model(ids, at=last)[:, 0].float().cpu())
    return torch.cat(out)


@dataclass(frozen=True)
class Correlation:
    """How well a learned reward tracks the gold one, over ``n`` sequences."""

    pearson: float  # linear correlation of the scores with the gold rewards
    spearman: float  # rank correlation: what a ranking (best-of-N, pairs) depends on
    n: int  # sequences compared


def reward_correlation(model: RewardModel, prompts: Sequence[Sequence[int]],
                       completions: Sequence[Sequence[int]], gold: Sequence[float],
                       pad_id: int) -> Correlation:
    """Pearson and Spearman correlation of the model's scores with the verifier's ``gold``
    rewards."""
    if len(gold) != len(prompts) or len(gold) < 2:
        raise ValueError("gold must hold one reward per sequence and at least 2, got "
                         f"{len(gold)} for "
                         f"{len(prompts)} sequences")
    if not all(isinstance(g, (int, float)) and math.isfinite(g)
               for g in gold) or len(set(gold)) < 2:
        raise ValueError("gold must hold finite numbers that are not all equal (a correlation "
                         "with a constant "
                         "is undefined)")
    scores = score(model, prompts, completions, pad_id).double().numpy()
    if scores.min() == scores.max():
        raise ValueError("the model gives every sequence the same score: the correlation "
                         "is undefined")
    return Correlation(float(stats.pearsonr(scores, gold)[0]),
                       float(stats.spearmanr(scores, gold)[0]), len(gold))


# -- rewards on token ids: the gold one and a learned one (what PPO maximises) ---------------------
Reward = Callable[[list[list[int]], list[list[int]]], Sequence[float]]
"""``reward(prompt ids, completion ids) -> one float per completion``: what PPO maximises."""


@dataclass(frozen=True)
class VerifierReward:
    """The task's verifier as a :data:`Reward` on token ids: +1 correct, 0 abstained, −λ wrong,
    judged on the text the ``<bksp>`` tokens leave; minus ``bksp_cost`` per ``<bksp>`` (chapter 10:
    a take-back is not free).

    With λ, answering pays in expectation only when P(correct) > λ/(1 + λ): +1·p − λ(1 − p) > 0."""

    task: Task  # whose verifier judges
    tok: Tokenizer  # to turn ids back into the task's text
    lam: float = 1.0  # λ, the penalty of a wrong answer
    bksp_cost: float = 0.0  # subtracted once per <bksp> in the completion

    def __post_init__(self):
        for name in ("lam", "bksp_cost"):
            value = getattr(self, name)
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not (math.isfinite(value) and value >= 0)):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")

    def __call__(self, prompts: list[list[int]], completions: list[list[int]], **kw) -> list[float]:
        # G answers share a prompt
        decoded = {p: self.tok.decode(p[1:] if p[:1] == (self.tok.bos_id,) else p)
                   for p in dict.fromkeys(map(tuple, prompts))}
        texts = [decoded[tuple(p)] for p in prompts]
        rewards = score_answers(self.task, texts,
                                [self.tok.decode(c) for c in completions]).rewards(self.lam)
        if self.bksp_cost == 0:
            return list(rewards)
        return [r - self.bksp_cost * list(c).count(self.tok.bksp_id)
                for r, c in zip(rewards, completions)]


@dataclass(frozen=True, eq=False)
class LearnedReward:
    """A trained :class:`RewardModel` as a :data:`Reward`: its score of each
    ``prompt + completion``."""

    model: RewardModel  # the reward model (frozen while the policy trains)
    pad_id: int  # the tokenizer's <pad>

    def __call__(self, prompts: Sequence[Sequence[int]],
                 completions: Sequence[Sequence[int]]) -> list[float]:
        return score(self.model, prompts, completions, self.pad_id).tolist()
