"""Test-wide settings: batch mode, a fresh recipe cache, and GPU-only tests skipped without CUDA."""

import os
import tempfile

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


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
