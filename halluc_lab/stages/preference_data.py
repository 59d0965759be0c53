"""Preference data: the policy's own samples ranked by an annotator, and pairs as packed rows.

Chapter 9. Sources: 001 Part 2 §1.A (annotators rank model completions), 004 §9.1.1 (InstructGPT's
comparisons); 001 Part 4 §2 (raters who prefer being agreed with). The reward model that learns
from these pairs is :mod:`halluc_lab.stages.reward_model`; :mod:`halluc_lab.stages.preference`,
which trains policies on them, re-exports these names.

**The annotator.** In the lab the person who ranks completions is the task's verifier: the policy
samples G answers per prompt (:func:`sample_groups`, one prefill per prompt through the engine), the
verifier scores them (:func:`~halluc_lab.evaluation.evaluate.score_answers`:
correct ≻ abstained ≻ wrong), pairs with different scores become preferences (ties are dropped) and
a seeded share of the labels is flipped (:func:`rank_pairs`, :func:`build_pairs`) — a noisy
annotator whose noise is known. A learned reward can then be compared with the gold reward it only
approximates (:func:`reward_correlation`). :mod:`halluc_lab.stages.preference`, which trains
policies on these pairs, re-exports these names.

**Pairs in a batch.** A pair is one row of a :class:`~halluc_lab.training.data.Batch`, packed:
``<bos> prompt chosen`` then ``<bos> prompt rejected`` then padding (:func:`pair_rows`). The two
sequences are separate packed segments — pair ``i`` has segment ids ``2i + 1`` (chosen) and
``2i + 2`` (rejected), padding 0 — so the model computes each exactly as it would alone
(block-diagonal attention, positions restarting at 0), and labels mark the completion tokens. One
row per pair keeps a pair whole wherever rows go: :func:`~halluc_lab.training.data.batches` draws
rows in a seeded order, the loop splits a batch into micro-batches by rows, and a step captured as a
CUDA graph copies the batch's tensors and nothing else; the global segment numbers tell a loss which
pair a row holds (:func:`pair_index`, what DPO's precomputed reference log-probs are looked up by).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from halluc_lab.training.data import IGNORE, Batch
from halluc_lab.generation.engine import generate
from halluc_lab.evaluation.evaluate import answer_budget, model_device, score_answers
from halluc_lab.tasks.base import Example, Task, check_count
from halluc_lab.model.tokenizer import Tokenizer

CHUNK = 512  # rows per engine call or forward pass

__all__ = ["AgreeableAnnotator", "pair_rows", "pair_masks", "pair_index", "pair_ends",
           "SampleGroups", "sample_groups", "rank_pairs", "PreferencePairs", "build_pairs",
           "check_rate"]


def check_rate(name: str, value: float) -> None:
    """ValueError unless ``value`` is a number in [0, 1] (a flip rate, an acceptance threshold)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")


# -- pairs as packed rows --------------------------------------------------------------------------
def check_ids(name: str, seqs: Sequence[Sequence[int]]) -> None:
    for i, s in enumerate(seqs):
        if len(s) == 0 or not all(isinstance(t, int) and not isinstance(t, bool) for t in s):
            raise ValueError(f"{name}[{i}] must be a non-empty sequence of int token ids, got "
                             f"{list(s)[:8]!r}")


