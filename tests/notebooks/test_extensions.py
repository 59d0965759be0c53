"""Chapter 12's opening page (notebooks/12_extensions.ipynb) at scale=smoke: the chapter's
introduction and its pre-registered contrasts, and a link to each of its five topic pages, which run
the experiments and have test modules of their own (tests/notebooks/test_extensions_*.py). The page
itself trains and loads nothing."""

import re

import nbformat
import pytest
import yaml

from tests.chapters import ROOT, chapter_modules
from tests.notebooks.harness import NOTEBOOKS

NOTEBOOK = "12_extensions"
pytestmark = pytest.mark.notebook


def _pages() -> list[str]:
    """The stems _toc.yml lists as the chapter's sections, in book order."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    chapter = next(c for part in toc["parts"] for c in part["chapters"]
                   if c["file"] == f"notebooks/{NOTEBOOK}")
    return [s["file"].removeprefix("notebooks/") for s in chapter["sections"]]


def _markdown(stem: str) -> str:
    nb = nbformat.read(NOTEBOOKS / f"{stem}.ipynb", as_version=4)
    return "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")


def test_the_opening_page_links_its_pages_in_book_order_and_each_links_back():
    pages = _pages()
    assert len(pages) == 5
    assert re.findall(r"\{doc\}`(12\w+)`", _markdown(NOTEBOOK)) == pages
    for stem in pages:
        assert f"{{doc}}`{NOTEBOOK}`" in _markdown(stem), stem
        assert stem in chapter_modules().values(), f"no test module reads {stem}"


def test_the_opening_page_trains_and_loads_nothing(glue):
    assert glue["run_scale"] == "smoke" and not glue["run_recipes"]
    assert "preregistered_contrasts" not in glue  # each topic page glues its own
