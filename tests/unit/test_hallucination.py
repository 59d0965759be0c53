"""halluc_lab.evaluation.hallucination: 001's V, H and Hall, the singleton rate, rates by training count."""

from __future__ import annotations

import math

import pytest

from halluc_lab.evaluation.hallucination import (COUNT_BUCKETS, hallucination_indicator, hallucination_interval,
                                      hallucination_rate, is_hallucination, least_seen, per_prompt_rates,
                                      rate_by_training_count, singleton_bound, singleton_rate,
                                      singleton_share, verifier_score)
from halluc_lab.evaluation.scoring import AnswerScores, score_answers
from halluc_lab.evaluation.stats import wilson
from halluc_lab.tasks.base import Claim
from halluc_lab.tasks.kb_walk import KBWalk, KBWalkConfig


# -- V(c) and H(y) ------------------------------------------------------------------------------------
def test_verifier_scores_supported_one_false_zero_abstention_none():
    assert [verifier_score(s) for s in ("supported", "contradicted", "unsupported", "malformed", "abstained")] \
        == [1.0, 0.0, 0.0, 0.0, None]
    assert verifier_score(Claim(0, 2, "r1 e1", "supported", True)) == 1.0


def test_indicator_is_one_when_any_stated_claim_is_false_and_ignores_abstentions():
    assert hallucination_indicator(["supported", "supported"]) == 0.0
    assert hallucination_indicator(["supported", "unsupported", "supported"]) == 1.0
    assert hallucination_indicator(["supported", "abstained"]) == 0.0
    assert hallucination_indicator([]) == 0.0  # nothing claimed: the empty conjunction is true


def test_indicator_on_kb_walk_claims_matches_a_wrong_step():
    task = KBWalk(KBWalkConfig(n_entities=6, n_relations=2))
    ex = task.examples("train", 1, seed=0)[0]
    assert hallucination_indicator(task.claims(ex.prompt, ex.completion)) == 0.0
    gold = ex.completion.split()
    wrong_entity = next(e for e in task.entities if e != gold[0])
    bad = " ".join([wrong_entity] + gold[1:])  # first step names the wrong entity
    assert hallucination_indicator(task.claims(ex.prompt, bad)) == 1.0


# -- answers: Hall(θ) -------------------------------------------------------------------------------------
def test_is_hallucination_is_wrong_only():
    assert [is_hallucination(o) for o in ("correct", "wrong", "abstained")] == [False, True, False]


def test_rate_hand_computed_from_strings_and_from_answer_scores():
    outcomes = ["correct", "wrong", "abstained", "wrong", "wrong"]
    assert hallucination_rate(outcomes) == pytest.approx(0.6)
    scores = AnswerScores(tuple(f"p{i}" for i in range(5)), tuple(outcomes))
    assert hallucination_rate(scores) == pytest.approx(scores.hallucination_rate)
    assert hallucination_interval(scores) == wilson(3, 5)


def test_rate_from_score_answers_on_kb_walk():
    task = KBWalk(KBWalkConfig(n_entities=6, n_relations=2))
    ex = task.examples("train", 2, seed=0)
    scores = score_answers(task, [e.prompt for e in ex], [ex[0].completion, "<abstain>"])
    assert scores.outcomes[0] == "correct" and hallucination_rate(scores) == scores.wrong_rate


def test_several_samples_per_prompt_weigh_each_prompt_equally():
    nested = [["wrong", "correct", "wrong", "wrong"], ["correct"]]  # per prompt 0.75 and 0.0
    assert per_prompt_rates(nested) == [0.75, 0.0]
    assert hallucination_rate(nested) == pytest.approx(0.375)


@pytest.mark.parametrize("bad", [[], ["correct", "maybe"], [["wrong"], []], "wrong", [["wrong", "nope"]]])
def test_bad_outcomes_rejected(bad):
    with pytest.raises((ValueError, TypeError)):
        hallucination_rate(bad)


def test_unknown_outcome_rejected_by_is_hallucination():
    with pytest.raises(ValueError, match="outcome"):
        is_hallucination("hallucinated")


