"""Hallucination defined and counted: 001's V(c), H(y) and Hall(θ) on the lab's verifier, the
singleton rate of Kalai et al. (2025), and the hallucination rate by how often a fact was seen in
training.

Chapter 11. Sources: 001 Part 3 §2 (the verifier V(c) ∈ [0, 1], the indicator H(y) = 1 − V(c(y)),
the rate Hall(θ*) = E_x E_y H(y)); Kalai, Nachum, Vempala & Zhang (2025), "Why language models
hallucinate" (the singleton rate, §3.3.1); Good (1953), the missing mass. Pure functions: no model
runs here.

Two levels, both on the task's own verifier:

- **Answers** (what chapter 11 reports): each is ``correct``, ``wrong`` or ``abstained``
  (:func:`halluc_lab. scoring.score_answers`); it hallucinates when ``wrong``.
  :func:`hallucination_rate` is Hall(θ) from an ``AnswerScores``, outcome strings, or several
  samples per prompt (001's E over y ~ π(·|x)).
- **Claims** (001's V and H literally): :func:`verifier_score` is V(c),
  :func:`hallucination_indicator` H(y).

The singleton rate (Kalai et al. §3.3.1; Kalai & Vempala 2024's monofact rate): of the N training
examples, the share whose fact occurs exactly once, sr = N₁/N, the Good–Turing estimate of the mass
of facts training never showed. Their Theorem 2 ("arbitrary facts": answers with no pattern to
learn) says, as we read it, that with probability ≥ 99% over the training data any algorithm's error
rate obeys

    err ≥ sr − 2 / min_c |E_c| − (35 + 6 ln N) / √N − δ,

|E_c| the plausible wrong answers to prompt c, δ the model's miscalibration: a *calibrated* base
model (δ ≈ 0) errs on at least about sr of such prompts. Caveats: the error is on prompts drawn like
the training data (kb_walk's chains are not: its sr, weighted by the 100-fold common facts, is
small); a miscalibrated model (one post-trained to abstain) escapes it; it is a lower bound, not a
prediction; at the lab's scale its finite-sample terms are vacuous (N = 10⁴: (35 + 6 ln
N)/√N ≈ 0.90), so :func:`singleton_bound` gives the leading term sr − δ beside the full bound. The
constants are as we read the paper: check them there before quoting. The chapter *measures* whether
hallucination tracks training frequency (:func:`rate_by_training_count`); it does not assume the
bound holds.

Where the code departs from the documents:

- 001 writes c(y) for "the claim(s)" of a completion without saying how several claims combine. Here
  c(y) is their conjunction: V(c(y)) = Π V(c_i), so with the lab's 0/1 verifier H(y) = 1 exactly
  when some stated claim is false (one false step makes the answer false); a probabilistic V's
  claims are taken as independent. The other reading, the share of false claims, is not "the answer
  hallucinated".
- 001's V scores claims; an abstention claims nothing, so abstained claims are left out of c(y), and
  a completion that claims nothing has H = 0 (the empty conjunction is true). A malformed step (not
  a well-formed claim) is scored V = 0: it is not supported, and the answer-level verifier counts it
  wrong.
- At the answer level ``wrong`` also covers an answer that stops short without abstaining: H(y) = 0
  on its claims (nothing false said), yet it counts as a hallucination (ARCHITECTURE.md §8). Chapter
  11 reports the answer level; the claim level shows 001's definition on the same completions.
- The singleton rate counts training *occurrences* (N = Σ counts), as Kalai et al. and Good–Turing
  do, not distinct facts; :func:`singleton_share` gives the other number (facts seen once / facts
  seen).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from numbers import Integral, Real

from halluc_lab.evaluation.scoring import ABSTAINED, OUTCOMES, WRONG, AnswerScores
from halluc_lab.evaluation.stats import CONFIDENCE, Interval, wilson
from halluc_lab.tasks.base import CONTRADICTED, MALFORMED, SUPPORTED, UNSUPPORTED, Claim

__all__ = ["verifier_score", "hallucination_indicator", "is_hallucination", "hallucination_rate",
           "per_prompt_rates", "hallucination_interval", "singleton_rate", "singleton_share",
           "SingletonBound", "singleton_bound", "least_seen", "COUNT_BUCKETS", "CountBucket",
           "rate_by_training_count"]

# V(c) per claim status
_V = {SUPPORTED: 1.0, CONTRADICTED: 0.0, UNSUPPORTED: 0.0, MALFORMED: 0.0, ABSTAINED: None}


# -- 001's V(c) and H(y), on the task's claims ----------------------------------------------------
def verifier_score(claim: Claim | str) -> float | None:
    """V(c) of one claim (a :class:`~halluc_lab.tasks.base.Claim` or its status): 1.0 supported, 0.0
    contradicted, unsupported or malformed, ``None`` for an abstention (not a factual claim).

    >>> verifier_score("supported"), verifier_score("unsupported"), verifier_score("abstained")
    (1.0, 0.0, None)
    """
    status = claim.status if isinstance(claim, Claim) else claim
    if not isinstance(status, str) or status not in _V:
        raise ValueError(f"claim status must be one of {sorted(_V)}, got {status!r}")
    return _V[status]


def hallucination_indicator(claims: Iterable[Claim | str]) -> float:
    """H(y) = 1 − V(c(y)) for the claims of one completion, c(y) their conjunction (abstentions left
    out): 1.0 when some stated claim is false, 0.0 when all are supported or none was stated.

    >>> (hallucination_indicator(["supported", "contradicted"]),
    ...  hallucination_indicator(["abstained"]))
    (1.0, 0.0)
    """
    if isinstance(claims, (str, Claim)):
        raise TypeError("claims must be a sequence of claims or statuses (one completion's), "
                        "not one claim")
    return 1.0 - math.prod(1.0 if (v := verifier_score(c)) is None else v for c in claims)


# -- answers: Hall(θ) over a prompt set ------------------------------------------------------------
def _outcomes(outcomes: AnswerScores | Sequence[str], name: str = "outcomes") -> tuple[str, ...]:
    out = outcomes.outcomes if isinstance(outcomes, AnswerScores) else outcomes
    if isinstance(out, str) or not isinstance(out, Sequence):
        raise TypeError(f"{name} must be an AnswerScores or a sequence of outcome strings, got "
                        f"{type(out).__name__}")
    if len(out) == 0:
        raise ValueError(f"{name} must hold at least one outcome")
    if bad := {o for o in out if not isinstance(o, str) or o not in OUTCOMES}:
        raise ValueError(f"{name} must be in {OUTCOMES}, got {sorted(map(repr, bad))}")
    return tuple(out)


def is_hallucination(outcome: str) -> bool:
    """Whether one answer hallucinated: it is ``wrong`` (an abstention is not).

    >>> is_hallucination("wrong"), is_hallucination("abstained")
    (True, False)
    """
    return _outcomes([outcome], "outcome")[0] == WRONG


def per_prompt_rates(outcomes: AnswerScores | Sequence[str] | Sequence[Sequence[str]]
                     ) -> list[float]:
    """Per prompt, the share of its sampled answers that hallucinated: E_{y~π(·|x)} H(y) estimated.
    A flat sequence is one answer per prompt; a sequence of sequences is several samples per prompt
    (what :func:`halluc_lab.evaluation.stats.bootstrap_mean` takes for an interval)."""
    if isinstance(outcomes, AnswerScores) or (isinstance(outcomes, Sequence) and outcomes
                                              and all(isinstance(o, str) for o in outcomes)):
        return [float(o == WRONG) for o in _outcomes(outcomes)]
    if isinstance(outcomes, str) or not isinstance(outcomes, Sequence) or len(outcomes) == 0:
        raise ValueError("outcomes must be a non-empty sequence of outcomes, or of per-prompt "
                         "sequences of them")
    return [(s := _outcomes(x, f"outcomes[{i}]")).count(WRONG) / len(s)
            for i, x in enumerate(outcomes)]


def hallucination_rate(outcomes: AnswerScores | Sequence[str] | Sequence[Sequence[str]]) -> float:
    """Hall(θ) = E_x E_{y~π(·|x)} H(y): the mean over prompts of :func:`per_prompt_rates` (each
    prompt weighs the same however many samples it has).

    >>> hallucination_rate(["correct", "wrong", "abstained", "wrong"])
    0.5
    >>> hallucination_rate([["wrong", "correct"], ["correct"]])
    0.25
    """
    rates = per_prompt_rates(outcomes)
    return sum(rates) / len(rates)


def hallucination_interval(outcomes: AnswerScores | Sequence[str],
                           confidence: float = CONFIDENCE) -> Interval:
    """Hall(θ) with its Wilson interval, for one answer per prompt (answers independent); for
    several samples per prompt, bootstrap :func:`per_prompt_rates` over prompts instead."""
    out = _outcomes(outcomes)
    return wilson(out.count(WRONG), len(out), confidence)


# -- the singleton rate (Kalai et al. 2025) --------------------------------------------------------
def _counts(counts: Mapping[Hashable, int]) -> dict[Hashable, int]:  # checked: ints >= 0, some > 0
    if not isinstance(counts, Mapping) or len(counts) == 0:
        raise ValueError("counts must be a non-empty mapping fact -> training count")
    for fact, c in counts.items():
        if isinstance(c, bool) or not isinstance(c, Integral) or c < 0:
            raise ValueError(f"counts must be ints >= 0, got {c!r} for {fact!r}")
    if sum(counts.values()) == 0:
        raise ValueError("counts must hold at least one fact seen in training (all counts are 0)")
    return dict(counts)


def singleton_rate(counts: Mapping[Hashable, int]) -> float:
    """sr = N₁ / N: training examples whose fact occurs exactly once, over all N = Σ counts training
    examples — the Good–Turing estimate of the missing mass. ``KBWalk.counts`` is such a mapping.

    >>> singleton_rate({"a": 1, "b": 1, "c": 3, "d": 0})  # N = 5, two singletons
    0.4
    """
    return (c := list(_counts(counts).values())).count(1) / sum(c)


def singleton_share(counts: Mapping[Hashable, int]) -> float:
    """Facts seen exactly once, over facts seen at least once (not the Good–Turing estimate).

    >>> singleton_share({"a": 1, "b": 1, "c": 3, "d": 0})
    0.6666666666666666
    """
    return (c := list(_counts(counts).values())).count(1) / sum(v > 0 for v in c)


@dataclass(frozen=True)
class SingletonBound:
    """Kalai et al.'s Theorem 2 for one training set (see the module docstring)."""

    singleton_rate: float  # sr = N₁/N
    n: int  # N, training examples
    leading: float  # sr − δ: the bound as N and the wrong answers per prompt grow
    full: float  # sr − 2/min|E_c| − (35 + 6 ln N)/√N − δ, floored at 0 (holds w.p. ≥ 99%)


