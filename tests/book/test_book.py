"""The rendered book: builds without warnings in our files, reads offline, typesets math,
loads every image, and its sliders change what is shown (ARCHITECTURE.md §7, §9)."""

import html.parser
import re
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

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


class _Links(html.parser.HTMLParser):
    """The href and src of every element of a page."""

    def __init__(self):
        super().__init__()
        self.targets: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.targets += [v for k, v in attrs if k in ("href", "src") and v]


def test_every_internal_link_of_the_served_site_resolves(book, server):
    """What a reader of the published site follows: every page's links, styles, scripts and images."""
    # every page, not the theme's HTML templates under _static
    urls, pages = set(), sorted(p for p in book.html.rglob("*.html") if "_static" not in p.parts)
    assert len(pages) >= len(PAGES)
    for page in pages:
        parser = _Links()
        parser.feed(page.read_text(encoding="utf-8"))
        base = f"{server}/{page.relative_to(book.html).as_posix()}"
        for target in parser.targets:
            if urllib.parse.urlsplit(target).scheme or target.startswith(("#", "//")):
                continue  # another site (the reader's browser fetches it, or the offline test flags it)
            urls.add(urllib.parse.urldefrag(urllib.parse.urljoin(base, target)).url)
    assert len(urls) > 50  # the pages, their assets and the navigation between them
    broken = []
    for url in sorted(urls):
        try:
            with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=10) as r:
                ok = r.status == 200
        except urllib.error.URLError:
            ok = False
        if not ok:
            broken.append(url.removeprefix(server))
    assert not broken, f"{len(broken)} of {len(urls)} internal links do not resolve: {broken[:20]}"


def test_search_on_the_served_site_finds_a_chapter(open_page, offsite_requests):
    page = open_page("search.html?q=Bradley")
    page.wait_for_function("() => document.querySelectorAll('#search-results li').length > 0", timeout=30_000)
    hits = page.eval_on_selector_all("#search-results li a", "links => links.map(a => a.getAttribute('href'))")
    assert any("09_preference" in h for h in hits), f"search for 'Bradley' did not find chapter 9: {hits[:10]}"
    assert not offsite_requests


def test_search_of_the_book_opened_from_its_files_shows_snippets(book, browser):
    """Opened from the folder (file://), where a browser refuses to fetch the pages it found, search
    still shows a snippet of each hit: the text of the page's article."""
    page = browser.new_page()
    try:
        page.goto((book.html / "search.html").as_uri() + "?q=Bradley", wait_until="load")
        snippets = "() => document.querySelectorAll('#search-results li p.context').length > 0"
        page.wait_for_function(snippets, timeout=30_000)
        chapter_9 = page.locator("a[href*='09_preference']")
        hit = page.locator("#search-results li").filter(has=chapter_9).first
        assert "Reward models, RLHF, DPO and RSFT" in hit.locator("p.context").inner_text()
    finally:
        page.close()


class _Title(html.parser.HTMLParser):
    """The text of a page's first ``<h1>`` inside its ``<article>``, without the heading's own
    permalink (``a.headerlink``)."""

    def __init__(self):
        super().__init__()
        self.in_article = self.in_h1 = self.in_link = self.done = False
        self.parts: list[str] = []

    def handle_starttag(self, tag, attrs):
        classes = (dict(attrs).get("class") or "").split()
        self.in_article |= tag == "article"
        self.in_h1 |= self.in_article and not self.done and tag == "h1"
        self.in_link |= self.in_h1 and tag == "a" and "headerlink" in classes

    def handle_endtag(self, tag):
        if self.in_link and tag == "a":
            self.in_link = False
        elif self.in_h1 and tag == "h1":
            self.in_h1, self.done = False, True

    def handle_data(self, data):
        if self.in_h1 and not self.in_link:
            self.parts.append(data)

    @classmethod
    def of(cls, page: Path) -> str:
        parser = cls()
        parser.feed(page.read_text(encoding="utf-8"))
        assert parser.done, f"{page.name}: no <h1> in its <article>"
        return " ".join("".join(parser.parts).split())


def test_the_front_pages_chapter_table_links_every_chapter_by_its_own_title(open_page, book):
    """The browser's title bar names the book once, and the table of chapters links each chapter
    with the title the chapter's page gives itself (read from the built page: every page is opened
    in the browser by the render test above)."""
    page = open_page("book/intro.html")
    assert page.title() == "Halluc Lab"
    links = page.locator("article table a.reference").evaluate_all(
        "els => els.map(a => [a.getAttribute('href'), a.textContent.trim()])")
    chapters = [p for p in PAGES if p.startswith("notebooks/")]
    assert [href.split("#")[0] for href, _ in links] == [f"../{p}" for p in chapters]
    for (href, text), path in zip(links, chapters):
        assert text == _Title.of(book.html / path), path
