"""Chapter 3's rendered page: the interactive sampler answers its temperature slider offline."""

import pytest

pytestmark = pytest.mark.book
PAGE = "notebooks/03_sampling.html"
TITLE = "Interactive sampler"


def _sampler(page):
    explorer = page.locator(".hl-explorer").filter(has=page.locator(".hl-title", has_text=TITLE))
    assert explorer.count() == 1, f"the page should show one explorer titled {TITLE!r}"
    explorer.scroll_into_view_if_needed()
    return explorer


def _shown(explorer):
    """What the reader sees: the bar heights, which bars are in the kept set, and the caption."""
    heights = explorer.locator("rect.hl-bar").evaluate_all("els => els.map(e => e.getAttribute('height'))")
    kept = explorer.locator("rect.hl-bar").evaluate_all("els => els.map(e => e.classList.contains('hl-on'))")
    return heights, kept, explorer.locator(".hl-caption").inner_text()


def test_moving_the_temperature_changes_the_bars_and_the_caption(open_page, offsite_requests):
    page = open_page(PAGE)
    explorer = _sampler(page)
    slider = explorer.get_by_role("slider", name="temperature")
    value = explorer.locator("label.hl-control", has_text="temperature").locator("output.hl-value")
    assert value.inner_text() == "1"  # the sampler opens at τ = 1
    heights, kept, caption = _shown(explorer)
    assert len(heights) == 12 and sum(kept) == 8  # it opens at k = 8, p = 1
    assert "entropy" in caption

    slider.focus()
    page.keyboard.press("ArrowRight")  # τ = 1 -> 1.5: flatter
    assert value.inner_text() == "1.5"
    hotter, _, hotter_caption = _shown(explorer)
    assert hotter != heights and hotter_caption != caption
    assert float(hotter[0]) < float(heights[0])  # the top word loses probability as τ rises

    for _ in range(6):
        page.keyboard.press("ArrowLeft")  # down to τ = 0.1: nearly greedy
    assert value.inner_text() == "0.1"
    cold, _, cold_caption = _shown(explorer)
    assert float(cold[0]) > float(heights[0]) and cold_caption not in (caption, hotter_caption)

    assert not page.js_errors, page.js_errors
    assert not offsite_requests, f"requests that would leave the machine: {offsite_requests}"


def test_top_p_slider_shrinks_the_kept_set(open_page):
    page = open_page(PAGE)
    explorer = _sampler(page)
    _, kept, _ = _shown(explorer)
    explorer.get_by_role("slider", name="top-p").fill("0")  # p = 0.1: only the top word
    _, small, caption = _shown(explorer)
    assert sum(small) == 1 < sum(kept) and caption.startswith("kept 1 of 12")
