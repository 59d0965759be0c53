"""Sphinx extension: keep the book working offline, keep wide content in the column, and show
the notebooks' outputs as a reader should see them.

Jupyter Book 1 always loads sphinx-thebe. The book runs no kernel, thebe itself would be
fetched from a CDN on demand, and sphinx-thebe 0.3 declares its configuration script
twice per page (a duplicate ``const`` that stops the page's later scripts). So its
page-time hooks are disconnected here; its CSS is harmless and stays.

``static/halluc_book.css`` and ``static/halluc_book.js`` (served from the book's own
``_static``) make wide tables and display equations scroll sideways in their own box, with
a visible scrollbar and a fade at the right edge while there is more to see; let inline code
and maths wrap on a phone; scale the interactive figures to their column; and open a figure
shown smaller than its own size full size on a tap (``hl-zoomable``).

Two transforms of what the notebooks recorded:

- nbval's markers (``# NBVAL_CHECK_OUTPUT`` and its kin) stay in the notebooks, for the tests,
  and leave the code cells the book shows;
- a "Check the claim" table recorded before ``claims.ClaimTable`` rendered `code` as
  ``<code>`` shows it so too, not as backticks.

The front page's title stands alone in the browser's title bar ("Halluc Lab", not
"Halluc Lab — Halluc Lab"), and the theme's mode defaults to "auto" (unset, every page logs
"Got invalid theme mode").
"""

import re
from pathlib import Path

from docutils import nodes

STATIC = Path(__file__).resolve().with_name("static")
NBVAL_MARKER = re.compile(r"^[ \t]*# NBVAL_[A-Z_]+[ \t]*\n?", re.MULTILINE)
CLAIM_TABLE = 'class="claim-table"'
CLAIM_CODE = re.compile(r"`([^`<>]+)`")  # a `span` inside a cell: escaped text holds no < or >


def _add_static_path(app, config):
    config.html_static_path = [*config.html_static_path, str(STATIC)]


def without_nbval_markers(source: str) -> str:
    """A code cell's source without the lines that only tell nbval what to compare."""
    return NBVAL_MARKER.sub("", source)


def claim_table_code(html: str) -> str:
    """A recorded claim table's HTML with each `span` shown as code."""
    return CLAIM_CODE.sub(r"<code>\1</code>", html) if CLAIM_TABLE in html else html


def _clean_outputs(app, doctree):
    for block in list(doctree.findall(nodes.literal_block)):
        text = block.astext()
        if "NBVAL_" in text:
            cleaned = without_nbval_markers(text)
            block.replace(block.children[0], nodes.Text(cleaned))
            block.rawsource = cleaned
    for raw in list(doctree.findall(nodes.raw)):
        if raw.get("format") == "html" and CLAIM_TABLE in raw.astext():
            html = claim_table_code(raw.astext())
            raw.replace(raw.children[0], nodes.Text(html))
            raw.rawsource = html


def _page_context(app, pagename, templatename, context, doctree):
    title = re.sub(r"<[^>]+>", "", str(context.get("title", ""))).strip()
    book = str(context.get("docstitle") or "").strip()
    if book and title == book:
        # The front page's title is the book's: say it once. Sphinx's layout appends
        # " — docstitle" whenever docstitle is set; the navbar shows the book's name from the logo text.
        context["theme_logo"] = {**(context.get("theme_logo") or {}), "text": book}
        context["docstitle"] = ""
    # The theme's mode when the reader never chose one. The theme's template writes this
    # context value into every page; left unset, every page logs "Got invalid theme mode".
    context.setdefault("default_mode", "auto")


def setup(app):
    for event in ("env-before-read-docs", "doctree-resolved"):
        for listener in list(app.events.listeners.get(event, [])):
            if getattr(listener.handler, "__module__", "") == "sphinx_thebe":
                app.disconnect(listener.id)
    app.connect("config-inited", _add_static_path)
    app.connect("doctree-read", _clean_outputs)
    app.connect("html-page-context", _page_context)
    app.add_css_file("halluc_book.css")
    app.add_js_file("halluc_book.js", loading_method="defer")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
