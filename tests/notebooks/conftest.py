"""Execute chapter notebooks with papermill at scale=smoke and read back what they glued.

Each notebook has a test module beside this file that sets ``NOTEBOOK = "NN_topic"`` and
asserts on the ``glue`` fixture: the values the notebook recorded with ``myst_nb.glue``.
The expectations live in those test modules, never in the notebooks (ARCHITECTURE.md §6).
Every notebook runs once per session, however many tests read it.
"""

import pytest

from tests.notebooks.harness import run_notebook


@pytest.fixture(scope="session")
def notebook_run(tmp_path_factory):
    """``notebook_run(stem) -> NotebookRun``, executed once per session."""
    out_dir = tmp_path_factory.mktemp("executed")
    return lambda stem: run_notebook(stem, out_dir)


@pytest.fixture(scope="module")
def glue(request, notebook_run) -> dict:
    """What the module's ``NOTEBOOK`` glued when run at scale=smoke."""
    stem = getattr(request.module, "NOTEBOOK", None)
    if stem is None:
        pytest.fail(f"{request.module.__name__} must set NOTEBOOK = 'NN_topic'")
    return notebook_run(stem).glue