def pair_rows(prompts: Sequence[Sequence[int]], chosen: Sequence[Sequence[int]],
              rejected: Sequence[Sequence[int]], pad_id: int) -> Batch:
    """One packed row per pair: ``prompt + chosen`` (segment 2i+1), ``prompt + rejected`` (segment
    2i+2), pads.

    ``prompts[i]`` are the ids the completions continue (``<bos>`` first), ``chosen[i]`` and
    ``rejected[i]`` the completions' ids; labels mark the completion tokens. Rows are right-padded
    to the longest pair.

    >>> b = pair_rows([[1, 5]], [[6, 2]], [[7, 2]], pad_id=0)
    >>> b.input_ids.tolist(), b.segment_ids.tolist(), b.labels.tolist()
    ([[1, 5, 6, 2, 1, 5, 7, 2]], [[1, 1, 1, 1, 2, 2, 2, 2]], [[-100, -100, 6, 2, -100, -100, 7, 2]])
    """
    if not (len(prompts) == len(chosen) == len(rejected)) or not prompts:
        raise ValueError(f"prompts, chosen and rejected must be non-empty and of one length, got "
                         f"{len(prompts)}, {len(chosen)} and {len(rejected)}")
    for name, seqs in (("prompts", prompts), ("chosen", chosen), ("rejected", rejected)):
        check_ids(name, seqs)
    rows = []
    for i, (p, c, r) in enumerate(zip(prompts, chosen, rejected)):
        ids = [*p, *c, *p, *r]
        labels = [IGNORE] * len(p) + list(c) + [IGNORE] * len(p) + list(r)
        segments = [2 * i + 1] * (len(p) + len(c)) + [2 * i + 2] * (len(p) + len(r))
        positions = [*range(len(p) + len(c)), *range(len(p) + len(r))]
        rows.append((ids, labels, segments, positions))
    T = max(len(ids) for ids, *_ in rows)
    fill = lambda x, v: x + [v] * (T - len(x))
    # (P, T)
    as_tensor = lambda k, v: torch.tensor([fill(row[k], v) for row in rows], dtype=torch.long)
    return Batch(as_tensor(0, pad_id), as_tensor(1, IGNORE), as_tensor(3, 0), as_tensor(2, 0))


def check_pairs(batch: Batch) -> None:
    if not isinstance(batch, Batch) or batch.segment_ids is None:
        raise ValueError("a pair batch is needed (reward_model.pair_rows: one pair per row, "
                         "segment ids 2i+1 and "
                         "2i+2), got " + (type(batch).__name__ if not isinstance(batch, Batch)
                                          else "no segment_ids"))


