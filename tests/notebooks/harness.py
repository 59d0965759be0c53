"""Helpers of the notebook tests: the notebooks the book lists, papermill runs, glued values."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat
import papermill

from halluc_lab.book import notebook
from halluc_lab.book.notebook import read_glue
from tests.chapters import ROOT, SMOKE_TIMES

NOTEBOOKS = ROOT / "notebooks"


def toc_files() -> list[str]:
    """Every page of the book, root first."""
    return notebook.toc_files(ROOT)


def toc_notebooks() -> list[str]:
    """The chapter notebooks, in book order."""
    return notebook.toc_notebooks(ROOT)


@dataclass
class NotebookRun:
    """One papermill execution of a chapter at scale=smoke."""

    stem: str
    path: Path  # the executed copy, in a temporary folder
    nb: nbformat.NotebookNode
    glue: dict
    seconds: float


_RUNS: dict[str, NotebookRun] = {}


def run_notebook(stem: str, out_dir: Path) -> NotebookRun:
    """Execute ``notebooks/<stem>.ipynb`` at scale=smoke (once per session)."""
    if stem not in _RUNS:
        source = NOTEBOOKS / f"{stem}.ipynb"
        if not source.exists():
            raise FileNotFoundError(f"{source} does not exist")
        target = out_dir / f"{stem}.ipynb"
        start = time.perf_counter()
        papermill.execute_notebook(str(source), str(target), parameters={"scale": "smoke"},
                                   cwd=str(NOTEBOOKS), progress_bar=False, log_output=False)
        seconds = time.perf_counter() - start
        SMOKE_TIMES.mkdir(parents=True, exist_ok=True)  # whichever worker runs it
        (SMOKE_TIMES / f"{stem}.json").write_text(json.dumps({"stem": stem, "seconds": round(seconds, 1)}))
        nb = nbformat.read(target, as_version=4)
        _RUNS[stem] = NotebookRun(stem, target, nb, read_glue(nb), seconds)
    return _RUNS[stem]


def interval(triple, low=-math.inf, high=math.inf):
    """The estimate of a glued ``[estimate, low, high]``, checked to be ordered and within [low, high]."""
    est, lo, hi = triple
    assert low - 1e-12 <= lo <= est <= hi <= high + 1e-12
    return est


def preregistered(glue: dict, predicted: dict[str, str], seeds: int,
                  same_as: dict[str, str] | None = None) -> dict:
    """The glued ``preregistered_contrasts``, checked: the labels of ``predicted`` in its order, each
    with its predicted direction, a finite ordered interval, a side and ``seeds`` seeds; and each
    label of ``same_as`` with the same interval as the glued value it names, the one the chapter's
    other tables and verdicts print."""
    records = glue["preregistered_contrasts"]
    assert list(records) == list(predicted)
    for label, r in records.items():
        assert r["predicted"] == predicted[label], label
        assert all(math.isfinite(r[k]) for k in ("estimate", "low", "high")), label
        assert r["low"] <= r["estimate"] <= r["high"], label
        assert r["side"] in (-1, 0, 1) and r["seeds"] == seeds, label
    for label, name in (same_as or {}).items():
        assert glued_interval(records[label]) == glue[name], label
    return records


def glued_interval(record: dict) -> list[float]:
    """A glued contrast record's interval as the chapters glue one: ``[estimate, low, high]``."""
    return [record[k] for k in ("estimate", "low", "high")]
