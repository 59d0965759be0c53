"""Notebook plumbing shared by every chapter: the run footer (DESIGN.md §3).

The last cell of every chapter calls :func:`footer`. It shows the run's device,
scale, seed, library version and date, and glues them (``run_device``, ...) so
that ``scripts/reproduce.py`` can copy them into the notebook's metadata.
"""

from __future__ import annotations

import datetime
import platform

import torch

from halluc_lab.device import Runtime

RUN_KEYS = ("device", "scale", "seed", "version", "torch", "date")


def run_metadata(rt: Runtime) -> dict[str, str | int]:
    """What a run records about itself: device, scale, seed, versions and date."""
    from halluc_lab import __version__

    name = rt.device.type
    if rt.device.type == "cuda":
        name = f"cuda ({torch.cuda.get_device_name(rt.device)})"
    elif rt.device.type == "cpu":
        name = f"cpu ({platform.machine()})"
    return {
        "device": name,
        "scale": rt.scale,
        "seed": rt.seed,
        "version": __version__,
        "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
    }


def footer(rt: Runtime):
    """Glue the run's metadata and return a one-line summary to display."""
    from IPython.display import Markdown
    from myst_nb import glue

    meta = run_metadata(rt)
    for key, value in meta.items():
        glue(f"run_{key}", value, display=False)
    return Markdown(
        f"<small>Run on **{meta['device']}** at scale **{meta['scale']}**, seed {meta['seed']}, "
        f"halluc_lab {meta['version']}, torch {meta['torch']}, {meta['date']}.</small>"
    )
