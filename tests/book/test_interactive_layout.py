"""halluc_lab.book.interactive's figures as a browser draws them, outside the book: on a phone they are
drawn for the column (no fixed 640 px), on a laptop as before, a caption's `spans` show as code,
and an axis label's ``^`` raises what follows."""

import pytest

from halluc_lab.book import interactive
from tests.book import readability

pytestmark = pytest.mark.book
WORDS = ["the", "a", "dog", "cat", "chased", "saw", "ball", "car", "and", "then", "ran", "quickly"]


def _explorers():
    taus = [0.5, 1.0, 2.0]
    heights = [[(i + 1) ** -t for i in range(len(WORDS))] for t in taus]
    temperature = interactive.Control("temperature", taus, initial=1)
    bars = interactive.bar_explorer([temperature], WORDS, heights,
                                    captions=["`τ = 0.5`", "`τ = 1` — the model's own", "`τ = 2`"],
                                    title="sampler", ylabel="p^τ")
    x = list(range(20))
    lines = interactive.line_explorer([interactive.Control("scale", [1, 2])], x,
                                      [[[v * s for v in x], [v / s for v in x]] for s in (1, 2)],
                                      ["up", "down"], title="lines")
    heat = interactive.heatmap_explorer([interactive.Control("layer", [0, 1])],
                                        [[[r * c for c in range(16)] for r in range(16)]] * 2,
                                        [str(i) for i in range(16)], [str(i) for i in range(16)],
                                        title="attention")
    return "".join(e._repr_html_() for e in (bars, lines, heat))


@pytest.fixture(scope="module", params=["phone", "laptop"])
def drawn(browser, request):
    viewport = readability.PHONE if request.param == "phone" else {"width": 1280, "height": 720}
    context = browser.new_context(viewport=viewport)
    page = context.new_page()
    article = f"<article class='bd-article' style='padding:0 16px'>{_explorers()}</article>"
    page.set_content(f"<main>{article}</main>", wait_until="load")
    page.viewport = request.param
    yield page
    context.close()


def test_every_kind_of_interactive_figure_fits_its_column(drawn):
    assert readability.check_explorers_fit(drawn) == []
    assert readability.check_page_scroll(drawn) == []


def test_charts_are_drawn_for_the_column_so_their_text_keeps_its_size(drawn):
    widths = drawn.locator(".hl-explorer svg").evaluate_all(
        "els => els.map(e => +e.getAttribute('width'))")
    column = drawn.evaluate("() => document.querySelector('.hl-figure').clientWidth")
    if drawn.viewport == "phone":
        assert widths[:2] == [column, column], (widths, column)  # bars, lines: the column's width
    else:
        assert widths[:2] == [640, 640]  # as wide as before on a laptop


def test_a_caption_shows_its_backticked_span_as_code(drawn):
    caption = drawn.locator(".hl-explorer .hl-caption").first
    assert caption.locator("code").inner_text() == "τ = 1"
    assert "`" not in caption.inner_text()


def test_an_axis_labels_caret_raises_what_follows_as_in_tex(drawn):
    ylabel = drawn.locator(".hl-explorer svg").first.locator("text").filter(has_text="τ").last
    assert ylabel.inner_html() == (
        '<tspan>p</tspan><tspan baseline-shift="super" font-size="75%">τ</tspan>')
