"""The book's figure for a comparison of arms, a forest plot, and a check that no legend hides data.

A chapter that compares arms states its contrasts as differences with intervals
(:func:`halluc_lab.evaluation.stats.t_difference`). :func:`forest` draws them on one axis, one
row per contrast: the estimate, its interval as a bar, each seed's own difference as a dot, and
zero as a dashed line, so a reader sees at once which intervals leave zero and how far the seeds
spread. Rows the chapter did not pre-register are drawn in grey and labelled "(exploratory)". The
full table stays in a collapsed cell or on the results page.

:func:`legend_overlaps` finds a legend drawn over a figure's data, and :func:`check_legends` makes
every figure drawn from then on warn about one (the notebook tests turn it on).
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


# -- legends over data -----------------------------------------------------------------------------
SEGMENT_SAMPLES = 8  # points per line segment: a line that passes under a legend covers it


class LegendOverDataWarning(UserWarning):
    """A legend drawn on top of data points, lines or bars of its figure."""


def _data_points(ax):
    """Display coordinates (N, 2) of what ``ax`` draws in data coordinates: line vertices and
    points along each segment, scatter points and errorbar segments. Reference lines drawn in axes
    coordinates (``axhline``, ``axvline``) are not data and are left out."""
    import numpy as np
    from matplotlib.collections import LineCollection

    def along(xy):
        xy = xy[np.isfinite(xy).all(axis=1)]
        if len(xy) < 2:
            return xy
        t = np.linspace(0.0, 1.0, SEGMENT_SAMPLES, endpoint=False)[None, :, None]
        inner = xy[:-1, None, :] + (xy[1:, None, :] - xy[:-1, None, :]) * t
        return np.vstack([inner.reshape(-1, 2), xy[-1:]])

    out = [np.empty((0, 2))]
    for line in ax.get_lines():
        if line.get_visible() and line.get_transform() == ax.transData:
            xy = ax.transData.transform(np.asarray(line.get_xydata(), dtype=float))
            joined = line.get_linestyle() not in ("None", "", " ", "none")
            out.append(along(xy) if joined else xy[np.isfinite(xy).all(axis=1)])
    for coll in ax.collections:
        if not coll.get_visible():
            continue
        if isinstance(coll, LineCollection) and coll.get_transform() == ax.transData:
            out += [along(ax.transData.transform(np.asarray(s, dtype=float)))
                    for s in coll.get_segments()]
        elif len(coll.get_offsets()) and coll.get_offset_transform() == ax.transData:
            xy = ax.transData.transform(np.asarray(coll.get_offsets(), dtype=float))
            out.append(xy[np.isfinite(xy).all(axis=1)])
    return np.vstack(out)


def legend_overlaps(fig) -> list[str]:
    """What each legend of ``fig`` covers: one line per legend that lies over data points, lines
    (sampled along each segment) or bars of any axes of the figure, empty when none does. The figure
    is drawn first, so legend boxes and data are in the same display coordinates; a figure without
    a renderer of its own (closed, and saved as an explorer's frame) is not checked."""
    import numpy as np
    from matplotlib.patches import Rectangle

    legends = [(ax, ax.get_legend()) for ax in fig.axes] + [(None, lg) for lg in fig.legends]
    legends = [(owner, lg) for owner, lg in legends if lg is not None and lg.get_visible()]
    if not legends or not hasattr(fig.canvas, "get_renderer"):  # closed explorer frames have none
        return []
    fig.canvas.draw()  # only a figure with a legend is drawn an extra time
    renderer = fig.canvas.get_renderer()
    # what every axes draws, gathered once for all the figure's legends
    xy = np.vstack([_data_points(ax) for ax in fig.axes])
    bar_boxes = [p.get_window_extent(renderer) for ax in fig.axes for p in ax.patches
                 if isinstance(p, Rectangle) and p.get_visible() and p.get_height()
                 and p.get_width()]
    found = []
    for owner, legend in legends:
        box = legend.get_window_extent(renderer)
        points = int(((xy[:, 0] > box.x0) & (xy[:, 0] < box.x1)
                      & (xy[:, 1] > box.y0) & (xy[:, 1] < box.y1)).sum())
        bars = sum(1 for b in bar_boxes if b.overlaps(box))
        if points or bars:
            title = " ".join(owner.get_title().split()) if owner is not None else ""  # one line
            where = f"'{title}'" if title else (
                "its axes" if owner is not None else "the figure")
            what = " and ".join(f"{n} {w if n > 1 else w[:-1]}"
                                for n, w in ((points, "data points"), (bars, "bars")) if n)
            found.append(f"the legend of {where} covers {what}")
    return found


def check_legends() -> None:
    """From now on, warn (:class:`LegendOverDataWarning`) whenever a figure is drawn for display or
    saved with a legend over its data. ``import halluc_lab`` calls it where
    ``$HALLUC_CHECK_FIGURES`` is "1", as the tests set it, so that a smoke run shows the warning
    and fails; calling it twice installs it once."""
    import warnings

    from matplotlib.backend_bases import FigureCanvasBase

    original = FigureCanvasBase.print_figure
    if getattr(original, "checks_legends", False):
        return

    def print_figure(self, *args, **kwargs):
        for problem in legend_overlaps(self.figure):
            warnings.warn(problem, LegendOverDataWarning, stacklevel=2)
        return original(self, *args, **kwargs)

    print_figure.checks_legends = True
    FigureCanvasBase.print_figure = print_figure
