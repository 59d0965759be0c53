"""Several processes on one NVIDIA GPU at once: CUDA's Multi-Process Service (MPS).

Not Apple's Metal Performance Shaders (torch's ``mps`` device): this is NVIDIA's service that lets
the CUDA work of several processes share a GPU.

Why. The lab trains a chapter's seeds in several processes at once (``recipes.prefetch``), and
``scripts/reproduce.py --jobs`` runs several chapters at once. Each process's steps are small and
launch-bound, so one process leaves most of the GPU's multiprocessors idle. Without MPS the GPU
time-slices between the processes' contexts: the kernels of two processes never run at the same
time, however few multiprocessors each one fills. Under MPS one server holds a single context for
all of them, and their kernels run side by side. The kernels are the same ones, so the numbers are
too: trained weights are bit-identical with and without it (book/results/training.md, "Several
processes on one GPU").

How. :func:`mps_service` starts a private MPS control daemon (``nvidia-cuda-mps-control -d``) with
its pipe and log folders in a folder of the caller's, sets ``CUDA_MPS_PIPE_DIRECTORY`` and
``CUDA_MPS_LOG_DIRECTORY`` in this process's environment so that every process started inside the
``with`` block is a client of it, and on leaving the block stops the daemon and restores the
environment. Start it before this process touches CUDA: a process that made its CUDA context
earlier is not a client. Keep the folder's path short: the daemon's socket lives there, and a
socket's path has a limit of about a hundred characters. It changes no setting of the GPU (compute
mode, clocks, persistence)::

    with mps_service(Path(tempfile.mkdtemp())):
        subprocess.run([...])  # the CUDA processes started here share the GPU through MPS
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CONTROL = "nvidia-cuda-mps-control"
ENV_PIPE, ENV_LOG = "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"
QUIT_SECONDS = 120  # "quit" waits for the server's clients to end


class MPSUnavailable(RuntimeError):
    """The service cannot start here: no NVIDIA driver's control program, or it refused to start."""


def control_program() -> str:
    """The path of ``nvidia-cuda-mps-control``, shipped with NVIDIA's driver (MPSUnavailable where
    there is none)."""
    program = shutil.which(CONTROL)
    if program is None:
        raise MPSUnavailable(f"{CONTROL} is not on PATH: MPS comes with NVIDIA's driver "
                             "(it needs a CUDA GPU)")
    return program


@contextmanager
def mps_service(folder: Path) -> Iterator[dict[str, str]]:
    """A private MPS daemon for the block; yields the variables its clients need (already set in
    ``os.environ`` for the block). The daemon is stopped on leaving, an exception included."""
    program = control_program()
    env = {ENV_PIPE: str(folder / "pipe"), ENV_LOG: str(folder / "log")}
    for path in env.values():
        Path(path).mkdir(parents=True, exist_ok=True)
    started = subprocess.run([program, "-d"], env=os.environ | env, capture_output=True, text=True)
    if started.returncode != 0:
        said = (started.stderr or started.stdout).strip() or "no message"
        raise MPSUnavailable(f"{CONTROL} -d exited with {started.returncode}: {said} "
                             f"(its log: {env[ENV_LOG]})")
    before = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield env
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        _quit(program, env)


def _quit(program: str, env: dict[str, str]) -> None:
    """Stop the daemon; say how to stop it by hand if it has not stopped in ``QUIT_SECONDS``."""
    try:
        subprocess.run([program], input="quit\n", env=os.environ | env, capture_output=True,
                       text=True, timeout=QUIT_SECONDS)
    except subprocess.TimeoutExpired:
        print(f"the MPS daemon did not stop within {QUIT_SECONDS} s (is a client still running?); "
              f"stop it with: echo quit | {ENV_PIPE}={env[ENV_PIPE]} {CONTROL}",
              file=sys.stderr, flush=True)
