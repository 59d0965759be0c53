"""Test-wide settings: batch mode, a fresh recipe cache, and GPU-only tests skipped without CUDA."""

import os
import tempfile
from pathlib import Path

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pytest_configure(config):
    # Set before any kernel starts (papermill and nbval kernels inherit the environment):
    # no progress bars in recorded outputs, and a recipe cache of this run's own, so that
    # every test run trains what it uses from scratch. MPLBACKEND stays unset: kernels then
    # draw with the inline backend, as a reader's do (with Agg, plt.show() draws nothing).
    os.environ["HALLUC_BATCH"] = "1"
    os.environ.pop("MPLBACKEND", None)
    os.environ.setdefault("HALLUC_CACHE", tempfile.mkdtemp(prefix="halluc-cache-"))
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")


def _worker_group(item) -> str:
    """Which tests must share a pytest-xdist worker (``--dist loadgroup``): a session or module fixture is made once
    per worker, so a chapter's papermill run, its nbval run and every test reading them go together (keyed by the
    notebook's stem), as do the book's tests (one build); any other test stays with its file."""
    path = Path(str(item.path)).resolve()
    if path.suffix == ".ipynb":  # nbval's cells
        return path.stem
    stem = getattr(item, "callspec", None) and item.callspec.params.get("stem")
    stem = stem or getattr(getattr(item, "module", None), "NOTEBOOK", None)
    if stem:
        return stem
    if Path(ROOT, "tests", "book") in path.parents:
        return "book"
    return str(path.relative_to(ROOT))


def pytest_collection_modifyitems(config, items):
    import torch

    for item in items:
        item.add_marker(pytest.mark.xdist_group(_worker_group(item)))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
