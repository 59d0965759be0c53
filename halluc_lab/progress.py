"""Progress bars for long loops: live in JupyterLab and terminals, silent in batch runs.

Batch runs (the test harness, ``scripts/reproduce.py``) set ``HALLUC_BATCH=1``: a
progress bar there would only leave widget state or carriage-return noise in the
committed notebooks, so it is switched off; under ``torchrun`` only rank 0 shows one. Everywhere
else this is ``tqdm.auto``, imported only then: importing it without ipywidgets prints a warning
into the output.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from tqdm.std import tqdm as plain_tqdm

ENV_BATCH = "HALLUC_BATCH"


def in_batch() -> bool:
    """True when running under the test harness or the reproduce script."""
    return os.environ.get(ENV_BATCH, "") not in ("", "0")


def silent_rank() -> bool:
    """True in a process that ``torchrun`` started with a rank other than 0: only rank 0 shows
    progress."""
    return os.environ.get("RANK", "0") != "0"


def progress(iterable: Iterable | None = None, **kwargs) -> plain_tqdm:
    """``tqdm(iterable, **kwargs)``, disabled in batch runs:
    ``for step in progress(range(n), desc="train")``."""
    kwargs.setdefault("dynamic_ncols", True)
    if in_batch() or silent_rank():
        return plain_tqdm(iterable, **{**kwargs, "disable": True})
    from tqdm.auto import tqdm  # a widget in JupyterLab, text in a terminal

    return tqdm(iterable, **kwargs)
