"""Every page of the book reads as a reader expects: tables and math that notebook code printed
are rendered, wide tables and equations scroll in their own box, and figures are shown large
enough to read (ARCHITECTURE.md §9). The checks live in ``readability.py``; ``test_readability_checks.py``
shows that each of them fails on a page made to break it.

Pages are opened at Playwright's default desktop viewport, 1280 × 720 CSS pixels.
"""

import pytest

from tests.book import readability
from tests.book.test_book import PAGES

pytestmark = pytest.mark.book


@pytest.fixture(scope="module")
def rendered(browser, server):
    """``rendered(path)``: the page at ``path``, opened once for all checks, math typeset."""
    context = browser.new_context()
    context.route("**/*", lambda route: route.continue_() if route.request.url.startswith(
        (server, "data:", "blob:", "about:")) else route.abort())
    pages = {}

    def open_(path):
        if path not in pages:
            page = context.new_page()
            response = page.goto(f"{server}/{path}", wait_until="load")
            assert response is not None and response.ok, f"{path}: HTTP {response and response.status}"
            readability.wait_for_math(page)
            pages[path] = page
        return pages[path]

    yield open_
    context.close()


def _report(path, offences):
    return f"{path}:\n  " + "\n  ".join(offences)


@pytest.mark.parametrize("path", PAGES)
def test_printed_markdown_tables_are_rendered(rendered, path):
    offences = readability.check_markdown_tables(rendered(path))
    assert not offences, _report(path, offences)


@pytest.mark.parametrize("path", PAGES)
def test_no_math_is_left_as_raw_tex(rendered, path):
    offences = readability.check_untypeset_math(rendered(path))
    assert not offences, _report(path, offences)


@pytest.mark.parametrize("path", PAGES)
def test_wide_tables_and_equations_scroll_in_their_own_box(rendered, path):
    offences = readability.check_wide_blocks(rendered(path))
    assert not offences, _report(path, offences)


@pytest.mark.parametrize("path", PAGES)
def test_figure_tick_labels_render_at_least_9_px(rendered, path):
    """Matplotlib's default 10 pt tick labels, at the width each figure is shown (see check_figure_text)."""
    offences = readability.check_figure_text(rendered(path))
    assert not offences, _report(path, offences)


WIDE_TABLE = ("<table class='claim-table'><caption>a claim table as notebook code prints it</caption><tbody><tr>"
              + "".join(f"<td style='white-space:nowrap'>a wide column, number {i}</td>" for i in range(12))
              + "</tr></tbody></table>")
WIDE_EQUATION = "\\[ " + " + ".join(f"\\frac{{x_{{{i}}}}}{{y_{{{i}}}}}" for i in range(40)) + " \\]"


@pytest.mark.parametrize("stylesheet", [True, False], ids=["book css", "without it"])
def test_book_stylesheet_makes_wide_printed_tables_and_equations_scroll(browser, server, stylesheet):
    """A printed HTML table and a display equation far wider than the column, added to a built
    page, scroll in their own box. The table needs the book's stylesheet; the theme already
    scrolls display equations."""
    page = browser.new_page()
    try:
        page.goto(f"{server}/book/notation.html", wait_until="load")
        readability.wait_for_math(page)
        if not stylesheet:
            page.evaluate("() => document.querySelector('link[href*=\"halluc_book.css\"]').remove()")
        page.evaluate("""async ([table, tex]) => {
            const article = document.querySelector('article.bd-article');
            const out = document.createElement('div');
            out.className = 'cell_output';
            out.innerHTML = table;
            const math = document.createElement('div');
            math.className = 'math notranslate nohighlight';
            math.textContent = tex;
            article.append(out, math);
            await MathJax.typesetPromise([math]);
        }""", [WIDE_TABLE, WIDE_EQUATION])
        column = page.evaluate("() => document.querySelector('article.bd-article').clientWidth")
        widths = page.evaluate("() => [...document.querySelectorAll('table.claim-table, div.math mjx-container')]"
                               ".slice(-2).map(e => e.scrollWidth)")
        assert min(widths) > 2 * column  # both really are wider than the column
        offences = readability.check_wide_blocks(page)
        if stylesheet:
            assert offences == []
        else:
            assert [o.split(" ")[0] for o in offences] == ["table.claim-table"], offences
    finally:
        page.close()


def test_a_table_wider_than_the_column_fades_at_the_right_until_scrolled_to_its_end(browser,
                                                                                    server):
    """The errata's widest table on a phone (its tables fit the column on a laptop) shows the cue
    while there is more to its right; scrolled to its end, the cue goes."""
    context = browser.new_context(viewport=readability.PHONE)
    try:
        page = context.new_page()
        page.goto(f"{server}/book/errata.html", wait_until="load")
        boxes = page.locator(".pst-scrollable-table-container")
        widths = boxes.evaluate_all("els => els.map(e => e.scrollWidth - e.clientWidth)")
        box = boxes.nth(widths.index(max(widths)))
        assert max(widths) > 0, "no errata table is wider than a phone's column any more"
        cue = "el => el.classList.contains('hl-more-right')"
        page.wait_for_function(cue, arg=box.element_handle())
        box.evaluate("el => { el.scrollLeft = el.scrollWidth; }")
        page.wait_for_function(f"el => !({cue})(el)", arg=box.element_handle())
    finally:
        context.close()


def test_errata_tables_fit_the_column_on_a_laptop(open_page):
    """The errata's five-column tables keep "computed" and "why" on screen at 1280 px: no table
    is wider than its box, and the "why" column is at least a fifth of the table."""
    page = open_page("book/errata.html")
    tables = page.locator("table.hl-errata")
    assert tables.count() >= 10
    overflow = tables.evaluate_all(
        "els => els.map(t => t.parentElement.scrollWidth - t.parentElement.clientWidth)")
    assert max(overflow) <= 1, overflow
    share = tables.evaluate_all(
        "els => els.map(t => t.querySelector('th:nth-child(5)').offsetWidth / t.offsetWidth)")
    assert min(share) >= 0.2, share
