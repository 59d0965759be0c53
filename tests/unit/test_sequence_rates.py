"""Rates by position in token sequences: the pooled rate with the sequences as units, the rates of
one resample, and two sets compared with one set's length mix."""

import math

import numpy as np
import pytest
import torch

from halluc_lab.evaluation import sequence_rates


def _sequences(seed: int, n: int, length: int, p_of_position, lengths=None):
    """(n, length) 0/1 events, P(event at t) = p_of_position(t), rows masked after their length."""
    g = torch.Generator().manual_seed(seed)
    p = torch.tensor([p_of_position(t) for t in range(length)], dtype=torch.float64)
    values = (torch.rand(n, length, generator=g, dtype=torch.float64) < p).double()
    lengths = torch.full((n,), length) if lengths is None else lengths
    return values, torch.arange(length)[None, :] < lengths[:, None]



def test_rate_and_se_is_the_pooled_rate_with_the_sequences_as_units():
    values = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 9.0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    rate, se = sequence_rates.rate_and_se(values, mask)
    assert rate == pytest.approx(2 / 5)
    sums, counts = np.array([2.0, 0.0]), np.array([3.0, 2.0])  # per sequence; the 9 is masked
    assert se == pytest.approx(math.sqrt(((sums - rate * counts) ** 2).sum()) / counts.sum())


def test_position_rates_counts_each_sequence_as_often_as_its_multiplicity():
    values = torch.tensor([[1.0, 1.0], [0.0, 5.0]])
    mask = torch.tensor([[True, True], [True, False]])
    counts = torch.tensor([[1.0, 1.0], [3.0, 1.0], [0.0, 2.0]], dtype=torch.float64)
    rates = sequence_rates.position_rates(values, mask, counts)
    assert rates[:2].tolist() == [[0.5, 1.0], [0.75, 1.0]]  # the masked 5 never counts
    assert rates[2, 0] == 0.0 and torch.isnan(rates[2, 1])  # no resampled sequence predicts there


def test_matched_difference_ignores_a_different_length_mix_that_pooling_would_count():
    rising = lambda t: 0.05 + 0.05 * t  # noqa: E731  the rate grows with the position
    b_values, b_mask = _sequences(0, 400, 8, rising, lengths=torch.full((400,), 3))  # short ones
    a_values, a_mask = _sequences(1, 400, 8, rising)  # the same source, read to the end
    rate = sequence_rates.rate_and_se
    pooled_gap = rate(a_values, a_mask)[0] - rate(b_values, b_mask)[0]
    m = sequence_rates.matched_difference(a_values, a_mask, b_values, b_mask, seed=0,
                                          resamples=400, min_per_position=30)
    assert pooled_gap > 0.1  # pooling over positions finds a gap that is only the length mix
    assert m.positions == 3 and [p for p, *_ in m.per_position] == [1, 2, 3]
    assert m.overall.low < 0 < m.overall.high and abs(m.overall.estimate) < 0.05
    shifted = sequence_rates.matched_difference(torch.clamp(a_values + 0.5, max=1.5), a_mask,
                                                b_values, b_mask, seed=0, resamples=400,
                                                min_per_position=30)
    assert shifted.overall.estimate == pytest.approx(m.overall.estimate + 0.5)
    assert shifted.overall.side == 1 and shifted.above == 3 and shifted.below == 0


def test_matched_difference_is_seeded_and_rejects_bad_input():
    values, mask = _sequences(2, 50, 4, lambda t: 0.3)
    run = lambda **kw: sequence_rates.matched_difference(values, mask, values, mask, **kw)  # noqa: E731
    settings_ = dict(seed=3, resamples=50, min_per_position=5)
    assert run(**settings_) == run(**settings_)
    with pytest.raises(ValueError, match="min_per_position"):
        run(seed=0, resamples=50, min_per_position=51)  # no position has 51 predictions
    with pytest.raises(ValueError, match="resamples"):
        run(seed=0, resamples=0, min_per_position=5)
    with pytest.raises(ValueError, match="bool mask"):
        sequence_rates.matched_difference(values, mask.double(), values, mask, seed=0, resamples=50,
                                 min_per_position=5)
    with pytest.raises(ValueError, match="bool mask"):
        sequence_rates.rate_and_se(values[:, :2], mask)
