"""Sliders that work with and without a kernel: precomputed grids drawn by a little JavaScript.

The rendered book is static: no Python runs behind its pages (ARCHITECTURE.md §9). So an
interactive figure here is a grid of precomputed frames, one per combination of the
slider values, packed as JSON into a self-contained HTML output together with a small
script that draws the selected frame as SVG. The same output works live in JupyterLab
(a trusted output runs its script) and in the static page, needs no widget manager,
no CDN and nothing copied by hand.

Four kinds of frame cover the chapters:

- :func:`bar_explorer`: a bar chart per frame (a next-token distribution and its kept set);
- :func:`heatmap_explorer`: a matrix per frame (attention weights per layer and head);
- :func:`line_explorer`: a few curves per frame (score against offset);
- :func:`image_explorer`: any matplotlib figure per frame, as PNG.

Example::

    taus = [0.25, 0.5, 1.0, 2.0]
    probs = [softmax(logits / t) for t in taus]                  # (4, V)
    bar_explorer([Control("temperature", taus, initial=2)], labels=tokens, heights=probs)

The frame axes follow the controls in order: ``heights`` has shape ``(*grid, n_bars)``
where ``grid = [len(c.values) for c in controls]``.
"""

from __future__ import annotations

import base64
import hashlib
import html
import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAX_PAYLOAD_BYTES = 8_000_000  # an output larger than this makes the page slow to load
_JS = (Path(__file__).with_name("interactive.js")).read_text()


@dataclass(frozen=True)
class Control:
    """One slider: it steps through ``values`` and shows the current one with ``fmt``."""

    name: str  # the label shown beside the slider
    values: Sequence  # the grid of values the slider steps through, in order
    initial: int = 0  # index into values of the starting position
    fmt: str = "{}"  # how a value is shown, e.g. "{:.2f}"

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("Control.name must be a non-empty string")
        if len(self.values) < 1:
            raise ValueError(f"Control {self.name!r}: values must not be empty")
        if not isinstance(self.initial, int) or not 0 <= self.initial < len(self.values):
            raise ValueError(f"Control {self.name!r}: initial must be an index in "
                             f"[0, {len(self.values) - 1}], got {self.initial!r}")

    def labels(self) -> list[str]:
        """The values as shown."""
        return [self.fmt.format(v) for v in self.values]


class Explorer:
    """An interactive figure; displays as self-contained HTML (``_repr_html_``)."""

    def __init__(self, data: dict):
        self.data = data
        blob = json.dumps(data, separators=(",", ":"), allow_nan=False)
        if len(blob) > MAX_PAYLOAD_BYTES:
            raise ValueError(f"the precomputed grid is {len(blob) / 1e6:.1f} MB; use fewer slider "
                             f"values or smaller frames (limit {MAX_PAYLOAD_BYTES / 1e6:.0f} MB)")
        # A content hash as id keeps outputs identical from run to run.
        self.id = "hl-" + hashlib.sha1(blob.encode()).hexdigest()[:12]
        self._blob = blob.replace("</", "<\\/")  # never end the JSON <script> early

    @property
    def n_frames(self) -> int:
        """How many precomputed frames the grid holds."""
        return len(self.data["frames"])

    def __repr__(self) -> str:
        names = " × ".join(c["name"] for c in self.data["controls"])
        return f"<{self.data['kind']} explorer over {names}: {self.n_frames} frames>"

    def _repr_html_(self) -> str:
        sliders = "".join(
            f'<label class="hl-control">{html.escape(c["name"])} '
            f'<input class="hl-slider" type="range" min="0" max="{len(c["labels"]) - 1}" step="1" '
            f'value="{c["initial"]}" aria-label="{html.escape(c["name"])}">'
            f'<output class="hl-value">{html.escape(c["labels"][c["initial"]])}</output></label>'
            for c in self.data["controls"])
        title = html.escape(self.data.get("title", ""))
        return (
            f'<div class="hl-explorer" id="{self.id}" '
            f'style="font-family:sans-serif;max-width:min(680px,100%)">'
            f'<div class="hl-title" style="font-weight:bold">{title}</div>'
            f'<div class="hl-controls" style="display:flex;flex-wrap:wrap;gap:1em">{sliders}</div>'
            f'<div class="hl-figure"></div><div class="hl-caption" style="font-size:90%"></div>'
            f'<script type="application/json" class="hl-data">{self._blob}</script>'
            f'<script>{_JS.replace("__ROOT_ID__", self.id)}</script></div>')


