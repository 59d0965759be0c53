"""Rates of an event by position in token sequences, with the sequences as the independent units.

Chapter 1 compares a model's error rate under teacher forcing with its rate when it runs free:
:func:`rate_and_se` pools a rate over sequences and gives its standard error (the ratio
estimator's, each sequence contributing its sum and its count); :func:`matched_difference`
compares two sets of sequences position by position and averages with one set's length mix, so
that the two sets' different lengths do not enter; its intervals bootstrap the sequences within
each set (:func:`position_rates`, the rates of one resample).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from halluc_lab.evaluation.stats import Interval, check_int


def _check_masked(values: torch.Tensor, mask: torch.Tensor, name: str) -> None:
    if values.shape != mask.shape or values.ndim != 2 or mask.dtype != torch.bool:
        raise ValueError(f"{name}: values and a bool mask of one (sequences, positions) shape "
                         f"are needed, got {tuple(values.shape)} and {tuple(mask.shape)} "
                         f"({mask.dtype})")


def rate_and_se(values: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    """Mean of ``values`` (N, L) over ``mask``, and its standard error with the N sequences as the
    independent units (the ratio estimator's: each sequence contributes its sum and its count)."""
    _check_masked(values, mask, "rate_and_se")
    per_sentence = torch.where(mask, values.double(), 0.0).sum(1)  # (N,)
    n = mask.sum(1).double()  # (N,) predicted symbols per sentence
    rate = float(per_sentence.sum() / n.sum())
    return rate, float(((per_sentence - rate * n) ** 2).sum().sqrt() / n.sum())


def position_rates(values: torch.Tensor, mask: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Per position, the mean of ``values`` (N, P) over the sequences predicting there, each
    sequence counted ``counts`` times: (R, N) multiplicities of R resamples give (R, P) rates."""
    return (counts @ torch.where(mask, values.double(), 0.0)) / (counts @ mask.double())


@dataclass(frozen=True)
class MatchedDifference:
    """Set A minus set B, position by position and averaged with B's length mix
    (:func:`matched_difference`)."""

    overall: Interval  # the average over the positions compared, weighted by B's predictions there
    positions: int  # positions compared: both sets have at least min_per_position predictions there
    above: int  # positions whose interval lies above zero
    below: int  # positions whose interval lies below zero
    per_position: list  # (position from 1, difference, low, high) for each position compared


def matched_difference(a_values: torch.Tensor, a_mask: torch.Tensor, b_values: torch.Tensor,
                       b_mask: torch.Tensor, *, seed: int, resamples: int,
                       min_per_position: int) -> MatchedDifference:
    """Rate of set A minus rate of set B at the same positions (values (N, P) over bool masks;
    e.g. A free-running samples, B teacher-forced held-out sentences), and its average over the
    positions where each set has ``min_per_position`` predictions, weighted by B's length mix, so
    the two sets' different lengths do not enter. 95% percentile intervals from ``resamples``
    bootstrap resamples of the sequences within each set (pointwise for each position)."""
    _check_masked(a_values, a_mask, "matched_difference (a)")
    _check_masked(b_values, b_mask, "matched_difference (b)")
    check_int("resamples", resamples, 1)
    check_int("min_per_position", min_per_position, 1)
    P = min(b_mask.shape[1], a_mask.shape[1])
    b_values, b_mask, a_values, a_mask = (x[:, :P].cpu()
                                          for x in (b_values, b_mask, a_values, a_mask))
    keep = (b_mask.sum(0) >= min_per_position) & (a_mask.sum(0) >= min_per_position)  # (P,)
    if not keep.any():
        raise ValueError(f"no position has min_per_position = {min_per_position} predictions in "
                         "both sets")
    # (P,) the length mix
    weight = b_mask.sum(0).double() * keep / (b_mask.sum(0).double() * keep).sum()
    rng = np.random.default_rng(seed)
    boot = [position_rates(v, m, torch.from_numpy(
                rng.multinomial(len(m), np.full(len(m), 1 / len(m)), size=resamples)).double())
            for v, m in ((a_values, a_mask), (b_values, b_mask))]  # 2 × (R, P)
    point = [position_rates(v, m, torch.ones(1, len(m), dtype=torch.float64))[0]
             for v, m in ((a_values, a_mask), (b_values, b_mask))]  # 2 × (P,)
    diff_boot, diff = (boot[0] - boot[1])[:, keep], (point[0] - point[1])[keep]  # (R, K), (K,)
    overall = torch.nan_to_num(boot[0] - boot[1]) @ weight  # (R,)
    ends = torch.tensor([0.025, 0.975], dtype=torch.float64)
    lo, hi = torch.quantile(overall, ends, dim=0)
    per_pos = torch.quantile(diff_boot, ends, dim=0)  # (2, K)
    return MatchedDifference(
        Interval(float(diff @ weight[keep]), float(lo), float(hi)), int(keep.sum()),
        int((per_pos[0] > 0).sum()), int((per_pos[1] < 0).sum()),
        [(int(t) + 1, float(d), float(a), float(b))
         for t, d, a, b in zip(torch.nonzero(keep).flatten(), diff, per_pos[0], per_pos[1])])
