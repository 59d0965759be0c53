"""The book's figure for a comparison of arms, a forest plot, and checks that a figure can be read:
no legend hides data, no tick labels sit on one another.

A chapter that compares arms states its contrasts as differences with intervals
(:func:`halluc_lab.evaluation.stats.t_difference`). :func:`forest` draws them on one axis, one
row per contrast: the estimate, its interval as a bar, each seed's own difference as a dot, and
zero as a dashed line, so a reader sees at once which intervals leave zero and how far the seeds
spread. Rows the chapter did not pre-register are drawn in grey and labelled "(exploratory)". The
full table stays in a collapsed cell or on the results page.

:func:`legend_overlaps` finds a legend drawn over a figure's data, :func:`tick_label_overlaps`
tick labels printed over one another, and :func:`check_figures` makes every figure drawn from
then on warn about either (the notebook tests turn it on).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from matplotlib.ticker import MaxNLocator

from halluc_lab.evaluation.stats import Interval

ROW_INCHES = 0.42  # height per contrast: labels at 10 pt stay apart
TICKS_PER_INCH = 1.6  # x tick labels of a forest plot, such as "−0.05" at 10 pt: 0.4 in wide
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
    ax.xaxis.set_major_locator(PerInchLocator(TICKS_PER_INCH))
    return ax.figure


class PerInchLocator(MaxNLocator):
    """Round tick values (steps of 1, 2 or 5 times a power of ten, so no label needs a digit more
    than its neighbours), as many as the axis has room for at ``per_inch`` labels an inch of its
    length when it is drawn (after the layout has sized the axes). Matplotlib's default allows a
    label three font sizes wide, and a signed difference such as "−0.125" is wider."""

    def __init__(self, per_inch: float):
        if not per_inch > 0:
            raise ValueError(f"per_inch must be > 0, got {per_inch}")
        super().__init__(steps=[1, 2, 5, 10])
        self.per_inch = per_inch

    def __call__(self):
        ax = self.axis.axes
        box = ax.get_position()
        inches = (box.width * ax.figure.get_figwidth() if self.axis is ax.xaxis
                  else box.height * ax.figure.get_figheight())
        self.set_params(nbins=max(1, int(inches * self.per_inch)))
        return super().__call__()


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
    if not _legends(fig):
        return []
    renderer = _drawn(fig)
    return [] if renderer is None else _legend_overlaps(fig, renderer)


def _legends(fig) -> list:
    """(owner axes or None, legend) for each visible legend of ``fig``."""
    legends = [(ax, ax.get_legend()) for ax in fig.axes] + [(None, lg) for lg in fig.legends]
    return [(owner, lg) for owner, lg in legends if lg is not None and lg.get_visible()]


def _drawn(fig):
    """``fig`` drawn, and its renderer; None for a figure without a renderer of its own (closed
    explorer frames have none)."""
    if not hasattr(fig.canvas, "get_renderer"):
        return None
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def _legend_overlaps(fig, renderer) -> list[str]:
    import numpy as np
    from matplotlib.patches import Rectangle

    legends = _legends(fig)
    if not legends:
        return []
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
            what = " and ".join(f"{n} {w if n > 1 else w[:-1]}"
                                for n, w in ((points, "data points"), (bars, "bars")) if n)
            found.append(f"the legend of {_where(owner)} covers {what}")
    return found


def _where(ax) -> str:
    """How a message names ``ax``: its title on one line, else "its axes" (None: "the figure")."""
    if ax is None:
        return "the figure"
    title = " ".join(ax.get_title().split())
    return f"'{title}'" if title else "its axes"


# -- tick labels over one another ------------------------------------------------------------------
TICK_GAP_PIXELS = 1.0  # labels closer than this along their axis read as one


class TickLabelsOverlapWarning(UserWarning):
    """Tick labels of one axis printed over one another."""


def tick_label_overlaps(fig) -> list[str]:
    """Axes of ``fig`` whose tick labels (major and minor) run into one another: one line per such
    axis, with the first pair that does, empty when none does. Neighbours are compared along their
    axis: where their text runs along it (x labels as written), their extents must not meet; where
    it runs across it (y labels, turned x labels), the distance between their baselines, Δ·|sin θ|
    on x and Δ·|cos θ| on y for labels turned by θ, must be at least the text's height. Ticks
    outside the axis' view are not drawn and not counted. The figure is drawn first; one without
    a renderer of its own is not checked."""
    renderer = _drawn(fig)
    return [] if renderer is None else _tick_label_overlaps(fig, renderer)


def _tick_label_overlaps(fig, renderer) -> list[str]:
    import itertools
    import math

    found = []
    for ax in fig.axes:
        if not ax.get_visible() or not ax.axison:
            continue
        for (name, axis), side in itertools.product((("x", ax.xaxis), ("y", ax.yaxis)),
                                                    ("label1", "label2")):  # a side at a time
            lo, hi = sorted(axis.get_view_interval())
            slack = (hi - lo) * 1e-9  # ticks out of view are not drawn
            labels = [label for tick in axis.get_major_ticks() + axis.get_minor_ticks()
                      if lo - slack <= tick.get_loc() <= hi + slack
                      for label in [getattr(tick, side)]
                      if label.get_visible() and label.get_text().strip()]
            boxes = sorted(((t.get_window_extent(renderer), t) for t in labels),
                           key=lambda bt: bt[0].x0 if name == "x" else bt[0].y0)
            for (a, ta), (b, tb) in zip(boxes, boxes[1:]):
                angle = math.radians(ta.get_rotation())
                across = math.sin(angle) if name == "x" else math.cos(angle)
                if abs(across) < 1e-6:  # the text runs along the axis: extents must not meet
                    gap = b.x0 - a.x1 if name == "x" else b.y0 - a.y1
                    clash = gap < TICK_GAP_PIXELS
                else:  # turned: the distance between parallel baselines against the text's height
                    step = ((b.x0 + b.x1) - (a.x0 + a.x1)) / 2 if name == "x" else \
                        ((b.y0 + b.y1) - (a.y0 + a.y1)) / 2
                    _, height, _ = renderer.get_text_width_height_descent(
                        ta.get_text(), ta.get_fontproperties(), ismath=False)
                    clash = abs(step * across) < height
                if clash:  # a label of several lines is named on one, as a warning is one line
                    texts = (" ".join(label.get_text().split()) for label in (ta, tb))
                    found.append(f"the {name} tick labels of {_where(ax)} overlap: "
                                 + " and ".join(f"'{text}'" for text in texts))
                    break
    return found


def check_figures() -> None:
    """From now on, warn whenever a figure is drawn for display or saved with a legend over its
    data (:class:`LegendOverDataWarning`) or tick labels over one another
    (:class:`TickLabelsOverlapWarning`). ``import halluc_lab`` calls it where
    ``$HALLUC_CHECK_FIGURES`` is "1", as the tests set it, so that a smoke run shows the warning
    and fails; calling it twice installs it once."""
    import warnings

    from matplotlib.backend_bases import FigureCanvasBase

    original = FigureCanvasBase.print_figure
    if getattr(original, "checks_figures", False):
        return

    def print_figure(self, *args, **kwargs):
        renderer = _drawn(self.figure)  # one extra draw serves both checks
        if renderer is not None:
            for problem in _legend_overlaps(self.figure, renderer):
                warnings.warn(problem, LegendOverDataWarning, stacklevel=2)
            for problem in _tick_label_overlaps(self.figure, renderer):
                warnings.warn(problem, TickLabelsOverlapWarning, stacklevel=2)
        return original(self, *args, **kwargs)

    print_figure.checks_figures = True
    FigureCanvasBase.print_figure = print_figure
