"""A chapter's footer records the hash of every module its trained models' keys cover, so a later code state
can say which committed chapters would train again, and why."""

from pathlib import Path

import nbformat
from halluc_lab.recipes import code_trees
from halluc_lab.book.notebook import stale_footers
from halluc_lab.recipes.cache_key import FORMAT_VERSION


def _glued(name, value):
    return nbformat.v4.new_output("display_data", data={"application/papermill.record/text/plain": repr(value)},
                                  metadata={"scrapbook": {"name": name, "mime_prefix": "application/papermill.record/"}})


def _book(root: Path, chapters: dict) -> Path:
    (root / "notebooks").mkdir(parents=True)
    (root / "_toc.yml").write_text("root: intro\nchapters:\n" + "".join(f"- file: notebooks/{s}\n" for s in chapters))
    for stem, glue in chapters.items():
        cell = nbformat.v4.new_code_cell("hl.footer(rt)", outputs=[_glued(k, v) for k, v in glue.items()])
        nbformat.write(nbformat.v4.new_notebook(cells=[cell]), root / "notebooks" / f"{stem}.ipynb")
    return root


def test_a_footer_is_stale_exactly_when_a_module_its_keys_cover_moved(tmp_path, monkeypatch):
    modules = {m: code_trees.module_hash(m) for m in ("halluc_lab.training.losses", "halluc_lab.training.train")}
    root = _book(tmp_path, {
        "01_fresh": {"run_recipes": "a:1", "run_code": {"format": FORMAT_VERSION, "modules": modules}},
        "02_trains_nothing": {"run_recipes": ""},
        "03_old_footer": {"run_recipes": "a:1"},
        "04_old_format": {"run_recipes": "a:1", "run_code": {"format": FORMAT_VERSION - 1, "modules": modules}},
        "05_moved": {"run_recipes": "a:1", "run_code": {"format": FORMAT_VERSION,
                                                        "modules": {**modules, "halluc_lab.training.train": "0" * 16}}},
    })
    assert stale_footers(root) == {"03_old_footer": ["(no module hashes recorded)"],
                                   "04_old_format": [f"(cache format {FORMAT_VERSION - 1})"],
                                   "05_moved": ["halluc_lab.training.train"]}
    real = code_trees.read_source
    monkeypatch.setattr(code_trees, "read_source",
                        lambda m: real(m) + "\nEXTRA = 1\n" if m == "halluc_lab.training.losses" else real(m))
    assert stale_footers(root)["01_fresh"] == ["halluc_lab.training.losses"]


def test_the_committed_book_is_read_and_only_its_chapters_are_named():
    from halluc_lab.book.notebook import toc_notebooks

    root = Path(__file__).resolve().parents[2]
    stale = stale_footers(root)
    assert set(stale) <= set(toc_notebooks(root)) and all(stale.values())


def test_glued_values_read_back_nan_and_inf_but_nothing_else_that_is_not_a_literal():
    import math

    from halluc_lab.book.notebook import read_glue

    cell = nbformat.v4.new_code_cell("", outputs=[_glued("rates", [float("nan"), 0.5, float("-inf")])])
    rates = read_glue(nbformat.v4.new_notebook(cells=[cell]))["rates"]
    assert math.isnan(rates[0]) and rates[1:] == [0.5, float("-inf")]
    bad = nbformat.v4.new_output("display_data", data={"application/papermill.record/text/plain": "open('x')"},
                                 metadata={"scrapbook": {"name": "x", "mime_prefix": "application/papermill.record/"}})
    try:
        read_glue(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("", outputs=[bad])]))
    except ValueError as e:
        assert "not a plain Python literal" in str(e)
    else:
        raise AssertionError("a call was read as a glued value")
