"""Test-wide settings: batch mode, a fresh recipe cache, and GPU-only tests skipped without CUDA."""

import json
import os
import re
import tempfile
from pathlib import Path

import pytest

from tests.chapters import SMOKE_TIMES, chapter_modules

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pytest_configure(config):
    # Set before any kernel starts (papermill and nbval kernels inherit the environment):
    # no progress bars in recorded outputs, legends checked against their data, and a recipe
    # cache of this run's own, so that every test run trains what it uses from scratch.
    # MPLBACKEND stays unset: kernels then draw with the inline backend, as a reader's do (with
    # Agg, plt.show() draws nothing).
    os.environ["HALLUC_BATCH"] = "1"
    os.environ["HALLUC_CHECK_FIGURES"] = "1"  # legends over data, tick labels that meet: warn
    os.environ.pop("MPLBACKEND", None)
    os.environ.setdefault("HALLUC_CACHE", tempfile.mkdtemp(prefix="halluc-cache-"))
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    if not hasattr(config, "workerinput"):  # the main process (pytest-xdist's workers have workerinput)
        for old in SMOKE_TIMES.glob("*.json"):  # the previous test run's smoke-run times
            old.unlink()


def pytest_terminal_summary(terminalreporter):
    """Which committed chapters' footers are stale (it never fails the run: the chapters are re-run on a GPU),
    and how long each chapter's smoke run took, whichever worker ran it (the main process sees no test)."""
    _report_stale_footers(terminalreporter)
    runs = sorted((json.loads(p.read_text()) for p in SMOKE_TIMES.glob("*.json")), key=lambda r: r["stem"])
    if not runs:
        return
    terminalreporter.write_sep("-", "notebook smoke runs (papermill)")
    for run in runs:
        terminalreporter.write_line(f"{run['seconds']:7.1f} s  {run['stem']}")
    (SMOKE_TIMES.parent / "notebook-times.json").write_text(json.dumps({r["stem"]: r["seconds"] for r in runs}, indent=1))


def _report_stale_footers(terminalreporter):
    try:
        from halluc_lab.book.notebook import stale_footers

        stale = stale_footers(Path(ROOT))
    except Exception as e:  # noqa: BLE001 - a report, never a failure of the run
        terminalreporter.write_line(f"stale footers not checked ({type(e).__name__}: {e})")
        return
    if stale:
        terminalreporter.write_sep("-", "chapters whose committed footers are stale (a full-scale run refreshes them)")
        for stem, moved in stale.items():
            terminalreporter.write_line(f"{stem}: {', '.join(m.removeprefix('halluc_lab.') for m in moved)}")


def nbval_checks_outputs(path: Path) -> bool:
    """Whether nbval compares any cell of the notebook at ``path`` with its committed output under
    ``--nbval-lax``: a code cell marked ``# NBVAL_CHECK_OUTPUT`` or tagged ``nbval-check-output``
    (read with nbval's own marker parsers)."""
    import nbformat
    from nbval.plugin import find_comment_markers, find_metadata_tags

    nb = nbformat.read(path, as_version=4)
    return any(dict([*find_comment_markers(c.source), *find_metadata_tags(c.metadata)]).get("check")
               for c in nb.cells if c.cell_type == "code")


def nbval_repeats_smoke_run(path: Path, cuda: bool) -> bool:
    """Whether nbval's run of a chapter notebook would only repeat its papermill smoke run: no cell of it is
    compared (:func:`nbval_checks_outputs`), and without CUDA, where its ``scale="auto"`` is the smoke scale the
    papermill run (``test_smoke_run_is_clean``, which fails on any error or warning) executes it at. On a GPU
    nbval runs it at full scale, a different run, and keeps it."""
    return not cuda and path.suffix == ".ipynb" and not nbval_checks_outputs(path)


def pytest_collection_modifyitems(config, items):
    import torch

    cuda = torch.cuda.is_available()
    # nbval's runs that only repeat a papermill smoke run (nbval_repeats_smoke_run) are deselected
    chapters, repeats = Path(ROOT) / "notebooks", {}
    for item in items:
        if item.path.suffix == ".ipynb" and item.path.parent == chapters and item.path not in repeats:
            repeats[item.path] = nbval_repeats_smoke_run(item.path, cuda)
    dropped = [item for item in items if repeats.get(item.path)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if not repeats.get(item.path)]
    if cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# -- two workers (pytest-xdist) -------------------------------------------------------------------------------
CHAPTER_OF = chapter_modules()  # a chapter's test module -> the notebook it reads


def _chapter_unit(stem: str) -> str:
    # Chapters 8 on share the SFT models: they run on one worker, in book order, so each model is trained once
    # by the chapter that introduces it and no worker waits on the other's lock for most of its run.
    return "chapters 8-" if int(stem[:2]) >= 8 else stem


def work_unit(nodeid: str) -> str:
    """The tests that must run on one worker, named. A session or module fixture is made once per worker, so a
    chapter's papermill run, its nbval run and every test reading them go together (the notebook's stem; chapters
    8 on all together), and so do the book's tests (one build); any other test stays with its file.

    >>> work_unit("notebooks/03_sampling.ipynb::Cell 3"), work_unit("tests/notebooks/test_sampling.py::test_x")
    ('03_sampling', '03_sampling')
    >>> work_unit("tests/notebooks/test_every_notebook.py::test_smoke_run_is_clean[09_preference]")
    'chapters 8-'
    >>> work_unit("tests/book/test_book.py::test_y"), work_unit("tests/unit/test_engine.py::test_z[1]")
    ('book', 'tests/unit/test_engine.py')
    """
    path = nodeid.split("::", 1)[0]
    if path.endswith(".ipynb") and Path(path).stem in CHAPTER_OF.values():  # nbval's cells
        return _chapter_unit(Path(path).stem)
    if path in CHAPTER_OF:
        return _chapter_unit(CHAPTER_OF[path])
    stem = re.search(r"\[([^\]]+)\]$", nodeid)
    if path == "tests/notebooks/test_every_notebook.py" and stem and stem.group(1) in CHAPTER_OF.values():
        return _chapter_unit(stem.group(1))
    return "book" if path.startswith("tests/book/") else path


def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist hands each worker whole work units (:func:`work_unit`), as its ``loadscope`` does files."""
    from xdist.scheduler import LoadScopeScheduling

    class ByWorkUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return ByWorkUnit(config, log)