def _grid(controls: Sequence[Control]) -> tuple[int, ...]:
    if not controls or not all(isinstance(c, Control) for c in controls):
        raise TypeError("controls must be a non-empty sequence of Control")
    return tuple(len(c.values) for c in controls)


def _numbers(name: str, values, shape_prefix: tuple[int, ...], tail: int | None,
             allow_nan: bool = False) -> np.ndarray:
    """Validate an array of shape (*grid, ...) and round it for a compact payload."""
    arr = np.asarray(values, dtype=float)
    if arr.shape[:len(shape_prefix)] != shape_prefix or (tail is not None
                                                         and arr.ndim != len(shape_prefix) + tail):
        raise ValueError(f"{name} must have shape (*grid, ...) with grid {shape_prefix} and {tail} "
                         f"trailing axes, got {arr.shape}")
    if not allow_nan and not np.isfinite(arr).all():
        raise ValueError(f"{name} must be finite")
    if np.isinf(arr).any():
        raise ValueError(f"{name} must not contain ±inf (use NaN for a blank cell)")
    return arr


def _rounded(arr: np.ndarray) -> list:
    """Four significant digits, NaN as null (JSON has no NaN)."""
    flat = [None if math.isnan(v) else float(f"{v:.4g}") for v in arr.ravel().tolist()]
    return np.array(flat, dtype=object).reshape(arr.shape).tolist()


def _frames(arr: np.ndarray, grid: tuple[int, ...]) -> list:
    """Flatten the grid axes (C order: the last control varies fastest)."""
    n = int(np.prod(grid))
    return _rounded(arr.reshape(n, *arr.shape[len(grid):]))


def _captions(captions, grid: tuple[int, ...]) -> list[str] | None:
    if captions is None:
        return None
    arr = np.asarray(captions, dtype=object)
    if arr.shape != grid:
        raise ValueError(f"captions must have the grid's shape {grid}, got {arr.shape}")
    return [str(c) for c in arr.ravel().tolist()]


def _data(kind: str, controls, frames: list, captions, title: str, **static) -> dict:
    return {"kind": kind, "title": title, "shape": list(_grid(controls)),
            "controls": [{"name": c.name, "labels": c.labels(), "initial": c.initial}
                         for c in controls],
            "frames": frames, "captions": captions, "static": static}


def bar_explorer(controls: Sequence[Control], labels: Sequence[str], heights, highlight=None,
                 captions=None, title: str = "", xlabel: str = "", ylabel: str = "",
                 ymax: float | None = None) -> Explorer:
    """Bars per frame; ``heights`` (*grid, n_bars), optional bool ``highlight`` of the same
    shape."""
    grid = _grid(controls)
    h = _numbers("heights", heights, grid, 1)
    if h.shape[-1] != len(labels):
        raise ValueError(f"heights has {h.shape[-1]} bars but labels has {len(labels)}")
    frames = [{"h": f} for f in _frames(h, grid)]
    if highlight is not None:
        hl = np.asarray(highlight, dtype=bool)
        if hl.shape != h.shape:
            raise ValueError(f"highlight must have the shape of heights {h.shape}, got {hl.shape}")
        for frame, mask in zip(frames, hl.reshape(len(frames), -1).tolist()):
            frame["on"] = [int(m) for m in mask]
    top = float(ymax) if ymax is not None else float(max(h.max(), 1e-12))
    return Explorer(_data("bars", controls, frames, _captions(captions, grid), title,
                          labels=[str(x) for x in labels], xlabel=xlabel, ylabel=ylabel, ymax=top))


