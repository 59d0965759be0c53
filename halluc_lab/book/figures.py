"""The book's figure for a comparison of arms: a forest plot.

A chapter that compares arms states its contrasts as differences with intervals
(:func:`halluc_lab.evaluation.stats.t_difference`). :func:`forest` draws them on one axis, one
row per contrast: the estimate, its interval as a bar, each seed's own difference as a dot, and
zero as a dashed line, so a reader sees at once which intervals leave zero and how far the seeds
spread. Rows the chapter did not pre-register are drawn in grey and labelled "(exploratory)". The
full table stays in a collapsed cell or on the results page.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from halluc_lab.evaluation.stats import Interval

ROW_INCHES = 0.42  # height per contrast: labels at 10 pt stay apart
SEED_OFFSETS = (-0.18, 0.18)  # the per-seed dots spread over this band around their row, evenly


def forest(contrasts: Mapping[str, Interval], *, xlabel: str, title: str | None = None,
           exploratory: Collection[str] = (), ax=None):
    """A forest plot of ``contrasts`` (label -> interval of a difference), top to bottom in order.

    Args:
        contrasts: the differences, each an :class:`Interval`; its ``per_seed`` values, when
            present, are drawn as dots, and its ``how`` ("t, 8 seeds") ends the x-axis label when
            all contrasts share it.
        xlabel: what the differences measure, e.g. "wrong rate, arm − SFT".
        title: above the axis, if given.
        exploratory: labels of contrasts that were not pre-registered (grey, marked).
        ax: a matplotlib axis to draw on; by default a new figure sized for the rows.

    Returns:
        The matplotlib Figure.
    """
    import matplotlib.pyplot as plt

    if not contrasts:
        raise ValueError("forest needs at least one contrast")
    unknown = set(exploratory) - set(contrasts)
    if unknown:
        raise ValueError(f"exploratory names contrasts that are not drawn: {sorted(unknown)}")
    for label, iv in contrasts.items():
        if not isinstance(iv, Interval):
            raise TypeError(f"contrast {label!r} must be an Interval, got {type(iv).__name__}")
    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 1.2 + ROW_INCHES * len(contrasts)), layout="constrained")
    n = len(contrasts)
    for i, (label, iv) in enumerate(contrasts.items()):
        y = n - 1 - i
        colour = "0.55" if label in exploratory else "C0"
        ax.plot([iv.low, iv.high], [y, y], color=colour, lw=2.5, solid_capstyle="butt")
        ax.plot([iv.estimate], [y], "D", color=colour, ms=6)
        seeds = iv.per_seed or ()
        for j, v in enumerate(seeds):
            lo, hi = SEED_OFFSETS
            dy = lo + (hi - lo) * (j + 0.5) / len(seeds)
            ax.plot([v], [y + dy], "o", color="0.25", ms=3, alpha=0.7)
    ax.axvline(0.0, color="0.3", ls="--", lw=1)
    labels = [f"{k} (exploratory)" if k in exploratory else k for k in contrasts]
    ax.set_yticks(range(n - 1, -1, -1), labels)
    for tick, label in zip(ax.get_yticklabels(), contrasts):
        if label in exploratory:
            tick.set_color("0.4")
    ax.set_ylim(-0.7, n - 0.3)
    hows = {iv.how for iv in contrasts.values()}
    shared = hows.pop() if len(hows) == 1 else ""
    how = f" — bars: {shared} interval; dots: seeds" if shared else ""
    ax.set_xlabel(xlabel + how)
    if title:
        ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    return ax.figure
