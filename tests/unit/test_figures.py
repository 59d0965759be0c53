"""The forest plot: rows, seeds, exploratory marks; bad input refused. The legend check: what a
legend covers, and the warning when a figure with one over its data is drawn."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from halluc_lab.book.figures import (LegendOverDataWarning, check_legends, forest,  # noqa: E402
                                     legend_overlaps)
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


def _rising(loc):
    fig, ax = plt.subplots(figsize=(4, 3))
    x = np.linspace(0, 1, 40)
    ax.plot(x, x, label="y = x")
    ax.axhline(0.08, color="0.5", ls=":")  # a reference line, x in axes coordinates: not data
    ax.legend(loc=loc)
    return fig


def test_a_legend_over_a_line_a_point_or_a_bar_is_found_and_one_beside_them_is_not():
    clear, over = _rising("lower right"), _rising("upper left")
    assert legend_overlaps(clear) == []  # the reference line at 0.08 runs under it: not data
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([0, 1], [0, 1], label="two vertices")  # only the segment between them passes under
    ax.legend(loc="upper right")
    assert legend_overlaps(fig) == ["the legend of its axes covers 1 data point"]
    bars, bax = plt.subplots(figsize=(4, 3))
    bax.bar([0, 1, 2], [1.0, 0.2, 1.0], label="bars")
    bax.set_title("three bars")
    bax.legend(loc="upper right")
    assert legend_overlaps(bars) == ["the legend of 'three bars' covers 1 bar"]
    dots, dax = plt.subplots(figsize=(4, 3))
    dax.scatter([0.95, 0.05], [0.05, 0.95], label="dots")
    dax.legend(loc="lower right")
    assert legend_overlaps(dots) == ["the legend of its axes covers 1 data point"]
    # a legend outside the axes covers nothing, whatever the data
    out, oax = plt.subplots(figsize=(4, 3))
    oax.plot([0, 1], [0, 1], label="a")
    oax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0))
    assert legend_overlaps(out) == []
    assert legend_overlaps(over) == []  # y = x keeps away from the upper left corner
    for f in (clear, over, fig, bars, dots, out):
        plt.close(f)


def test_check_legends_warns_when_such_a_figure_is_drawn(tmp_path):
    import warnings

    check_legends()
    check_legends()  # once is enough; a second call must not wrap twice
    bad = _rising("upper right")  # the line ends under the legend
    fine = _rising("lower right")
    with pytest.warns(LegendOverDataWarning, match="covers") as caught:
        bad.savefig(tmp_path / "bad.png")
    assert len(caught) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fine.savefig(tmp_path / "fine.png")
    plt.close(bad)
    plt.close(fine)
