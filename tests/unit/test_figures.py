"""The forest plot: rows, seeds, exploratory marks; bad input refused. The figure checks: what a
legend covers, tick labels that meet, and the warnings when such a figure is drawn."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from halluc_lab.book.figures import (LegendOverDataWarning, PerInchLocator,  # noqa: E402
                                     TickLabelsOverlapWarning, check_figures, forest,
                                     legend_overlaps, tick_label_overlaps)
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


# -- tick labels -----------------------------------------------------------------------------------
def _ticks(n, rotation=0.0, width=3.0):
    fig, ax = plt.subplots(figsize=(width, 2))
    ax.plot([0, 1], [0, 1])
    ax.set_xticks(np.linspace(0, 1, n), [f"{v:+.3f}" for v in np.linspace(0, 1, n)],
                  rotation=rotation)
    return fig


def test_tick_label_overlaps_finds_labels_that_meet_and_only_them():
    crowded, sparse = _ticks(21), _ticks(3)
    found = tick_label_overlaps(crowded)
    assert found == ["the x tick labels of its axes overlap: '+0.000' and '+0.050'"]
    assert tick_label_overlaps(sparse) == []
    # the text "+0.000" at 10 pt is 0.10 in high and 0.52 in long. Turned upright, 21 labels
    # 0.14 in apart fit where they could not lie flat; 61, 0.05 in apart, do not
    assert tick_label_overlaps(_ticks(21, rotation=90, width=4.0)) == []
    assert tick_label_overlaps(_ticks(61, rotation=90, width=4.0)) != []
    # at 45°, 16 labels 0.21 in apart have baselines 0.15 in apart, more than the text's height;
    # 41 labels 0.08 in apart have them 0.05 in apart: the labels lie on one another
    assert tick_label_overlaps(_ticks(16, rotation=45, width=4.0)) == []
    assert tick_label_overlaps(_ticks(41, rotation=45, width=4.0)) != []
    # out of view, a tick is not drawn, and its label is not counted
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.set_xticks([-10.0, -9.9, 0.0, 1.0])  # -10 and -9.9 would meet
    ax.set_xlim(-1.0, 2.0)
    assert tick_label_overlaps(fig) == []
    # labels on both sides of one axis are compared side by side, not with each other
    ax.tick_params(labeltop=True, labelright=True)
    assert tick_label_overlaps(fig) == []
    # y labels, and an axes named by its title
    fig, ax = plt.subplots(figsize=(3, 1.2))
    ax.set_yticks(range(12), [f"row {i}" for i in range(12)])
    ax.set_title("a  tall\ntable")
    assert tick_label_overlaps(fig) == ["the y tick labels of 'a tall table' overlap: 'row 0' and "
                                        "'row 1'"]
    # labels of several lines are named on one line, as the smoke check reads a warning per line
    wide, ax = plt.subplots(figsize=(1.2, 2))
    ax.set_xticks([0, 1], ["RLHF\n(verifier raters)", "RLHF\n(agreeable raters)"])
    assert tick_label_overlaps(wide) == ["the x tick labels of its axes overlap: 'RLHF (verifier "
                                         "raters)' and 'RLHF (agreeable raters)'"]
    plt.close("all")


def test_forest_spaces_its_ticks_by_the_width_left_beside_long_labels():
    # chapter 12a's contrasts printed "−0.125−0.100−0.050" as one string: six long row labels
    # leave the axes narrow, and matplotlib's default put a label every 0.025 over its range
    rng = np.random.default_rng(1)
    names = ("full fine-tuning − before", "frozen backbone − full fine-tuning",
             "LoRA (all linear layers, r = 8) − full fine-tuning",
             "anchored λ = 0.01 − full fine-tuning", "anchored λ = 0.1 − full fine-tuning",
             "anchored λ = 1 − full fine-tuning")
    rows = {name: t_difference(rng.normal(mu, 0.04, (8, 30)), np.zeros((8, 30)))
            for name, mu in zip(names, (-0.074, 0.023, 0.040, 0.033, 0.031, 0.044))}
    fig = forest(rows, xlabel="old-chain accuracy, a − b")
    ax = fig.axes[0]
    ax.set_xlim(-0.13, 0.088)  # 12a's range
    assert tick_label_overlaps(fig) == []
    shown = [t.get_text() for t in ax.get_xticklabels()
             if -0.13 <= t.get_position()[0] <= 0.088]
    assert len(shown) >= 4  # still a scale to read
    ax.xaxis.set_major_locator(matplotlib.ticker.AutoLocator())  # the default, on the same axes
    assert tick_label_overlaps(fig) == [
        "the x tick labels of its axes overlap: '−0.125' and '−0.100'"]
    plt.close(fig)
    with pytest.raises(ValueError, match="per_inch must be > 0"):
        PerInchLocator(0)


@pytest.mark.parametrize("kind, match, bad, fine", [
    (LegendOverDataWarning, "covers", lambda: _rising("upper right"),  # the line ends under it
     lambda: _rising("lower right")),
    (TickLabelsOverlapWarning, "overlap", lambda: _ticks(21), lambda: _ticks(3)),
], ids=["legend", "ticks"])
def test_check_figures_warns_when_such_a_figure_is_drawn(tmp_path, kind, match, bad, fine):
    import warnings

    check_figures()
    check_figures()  # once is enough; a second call must not wrap twice
    bad, fine = bad(), fine()
    with pytest.warns(kind, match=match) as caught:
        bad.savefig(tmp_path / "bad.png")
    assert len(caught) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fine.savefig(tmp_path / "fine.png")
    plt.close(bad)
    plt.close(fine)