def singleton_bound(counts: Mapping[Hashable, int], min_wrong_answers: int,
                    miscalibration: float = 0.0) -> SingletonBound:
    """The lower bound on an arbitrary-facts error rate from the singleton rate;
    ``min_wrong_answers`` is min_c |E_c| (in kb_walk, the entities a step could wrongly name),
    ``miscalibration`` is δ ≥ 0.

    >>> b = singleton_bound({"a": 1, "b": 4}, min_wrong_answers=4)
    >>> b.singleton_rate, b.leading, b.full
    (0.2, 0.2, 0.0)
    """
    if (isinstance(min_wrong_answers, bool) or not isinstance(min_wrong_answers, int)
            or min_wrong_answers < 1):
        raise ValueError(f"min_wrong_answers must be an int >= 1, got {min_wrong_answers!r}")
    if (isinstance(miscalibration, bool) or not isinstance(miscalibration, Real)
            or not 0 <= miscalibration < math.inf):
        raise ValueError(f"miscalibration must be a finite number >= 0, got {miscalibration!r}")
    checked = _counts(counts)
    n = sum(checked.values())
    sr = list(checked.values()).count(1) / n  # singleton_rate, without checking the counts twice
    full = sr - 2 / min_wrong_answers - (35 + 6 * math.log(n)) / math.sqrt(n) - miscalibration
    return SingletonBound(sr, n, max(0.0, sr - miscalibration), max(0.0, full))