# -- singleton rate ----------------------------------------------------------------------------------------
def test_singleton_rate_is_good_turing_n1_over_n():
    counts = {"a": 1, "b": 1, "c": 1, "d": 2, "e": 5, "f": 0}  # N = 10 occurrences, N1 = 3
    assert singleton_rate(counts) == pytest.approx(0.3)
    assert singleton_share(counts) == pytest.approx(3 / 5)  # distinct facts seen: a..e


def test_singleton_rate_on_kb_walk_counts():
    task = KBWalk(KBWalkConfig(n_entities=12, n_relations=3))
    n1 = sum(c == 1 for c in task.counts.values())
    assert singleton_rate(task.counts) == pytest.approx(n1 / sum(task.counts.values()))


def test_singleton_bound_hand_computed():
    counts = {f"f{i}": 1 for i in range(50)} | {"common": 50}  # N = 100, sr = 0.5
    b = singleton_bound(counts, min_wrong_answers=40, miscalibration=0.1)
    assert b.singleton_rate == pytest.approx(0.5) and b.n == 100 and b.leading == pytest.approx(0.4)
    assert b.full == max(0.0, 0.5 - 2 / 40 - (35 + 6 * math.log(100)) / 10 - 0.1) == 0.0
    big = singleton_bound({"x": 10**5, **{i: 1 for i in range(10**5)}}, min_wrong_answers=10**6)  # sr = 0.5
    assert big.full == pytest.approx(0.5 - 2e-6 - (35 + 6 * math.log(2e5)) / math.sqrt(2e5))
    assert 0.25 < big.full < big.leading == 0.5


@pytest.mark.parametrize("counts", [{}, {"a": -1}, {"a": 0}, {"a": 1.5}, {"a": True}, [("a", 1)]])
def test_bad_counts_rejected(counts):
    with pytest.raises(ValueError, match="counts"):
        singleton_rate(counts)


@pytest.mark.parametrize("kw", [{"min_wrong_answers": 0}, {"min_wrong_answers": 2, "miscalibration": -0.1},
                                {"min_wrong_answers": 2, "miscalibration": math.nan}])
def test_bad_bound_arguments_rejected(kw):
    with pytest.raises(ValueError):
        singleton_bound({"a": 1}, **kw)


# -- rates by training count -------------------------------------------------------------------------------
def test_least_seen_takes_the_minimum_and_zero_for_missing_facts():
    assert least_seen({("e", "r"): 3, ("e", "s"): 100}, [("e", "r"), ("e", "s")]) == 3
    assert least_seen({("e", "r"): 3}, [("e", "r"), ("x", "r")]) == 0
    with pytest.raises(ValueError):
        least_seen({"a": 1}, [])


def test_bucketed_rates_and_wilson_intervals():
    outcomes = ["wrong", "wrong", "correct", "wrong", "abstained", "correct", "wrong", "correct"]
    counts = [0, 0, 1, 1, 1, 3, 7, 100]
    buckets = rate_by_training_count(outcomes, counts)
    assert [b.label for b in buckets] == list(COUNT_BUCKETS)
    assert [(b.n, b.hallucinated) for b in buckets] == [(2, 2), (3, 1), (0, 0), (1, 0), (2, 1)]
    assert buckets[0].rate == wilson(2, 2) and buckets[1].rate == wilson(1, 3) and buckets[2].rate is None
    assert buckets[4].rate.estimate == 0.5
    assert rate_by_training_count(outcomes, counts, confidence=0.9)[1].rate == wilson(1, 3, 0.9)


@pytest.mark.parametrize("outcomes, counts", [([], []), (["wrong"], [1, 2]), (["wrong"], [-1]),
                                              (["wrong"], [1.0]), (["oops"], [1])])
def test_bad_bucket_input_rejected(outcomes, counts):
    with pytest.raises(ValueError):
        rate_by_training_count(outcomes, counts)


def test_numpy_counts_are_accepted():
    import numpy as np

    assert singleton_rate({"a": np.int64(1), "b": np.int64(3)}) == pytest.approx(0.25)
    buckets = rate_by_training_count(["wrong", "correct"], np.array([1, 5]))
    assert [(b.n, b.hallucinated) for b in buckets] == [(0, 0), (1, 1), (0, 0), (0, 0), (1, 0)]
