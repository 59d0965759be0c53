"""Intervals and verdicts (halluc_lab.stats) against closed forms and scipy."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import binomtest, bootstrap

from halluc_lab.stats import Interval, bootstrap_mean, paired_difference, reliability, said, verdict, wilson


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 500), st.data(), st.sampled_from([0.8, 0.9, 0.95, 0.99]))
def test_wilson_matches_scipy(n, data, confidence):
    k = data.draw(st.integers(0, n))
    ours = wilson(k, n, confidence)
    ref = binomtest(k, n).proportion_ci(confidence_level=confidence, method="wilson")
    assert ours.estimate == k / n
    assert ours.low == pytest.approx(ref.low, abs=1e-12)
    assert ours.high == pytest.approx(ref.high, abs=1e-12)


def test_wilson_by_hand_and_at_the_edges():
    iv = wilson(8, 10)
    assert (round(iv.low, 4), round(iv.high, 4)) == (0.4902, 0.9433)
    zero = wilson(0, 20)
    assert zero.low == 0.0 and 0 < zero.high < 0.2  # the normal interval would collapse to [0, 0]


def test_bootstrap_mean_of_many_prompts_is_the_normal_interval():
    """For n = 4000 draws the mean's bootstrap interval is x̄ ± 1.96 s/√n (the central limit theorem)."""
    x = np.random.default_rng(1).normal(0.3, 1.0, 4000)
    iv = bootstrap_mean(x)
    half = 1.959964 * x.std(ddof=0) / math.sqrt(len(x))
    assert iv.estimate == pytest.approx(x.mean())
    assert iv.low == pytest.approx(x.mean() - half, abs=0.1 * half)
    assert iv.high == pytest.approx(x.mean() + half, abs=0.1 * half)


def test_paired_difference_agrees_with_scipy_paired_bootstrap():
    rng = np.random.default_rng(2)
    base = rng.random(300)
    a = (rng.random(300) < base).astype(float)
    b = (rng.random(300) < base * 0.8).astype(float)
    ours = paired_difference(a, b)
    ref = bootstrap((a, b), lambda x, y: np.mean(x - y), paired=True, vectorized=False, method="percentile",
                    n_resamples=10_000, random_state=0).confidence_interval
    width = ref.high - ref.low
    assert ours.low == pytest.approx(ref.low, abs=0.05 * width)
    assert ours.high == pytest.approx(ref.high, abs=0.05 * width)


def test_pairing_cancels_what_both_arms_share():
    """Two arms that differ by a constant 0.1 on every prompt: the paired interval is exactly 0.1."""
    a = np.random.default_rng(3).random(200)
    iv = paired_difference(a + 0.1, a)
    assert iv.low == pytest.approx(0.1) and iv.high == pytest.approx(0.1)


def test_seeds_widen_the_interval_when_they_disagree():
    rng = np.random.default_rng(4)
    prompts = rng.random(500)
    same = np.stack([prompts] * 3)
    spread = same + np.array([[-0.2], [0.0], [0.2]])
    assert (bootstrap_mean(spread).high - bootstrap_mean(spread).low) > \
        2 * (bootstrap_mean(same).high - bootstrap_mean(same).low)


def test_the_bootstrap_is_reproducible_from_its_seed():
    x = np.random.default_rng(5).random(100)
    assert bootstrap_mean(x, seed=7) == bootstrap_mean(x, seed=7)


@pytest.mark.parametrize("iv, expected", [(Interval(0.05, 0.01, 0.09), "A > B"), (Interval(-0.05, -0.09, -0.01), "A < B"),
                                          (Interval(0.01, -0.02, 0.04), "no difference between A and B resolved")])
def test_verdict_follows_the_interval(iv, expected):
    assert verdict(iv) == expected
    assert iv.excludes_zero == (expected != "no difference between A and B resolved")


@pytest.mark.parametrize("call, match", [
    (lambda: wilson(3, 2), "successes"), (lambda: wilson(1, 0), "n >= 1"), (lambda: wilson(1.0, 3), "int"),
    (lambda: wilson(1, 3, confidence=1.0), "confidence"), (lambda: bootstrap_mean([1.0]), "at least"),
    (lambda: bootstrap_mean([1.0, float("nan")]), "NaN"), (lambda: paired_difference([1, 0], [1, 0, 1]), "paired"),
    (lambda: bootstrap_mean([1, 0, 1], resamples=10), "resamples")])
