"""halluc_lab.book.interactive: frame grids in control order, deterministic output, clear errors."""

import json
import re

import numpy as np
import pytest

from halluc_lab.book.interactive import (Control, bar_explorer, heatmap_explorer, image_explorer,
                                    line_explorer)


def _payload(explorer):
    html = explorer._repr_html_()
    blob = re.search(r'<script type="application/json" class="hl-data">(.*?)</script>', html, re.S).group(1)
    return json.loads(blob.replace("<\\/", "</"))


def test_frames_follow_controls_with_the_last_varying_fastest():
    heights = np.arange(2 * 3 * 4, dtype=float).reshape(2, 3, 4)
    e = bar_explorer([Control("a", [0, 1]), Control("b", [0, 1, 2])], labels=list("wxyz"), heights=heights)
    frames = _payload(e)["frames"]
    assert len(frames) == 6 and frames[1 * 3 + 2]["h"] == heights[1, 2].tolist()


def test_output_is_identical_from_run_to_run():
    make = lambda: heatmap_explorer([Control("h", [0, 1])], np.eye(3)[None].repeat(2, 0), "abc", "abc")
    assert make()._repr_html_() == make()._repr_html_()


def test_sliders_start_at_the_initial_value():
    e = bar_explorer([Control("t", [0.5, 1.0, 2.0], initial=1, fmt="{:.1f}")], labels=["a"],
                     heights=[[1.0], [2.0], [3.0]])
    assert 'value="1"' in e._repr_html_() and ">1.0</output>" in e._repr_html_()


def test_nan_cells_become_blank_and_inf_is_rejected():
    m = np.array([[[0.5, np.nan], [0.2, 0.8]]])
    assert _payload(heatmap_explorer([Control("x", [0])], m, "ab", "cd"))["frames"][0][0][1] is None
    with pytest.raises(ValueError, match="inf"):
        heatmap_explorer([Control("x", [0])], np.full((1, 2, 2), np.inf), "ab", "cd")


def test_script_cannot_break_out_of_the_json():
    e = bar_explorer([Control("x", [0])], labels=["</script><b>"], heights=[[1.0]])
    assert "</script><b>" not in e._repr_html_()


@pytest.mark.parametrize("call, match", [
    (lambda: bar_explorer([Control("x", [0, 1])], labels=["a", "b"], heights=np.ones((3, 2))), "shape"),
    (lambda: bar_explorer([Control("x", [0])], labels=["a"], heights=[[np.nan]]), "finite"),
    (lambda: bar_explorer([Control("x", [0])], labels=["a", "b"], heights=[[1.0]]), "labels"),
    (lambda: line_explorer([Control("x", [0])], [0, 1], np.ones((1, 2, 3)), ["s", "t"]), "ys"),
    (lambda: image_explorer([Control("x", [0, 1])], [b"\x89PNG..."]), "nested"),
    (lambda: Control("x", []), "values"),
    (lambda: Control("x", [1, 2], initial=2), "initial"),
    (lambda: bar_explorer([], labels=["a"], heights=[1.0]), "Control"),
])
def test_bad_input_is_named(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


def test_image_explorer_embeds_figures_as_png():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figs = []
    for k in range(2):
        fig, ax = plt.subplots()
        ax.plot([0, k])
        figs.append(fig)
    frames = _payload(image_explorer([Control("k", [0, 1])], figs))["frames"]
    assert all(f.startswith("data:image/png;base64,") for f in frames) and frames[0] != frames[1]