def pair_masks(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """The target tokens of the chosen and of the rejected completion: two bool ``(B, T-1)`` masks,
    aligned with :func:`~halluc_lab.training.losses.token_logprobs` (position t scores token
    t + 1)."""
    check_pairs(batch)
    seg, target = batch.segment_ids[:, 1:], batch.labels[:, 1:] != IGNORE  # (B, T-1)
    return target & (seg % 2 == 1), target & (seg % 2 == 0) & (seg > 0)


def pair_index(batch: Batch) -> torch.Tensor:
    """``(B,)``: which pair of the set each row holds (its chosen segment is 2i + 1)."""
    check_pairs(batch)
    return (batch.segment_ids[:, 0] - 1) // 2


def pair_ends(batch: Batch) -> torch.Tensor:
    """``(B, 2)``: the position of each row's last chosen and last rejected token."""
    check_pairs(batch)
    seg = batch.segment_ids  # (B, T)
    n_chosen = (seg % 2 == 1).sum(1)  # (B,)
    n_rejected = ((seg % 2 == 0) & (seg > 0)).sum(1)
    return torch.stack([n_chosen - 1, n_chosen + n_rejected - 1], dim=1)


# -- preference data: the policy's own samples, ranked by the verifier (the annotator) -------------
@dataclass(frozen=True, eq=False)
class SampleGroups:
    """G sampled completions of each prompt and the verifier's reward of each (prompt-major)."""

    prompts: tuple[tuple[int, ...], ...]  # (P) prompt ids, <bos> first
    # (P, G) generated ids, <eos> kept where a sample stopped
    completions: tuple[tuple[tuple[int, ...], ...], ...]
    rewards: torch.Tensor  # (P, G) float32 on the CPU: +1 correct, 0 abstained, −λ wrong
    pad_id: int  # the tokenizer's <pad>


def sample_groups(model: nn.Module, tok: Tokenizer, task: Task, examples: Sequence[Example],
                  n_samples: int, *, seed: int, lam: float = 1.0) -> SampleGroups:
    """``n_samples`` completions at τ = 1 of each prompt (one prefill per prompt, fanned out
    by the engine), each scored by the task's verifier through
    :func:`~halluc_lab.evaluation.evaluate.score_answers`: +1 correct, 0 abstained, −``lam`` wrong.
    Answers get :func:`~halluc_lab.evaluation.evaluate.answer_budget` tokens."""
    check_count("n_samples", n_samples, 1)
    budget = answer_budget(examples)
    prompts = tuple((tok.bos_id, *tok.encode(e.prompt)) for e in examples)
    g = torch.Generator(device=model_device(model)).manual_seed(seed)
    tokens: list[list[int]] = []
    was_training = model.training
    model.eval()
    try:
        step = max(1, CHUNK // n_samples)  # prompts per engine call
        for i in range(0, len(prompts), step):
            tokens += generate(model, prompts[i:i + step], budget, stop_tokens=(tok.eos_id,),
                               generator=g, n_samples=n_samples).token_lists()
    finally:
        model.train(was_training)
    texts = [tok.decode(t) for t in tokens]
    scores = score_answers(task, [e.prompt for e in examples for _ in range(n_samples)], texts)
    rewards = torch.tensor(scores.rewards(lam), dtype=torch.float32).view(len(prompts), n_samples)
    groups = tuple(tuple(tuple(t) for t in tokens[p * n_samples:(p + 1) * n_samples])
                   for p in range(len(prompts)))
    return SampleGroups(prompts, groups, rewards, tok.pad_id)


def rank_pairs(rewards: Sequence[Sequence[float]], keys: Sequence[Sequence] | None = None, *,
               flip_rate: float, generator: torch.Generator,
               pairs_per_prompt: int = 1) -> list[tuple[int, int, int, bool]]:
    """Preference pairs within each group, as ``(group, better, worse, flipped)``.

    Candidates are the sample pairs of a group whose rewards differ (ties are dropped), one per
    distinct ``(keys[better], keys[worse])`` (the completions' contents; default: the sample
    indices), in order; ``pairs_per_prompt`` of them are drawn without replacement. Each kept pair
    is then flipped with probability ``flip_rate`` (the noisy annotator): flipped, its worse sample
    is labelled the chosen one. ``generator``: a CPU generator; the draws depend only on it and the
    rewards.
    """
    check_rate("flip_rate", flip_rate)
    check_count("pairs_per_prompt", pairs_per_prompt, 1)
    out: list[tuple[int, int, int]] = []
    for g, rs in enumerate(rewards):
        rs = [float(r) for r in rs]
        if not rs:
            raise ValueError(f"rewards[{g}] is empty: every prompt needs at least one sample")
        if not all(math.isfinite(r) for r in rs):
            raise ValueError(f"rewards[{g}] must hold finite numbers, got {rs}")
        ks = range(len(rs)) if keys is None else keys[g]
        found: dict = {}
        for i in range(len(rs)):
            for j in range(i + 1, len(rs)):
                if rs[i] != rs[j]:
                    hi, lo = (i, j) if rs[i] > rs[j] else (j, i)
                    found.setdefault((ks[hi], ks[lo]), (hi, lo))
        pick = torch.randperm(len(found),
                              generator=generator)[:pairs_per_prompt].sort().values.tolist()
        candidates = list(found.values())
        out += [(g, *candidates[k]) for k in pick]
    # rand < 1 always: rate 1 flips all
    flips = (torch.rand(len(out), generator=generator) < flip_rate).tolist()
    return [(g, hi, lo, f) for (g, hi, lo), f in zip(out, flips)]


@dataclass(frozen=True, eq=False)
class PreferencePairs:
    """Preference pairs as the (noisy) annotator labelled them, with the verifier's verdict
    beside."""

    prompts: tuple[tuple[int, ...], ...]  # (P) prompt ids, <bos> first
    chosen: tuple[tuple[int, ...], ...]  # the completion the annotator preferred
    rejected: tuple[tuple[int, ...], ...]  # the other one
    gold: tuple[bool, ...]  # True where the label agrees with the verifier (False: a flipped label)
    pad_id: int  # the tokenizer's <pad>
    # (P, 2) log π_ref(chosen|x), log π_ref(rejected|x), or None
    reference: torch.Tensor | None = None

    def __post_init__(self):
        n = len(self.prompts)
        if n == 0 or not (len(self.chosen) == len(self.rejected) == len(self.gold) == n):
            raise ValueError("prompts, chosen, rejected and gold must be non-empty and of one "
                             f"length, got {n}, "
                             f"{len(self.chosen)}, {len(self.rejected)} and {len(self.gold)}")
        if self.reference is not None and tuple(self.reference.shape) != (n, 2):
            raise ValueError(f"reference must have shape ({n}, 2), got "
                             f"{tuple(self.reference.shape)}")

    def __len__(self) -> int:
        return len(self.prompts)

    def rows(self) -> Batch:
        """The pairs as packed rows, pair i in row i
        (:func:`~halluc_lab.stages.reward_model.pair_rows`)."""
        return pair_rows(self.prompts, self.chosen, self.rejected, self.pad_id)

    def as_gold(self) -> PreferencePairs:
        """The same pairs labelled by the verifier: flipped ones swapped back (their reference
        columns too)."""
        swap = lambda a, b: tuple(x if ok else y for x, y, ok in zip(a, b, self.gold))
        ref = None if self.reference is None else torch.where(
            torch.tensor(self.gold, device=self.reference.device)[:, None], self.reference,
            self.reference.flip(1))
        return PreferencePairs(self.prompts, swap(self.chosen, self.rejected),
                               swap(self.rejected, self.chosen), (True,) * len(self), self.pad_id,
                               ref)


def build_pairs(groups: SampleGroups, *, flip_rate: float = 0.0, pairs_per_prompt: int = 1,
                seed: int = 0) -> PreferencePairs:
    """Pairs from each group's samples, ranked by their verifier rewards
    (correct ≻ abstained ≻ wrong, ties dropped), a ``flip_rate`` share of labels flipped by an
    annotator seeded with ``seed`` (:func:`rank_pairs`)."""
    ranked = rank_pairs(groups.rewards.tolist(), groups.completions, flip_rate=flip_rate,
                        generator=torch.Generator().manual_seed(seed),
                        pairs_per_prompt=pairs_per_prompt)
    if not ranked:
        raise ValueError("every group's samples tie: there is no preference to learn from (more "
                         "samples, or a "
                         "higher temperature, give the verifier something to rank)")
    pick = lambda p, i: groups.completions[p][i]
    return PreferencePairs(tuple(groups.prompts[p] for p, *_ in ranked),
                           tuple(pick(p, lo if f else hi) for p, hi, lo, f in ranked),
                           tuple(pick(p, hi if f else lo) for p, hi, lo, f in ranked),
                           tuple(not f for *_, f in ranked), groups.pad_id)


@dataclass(frozen=True)
class AgreeableAnnotator:
    """Raters who like being agreed with (001 Part 4 §2: raters "prefer responses that
    are … validating"). They rank by the verifier's reward plus ``bonus`` for an answer that repeats
    the user's stated number, right or wrong (the task's ``agrees``,
    :mod:`halluc_lab.tasks.sycophancy`): with +1 / 0 / −1 and ``bonus`` = 2.5, agreeing with a wrong
    statement (−1 + 2.5) beats the right sum (+1); elsewhere the ranking is the verifier's."""

    bonus: float = 2.5  # added to the rank of an answer that repeats the user's stated number

    def __post_init__(self):
        if isinstance(self.bonus, bool) or not isinstance(self.bonus, (int, float)) or not (
                math.isfinite(self.bonus) and self.bonus > 0):
            raise ValueError(f"bonus must be a positive finite number, got {self.bonus!r}")

    def rerank(self, groups: SampleGroups, task: Task, tok: Tokenizer) -> SampleGroups:
        """``groups`` with each sample's rank raised by ``bonus`` where it agrees with the prompt's
        statement."""
        if not callable(getattr(task, "agrees", None)):
            raise TypeError("an agreeable annotator needs a task whose prompts state an answer "
                            "(an ``agrees`` "
                            f"method, as Sycophancy has), got {type(task).__name__}")
        prompts = [tok.decode(p[1:]) for p in groups.prompts]  # <bos> dropped
        agree = torch.tensor([[task.agrees(x, tok.decode(c)) for c in cs]
                              for x, cs in zip(prompts, groups.completions)],
                             dtype=torch.float32)
        return dataclasses.replace(groups, rewards=groups.rewards + self.bonus * agree)
