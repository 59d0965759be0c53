"""The forest plot: rows, seeds, exploratory marks; bad input refused."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from halluc_lab.book.figures import forest  # noqa: E402
from halluc_lab.evaluation.stats import Interval, t_difference  # noqa: E402


def _contrasts():
    rng = np.random.default_rng(0)
    a, b = rng.normal(0.3, 0.05, (8, 20)), rng.normal(0.2, 0.05, (8, 20))
    return {"RLVR − SFT": t_difference(a, b), "DPO − SFT": t_difference(b, b + 0.01)}


def test_forest_draws_every_contrast_and_every_seed():
    fig = forest(_contrasts(), xlabel="wrong rate, arm − SFT", exploratory={"DPO − SFT"})
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["RLVR − SFT", "DPO − SFT (exploratory)"]  # top to bottom, as given
    dots = [ln for ln in ax.lines if ln.get_marker() == "o"]
    assert len(dots) == 16  # 8 seeds × 2 contrasts
    assert "t, 8 seeds" in ax.get_xlabel()
    plt.close(fig)


def test_forest_refuses_bad_input():
    with pytest.raises(ValueError, match="at least one"):
        forest({}, xlabel="x")
    with pytest.raises(ValueError, match="not drawn"):
        forest(_contrasts(), xlabel="x", exploratory={"nope"})
    with pytest.raises(TypeError, match="must be an Interval"):
        forest({"a": 0.3}, xlabel="x")


def test_forest_without_per_seed_values_draws_no_dots():
    fig = forest({"a": Interval(0.1, -0.1, 0.3)}, xlabel="x")
    assert not [ln for ln in fig.axes[0].lines if ln.get_marker() == "o"]
    plt.close(fig)