def heatmap_explorer(controls: Sequence[Control], matrices, row_labels: Sequence[str],
                     col_labels: Sequence[str], captions=None, title: str = "", xlabel: str = "",
                     ylabel: str = "", vmin: float | None = None, vmax: float | None = None,
                     show_values: bool | None = None) -> Explorer:
    """A matrix per frame; ``matrices`` (*grid, R, C); NaN cells are drawn blank (e.g. masked)."""
    grid = _grid(controls)
    m = _numbers("matrices", matrices, grid, 2, allow_nan=True)
    if m.shape[-2:] != (len(row_labels), len(col_labels)):
        raise ValueError(f"matrices end in {m.shape[-2:]} but there are {len(row_labels)} row and "
                         f"{len(col_labels)} column labels")
    finite = m[np.isfinite(m)]
    lo = float(vmin) if vmin is not None else float(finite.min()) if finite.size else 0.0
    hi = float(vmax) if vmax is not None else float(finite.max()) if finite.size else 1.0
    if show_values is None:
        show_values = m.shape[-1] * m.shape[-2] <= 144
    return Explorer(_data("heatmap", controls, _frames(m, grid), _captions(captions, grid), title,
                          rows=[str(r) for r in row_labels], cols=[str(c) for c in col_labels],
                          xlabel=xlabel, ylabel=ylabel, vmin=lo, vmax=hi if hi > lo else lo + 1,
                          values=bool(show_values)))


def line_explorer(controls: Sequence[Control], x, ys, series_labels: Sequence[str], captions=None,
                  title: str = "", xlabel: str = "", ylabel: str = "",
                  ylim: tuple[float, float] | None = None) -> Explorer:
    """Curves per frame; ``x`` (N,), ``ys`` (*grid, S, N); the y range is shared by all frames."""
    grid = _grid(controls)
    xs = _numbers("x", x, (), 1)
    y = _numbers("ys", ys, grid, 2)
    if y.shape[-2:] != (len(series_labels), len(xs)):
        raise ValueError(f"ys must end in (n_series={len(series_labels)}, N={len(xs)}), got "
                         f"{y.shape[-2:]}")
    lo, hi = ylim if ylim is not None else (float(y.min()), float(y.max()))
    return Explorer(_data("lines", controls, _frames(y, grid), _captions(captions, grid), title,
                          x=_rounded(xs), series=[str(s) for s in series_labels], xlabel=xlabel,
                          ylabel=ylabel, ylim=[lo, hi if hi > lo else lo + 1]))


def _png(image) -> str:
    if isinstance(image, (bytes, bytearray)):
        data = bytes(image)
    elif hasattr(image, "savefig"):
        import matplotlib.pyplot as plt

        buf = io.BytesIO()
        image.savefig(buf, format="png", dpi=90, bbox_inches="tight")
        plt.close(image)
        data = buf.getvalue()
    else:
        raise TypeError("images must be matplotlib Figures or PNG bytes, got "
                        f"{type(image).__name__}")
    if not data.startswith(b"\x89PNG"):
        raise ValueError("image bytes are not a PNG")
    return "data:image/png;base64," + base64.b64encode(data).decode()


def image_explorer(controls: Sequence[Control], images, captions=None, title: str = "") -> Explorer:
    """A picture per frame: nested lists (shape grid) of matplotlib Figures or PNG bytes."""
    grid = _grid(controls)
    flat: list = [images]
    for size in grid:  # walk the nesting level by level, checking each level's length
        if any(not isinstance(level, (list, tuple)) or len(level) != size for level in flat):
            raise ValueError(f"images must be nested lists of shape {grid}")
        flat = [item for level in flat for item in level]
    return Explorer(_data("images", controls, [_png(img) for img in flat],
                          _captions(captions, grid), title))
