"""The rendered book: builds without warnings in our files, reads offline, typesets math,
loads every image, and its sliders change what is shown (ARCHITECTURE.md §7, §9)."""

import re

import pytest

from tests.book.conftest import ROOT
from tests.notebooks.harness import toc_files

pytestmark = pytest.mark.book
PAGES = [f"{name}.html" for name in toc_files()]
PARTS = ["I Foundations", "II Transformers", "III Post-training",
         "IV Inference-time phenomena and extensions", "Back matter"]


def test_build_has_no_warnings_about_project_files(book):
    ours = [line for line in book.log.splitlines()
            if "WARNING" in line and str(ROOT) in line and "site-packages" not in line]
    assert not ours, "\n".join(ours)


def test_index_opens_and_shows_every_part_in_navigation(open_page, book):
    assert (book.html / "index.html").exists()
    page = open_page("index.html")
    page.wait_for_selector("nav.bd-links")
    nav = page.inner_text("nav.bd-links")
    for part in PARTS:
        assert part in nav, f"part {part!r} missing from the navigation"


@pytest.mark.parametrize("path", PAGES)
def test_page_renders_offline_with_typeset_math_and_loaded_images(open_page, offsite_requests, path):
    page = open_page(path)
    if page.locator(".math").count():
        # MathJax replaces each .math element's TeX with an <mjx-container>.
        page.wait_for_function(
            "() => [...document.querySelectorAll('.math')].every(e => e.querySelector('mjx-container'))",
            timeout=30_000)
    text = page.inner_text("main")
    assert "$$" not in text, "raw $$ left on the page: math was not typeset"
    assert not re.search(r"\\(begin|frac)\{", text), "raw TeX left on the page"
    broken = page.evaluate(
        "() => [...document.images].filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src)")
    assert not broken, f"images that did not load: {broken}"
    assert not page.js_errors, f"JavaScript errors: {page.js_errors}"
    assert not offsite_requests, f"requests that would leave the machine: {offsite_requests}"


def _explorer_pages():
    pages = []
    for name in toc_files():
        if name.startswith("notebooks/"):
            nb = (ROOT / f"{name}.ipynb").read_text()
            if "hl-explorer" in nb:
                pages.append(f"{name}.html")
    return pages


@pytest.mark.parametrize("path", _explorer_pages())
def test_every_slider_changes_what_is_shown(open_page, path):
    page = open_page(path)
    explorers = page.locator(".hl-explorer")
    assert explorers.count() > 0
    for i in range(explorers.count()):
        explorer = explorers.nth(i)
        explorer.scroll_into_view_if_needed()
        sliders = explorer.locator("input.hl-slider")
        for j in range(sliders.count()):
            slider = sliders.nth(j)
            top = int(slider.get_attribute("max"))
            if top == 0:
                continue
            before = explorer.locator(".hl-figure").inner_html()
            current = slider.input_value()
            slider.fill(str(top if int(current) != top else 0))
            after = explorer.locator(".hl-figure").inner_html()
            assert after != before, f"explorer {i}, slider {j} on {path} changed nothing"
            slider.fill(current)  # back to its initial value: controls can interact (top-k 1 hides top-p)
            assert explorer.locator(".hl-figure").inner_html() == before