# -- hallucination by training frequency -----------------------------------------------------------
COUNT_BUCKETS = ("0", "1", "2", "3", ">=4")  # how often the least-seen fact of a prompt was seen


def least_seen(counts: Mapping[Hashable, int], facts: Iterable[Hashable]) -> int:
    """The training count of the least-seen of ``facts`` (one prompt's chain); a fact missing from
    ``counts`` (a fact-less pair) counts 0.

    >>> least_seen({"a": 100, "b": 2}, ["a", "b"]), least_seen({"a": 100}, ["a", "z"])
    (2, 0)
    """
    if not (facts := list(facts)):
        raise ValueError("facts must hold at least one fact")
    return min(counts.get(f, 0) for f in facts)


@dataclass(frozen=True)
class CountBucket:
    """The prompts whose least-seen fact was seen this often in training."""

    label: str  # one of COUNT_BUCKETS
    n: int  # prompts in the bucket
    hallucinated: int  # of them, answered wrong
    rate: Interval | None  # hallucinated / n with its Wilson interval; None for an empty bucket


def rate_by_training_count(outcomes: AnswerScores | Sequence[str], min_counts: Iterable[int],
                           confidence: float = CONFIDENCE) -> tuple[CountBucket, ...]:
    """The hallucination rate per bucket of ``min_counts`` (per prompt, the training count of the
    least-seen fact on its chain): 0 (never seen), 1, 2, 3 and ≥ 4, each with a Wilson interval.

    >>> b = rate_by_training_count(["wrong", "correct", "wrong", "abstained"], [1, 1, 0, 100])
    >>> [(x.label, x.n, x.hallucinated) for x in b]
    [('0', 1, 1), ('1', 2, 1), ('2', 0, 0), ('3', 0, 0), ('>=4', 1, 0)]
    """
    out = _outcomes(outcomes)
    min_counts = [] if isinstance(min_counts, (str, Mapping)) else list(min_counts)
    if len(min_counts) != len(out):
        raise ValueError(f"min_counts must hold one count per outcome ({len(out)}), got "
                         f"{len(min_counts)}")
    if bad := [c for c in min_counts if isinstance(c, bool) or not isinstance(c, Integral)
               or c < 0]:
        raise ValueError(f"min_counts must be ints >= 0, got {bad[:5]!r}")
    tally = {label: [0, 0] for label in COUNT_BUCKETS}
    for o, c in zip(out, min_counts):
        t = tally[COUNT_BUCKETS[min(c, len(COUNT_BUCKETS) - 1)]]
        t[0], t[1] = t[0] + 1, t[1] + (o == WRONG)
    return tuple(CountBucket(label, n, k, wilson(k, n, confidence) if n else None)
                 for label, (n, k) in tally.items())