def test_bad_input_is_rejected(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


# -- calibration: reliability bins and the expected calibration error -------------------------------------------
def test_ece_by_hand():
    # bins of width 0.5: [0.2, 0.4] right 1 of 2 (acc 0.5, conf 0.3); [0.8, 0.8, 1.0] right 2 of 3 (acc 2/3, conf 13/15)
    r = reliability([0.2, 0.4, 0.8, 0.8, 1.0], [True, False, True, False, True], bins=2)
    assert r.count.tolist() == [2, 3]
    assert r.confidence == pytest.approx([0.3, 13 / 15]) and r.accuracy == pytest.approx([0.5, 2 / 3])
    assert r.ece == pytest.approx((2 * 0.2 + 3 * (13 / 15 - 2 / 3)) / 5)
    assert r.overconfidence == pytest.approx((2 * -0.2 + 3 * (13 / 15 - 2 / 3)) / 5)


def test_a_calibrated_sampler_has_small_ece_and_a_constant_guess_has_large_ece():
    rng = np.random.default_rng(0)
    conf = rng.uniform(size=200_000)
    calibrated = reliability(conf, rng.uniform(size=conf.size) < conf, bins=10)
    assert calibrated.ece < 0.01
    assert np.nanmax(np.abs(calibrated.accuracy - calibrated.confidence)) < 0.01
    overconfident = reliability(np.full(1000, 0.9), np.arange(1000) < 500, bins=10)
    assert overconfident.ece == pytest.approx(0.4) and overconfident.overconfidence == pytest.approx(0.4)
    assert overconfident.count.sum() == 1000 and np.isnan(overconfident.accuracy[0])  # empty bins stay NaN


@pytest.mark.parametrize("conf, right, bins, match", [
    ([], [], 10, "non-empty"), ([0.5, 0.5], [1], 10, "one length"), ([1.5], [1], 10, r"\[0, 1\]"),
    ([0.5], [2], 10, "0/1"), ([0.5], [1], 0, "bins")])
def test_reliability_rejects_bad_input(conf, right, bins, match):
    with pytest.raises(ValueError, match=match):
        reliability(conf, right, bins=bins)


@pytest.mark.parametrize("iv, words", [
    (Interval(0.05, 0.01, 0.09), "RL has a higher reward than SFT (+0.050 [+0.010, +0.090])"),
    (Interval(-0.05, -0.09, -0.01), "RL has a lower reward than SFT (-0.050 [-0.090, -0.010])"),
    (Interval(0.05, -0.01, 0.11), "no difference in reward between RL and SFT is resolved (+0.050 [-0.010, +0.110])"),
    (Interval(0.0, 0.0, 0.0), "no difference in reward between RL and SFT is resolved (+0.000 [+0.000, +0.000])"),
])
def test_said_follows_the_interval_whichever_way_the_numbers_go(iv, words):
    assert said(iv, "RL", "SFT", "reward") == words


def test_said_turns_with_planted_numbers_that_go_the_other_way():
    up = paired_difference(np.array([0.9] * 50 + [0.8] * 50), np.array([0.5] * 100), resamples=500)
    down = paired_difference(np.array([0.5] * 100), np.array([0.9] * 50 + [0.8] * 50), resamples=500)
    assert "higher" in said(up, "A", "B", "score") and "lower" in said(down, "A", "B", "score")
    assert said(up, "A", "B", "score") != said(down, "A", "B", "score").replace("lower", "higher")  # signs differ too


def test_said_formats_the_interval_as_asked():
    assert said(Interval(0.0009, 0.0004, 0.0014), "A", "B", "rate", spec="+.4f") == \
        "A has a higher rate than B (+0.0009 [+0.0004, +0.0014])"


def test_an_increasing_map_carries_the_interval_and_its_coverage():
    losses = np.random.default_rng(0).normal(1.0, 0.3, size=(3, 400))  # (seeds, rows) of mean log-losses
    iv = bootstrap_mean(losses, resamples=500)
    ppl = iv.map(math.exp)
    assert (ppl.estimate, ppl.low, ppl.high) == (math.exp(iv.estimate), math.exp(iv.low), math.exp(iv.high))
    assert ppl.low <= ppl.estimate <= ppl.high and ppl.confidence == iv.confidence
    # coverage carries over: θ lies in the interval exactly when exp θ lies in the mapped one
    for theta in (iv.low - 1e-3, iv.estimate, iv.high + 1e-3):
        assert (iv.low <= theta <= iv.high) == (ppl.low <= math.exp(theta) <= ppl.high)
