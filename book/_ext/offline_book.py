"""Sphinx extension: keep the book working offline.

Jupyter Book 1 always loads sphinx-thebe. The book runs no kernel, thebe itself would be
fetched from a CDN on demand, and sphinx-thebe 0.3 declares its configuration script
twice per page (a duplicate ``const`` that stops the page's later scripts). So its
page-time hooks are disconnected here; its CSS is harmless and stays.
"""


def setup(app):
    for event in ("env-before-read-docs", "doctree-resolved"):
        for listener in list(app.events.listeners.get(event, [])):
            if getattr(listener.handler, "__module__", "") == "sphinx_thebe":
                app.disconnect(listener.id)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
