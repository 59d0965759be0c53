"""Sphinx extension: keep the book working offline, and keep wide content in the column.

Jupyter Book 1 always loads sphinx-thebe. The book runs no kernel, thebe itself would be
fetched from a CDN on demand, and sphinx-thebe 0.3 declares its configuration script
twice per page (a duplicate ``const`` that stops the page's later scripts). So its
page-time hooks are disconnected here; its CSS is harmless and stays.

``static/halluc_book.css`` and ``static/halluc_book.js`` (served from the book's own
``_static``) make wide tables and display equations scroll sideways in their own box, with
a visible scrollbar and a fade at the right edge while there is more to see.
"""

from pathlib import Path

STATIC = Path(__file__).resolve().with_name("static")


def _add_static_path(app, config):
    config.html_static_path = [*config.html_static_path, str(STATIC)]


def setup(app):
    for event in ("env-before-read-docs", "doctree-resolved"):
        for listener in list(app.events.listeners.get(event, [])):
            if getattr(listener.handler, "__module__", "") == "sphinx_thebe":
                app.disconnect(listener.id)
    app.connect("config-inited", _add_static_path)
    app.add_css_file("halluc_book.css")
    app.add_js_file("halluc_book.js", loading_method="defer")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
