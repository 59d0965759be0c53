"""Re-execute every chapter of the book with papermill, and build a book from the runs.

    python scripts/reproduce.py                      # scale=auto into _build/runs, then a book
    python scripts/reproduce.py --scale full --out /tmp/runs --only 03_sampling --no-book
    python scripts/reproduce.py --scale full --jobs 12 --no-book   # every chapter at once, GPUs in turn
    python scripts/reproduce.py --adopt /tmp/runs    # copy full-scale runs over notebooks/

``--scale full`` where the chapters would run on the CPU stops with an estimate unless ``--yes``
is given.

Runs never write over the committed notebooks; only ``--adopt`` does, and only with runs whose
own record says they were made at scale=full (ARCHITECTURE.md §3): the values the footer glued
when the run executed (``halluc_lab.book.notebook.RUN_KEYS``), never the notebook's metadata, which
a notebook executed by papermill alone keeps from the committed run. A run with no record of
its own, or the committed run's record (``run_finished`` unchanged), is refused.

``--jobs N`` runs N chapters at once, each in its own process, the longest (by the committed run's
time) first. The chapters share the recipe cache, whose entries are locked while they train: a chapter
that needs a model another chapter is training waits for it and then reads it. On a machine with several
GPUs the chapters take them in turn (chapter i sees the GPUs rotated to start at GPU i mod n, so its own
work and the first of its spread-out seeds land there). The models are small and their steps launch-bound,
so chapters at once also help on one GPU. ``times.json`` gets each chapter's time and the book's.

``--mps`` runs the chapters under a private CUDA MPS daemon (``halluc_lab.shared_gpu``), so that the
kernels of chapters, and of the seeds they train in processes of their own, run side by side on a GPU
instead of taking turns; the numbers are the same. It needs NVIDIA's driver and stops with a message
where there is none.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import papermill
from jupyter_client.manager import AsyncKernelManager
from traitlets import default

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from halluc_lab.book.notebook import RUN_KEYS, read_glue, toc_notebooks  # noqa: E402
from halluc_lab.shared_gpu import MPSUnavailable, control_program, mps_service  # noqa: E402


NOTEBOOKS = ROOT / "notebooks"


class LocalKernelManager(AsyncKernelManager):
    """The kernel manager of every run: the kernel talks to it over local (IPC) sockets, never TCP.
    Over TCP ipykernel warns on every run that the connection is not encrypted; an encrypted TCP
    connection (CurveZMQ) logged an error instead when the kernel shut down."""

    @default("transport")
    def _local(self) -> str:
        return "ipc"

    @default("ip")
    def _own_sockets(self) -> str:  # a folder of its own: kernels run at once must not share sockets
        return os.path.join(tempfile.mkdtemp(prefix="halluc-kernel-"), "kernel")


def declares(stem: str, name: str, notebooks: Path = NOTEBOOKS) -> bool:
    """Whether a chapter's parameters cell (its first code cell) sets ``name``."""
    nb = nbformat.read(notebooks / f"{stem}.ipynb", as_version=4)
    first = next(c for c in nb.cells if c.cell_type == "code")
    return any(line.split("=")[0].strip() == name for line in first.source.splitlines() if "=" in line)


def run(stem: str, out: Path, scale: str, seed: int, at_once: int = 1, notebooks: Path = NOTEBOOKS,
        seeds: list[int] | None = None, extra: dict | None = None) -> float:
    """Execute ``notebooks/<stem>.ipynb`` into ``out`` and record its run in the notebook's metadata (``at_once``:
    how many chapters ran at the same time, so that its time is read as what it is; ``seeds``: the training seeds
    of the chapter's compared models, e.g. a second seed set for replication, else the chapter's default; ``extra``:
    further parameters of the chapter, recorded with the others)."""
    target = out / f"{stem}.ipynb"
    start = time.perf_counter()
    parameters = ({"scale": scale, "seed": seed} | ({"seeds": list(seeds)} if seeds is not None else {})
                  | (extra or {}))
    papermill.execute_notebook(str(notebooks / f"{stem}.ipynb"), str(target), parameters=parameters,
                               cwd=str(notebooks), progress_bar=False,
                               kernel_manager_class=LocalKernelManager)
    seconds = time.perf_counter() - start
    nb = nbformat.read(target, as_version=4)
    glued = read_glue(nb)
    # The parameters papermill injected live in the metadata instead: the committed notebook
    # keeps scale="auto", so that a reader's (or nbval's) re-run picks the scale for its device.
    nb.cells = [c for c in nb.cells if "injected-parameters" not in c.metadata.get("tags", [])]
    nb.metadata["halluc_lab"] = {key: glued[f"run_{key}"] for key in RUN_KEYS}
    nb.metadata["halluc_lab"].update(parameters=parameters, seconds=round(seconds, 1))
    if at_once > 1:
        nb.metadata["halluc_lab"]["chapters_at_once"] = at_once
    nb.metadata.pop("papermill", None)  # papermill's own record names the temporary paths
    nbformat.write(nb, target)
    return seconds


def committed_seconds(stem: str, notebooks: Path = NOTEBOOKS) -> float:
    """How long the committed run of a chapter took (0 if it records none)."""
    meta = nbformat.read(notebooks / f"{stem}.ipynb", as_version=4).metadata.get("halluc_lab", {})
    return float(meta.get("seconds") or 0)


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` names them (none without CUDA)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [g.strip() for g in listed.split(",") if g.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def gpu_order(i: int, gpus: list[str]) -> str | None:
    """``CUDA_VISIBLE_DEVICES`` for the i-th chapter started: every GPU, rotated to start at GPU i mod n.

    >>> [gpu_order(i, ["0", "1", "2"]) for i in range(4)]
    ['0,1,2', '1,2,0', '2,0,1', '0,1,2']
    >>> gpu_order(5, []) is None
    True
    """
    if not gpus:
        return None
    k = i % len(gpus)
    return ",".join(gpus[k:] + gpus[:k])


def _run_chapter(stem: str, out: Path, scale: str, seed: int, at_once: int, gpus: str | None, notebooks: Path,
                 seeds: list[int] | None = None):
    """One chapter in a worker process, on the GPUs ``gpus``: (seconds, None) or (None, the error)."""
    if gpus is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpus  # the kernel papermill starts inherits it
    if at_once > 1:  # in a worker process: the kernel's share of the cores (torch takes them all by
        # default; a GPU recipe's key holds no thread count). One chapter alone keeps torch's default,
        # and the calling process's environment is left as it was.
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // at_once)))
    try:
        return run(stem, out, scale, seed, at_once, notebooks, seeds), None
    except papermill.PapermillExecutionError as err:
        return None, f"cell {err.exec_count}: {err.ename}: {err.evalue}"
    except KeyError as err:  # run() found no footer value
        return None, f"its footer: no glued value {err}"
    except Exception as err:  # noqa: BLE001 - a dead kernel, a missing notebook: this chapter only
        return None, f"{type(err).__name__}: {err}"


def run_all(stems: list[str], out: Path, scale: str, seed: int, jobs: int,
            notebooks: Path = NOTEBOOKS, seeds: list[int] | None = None) -> tuple[dict[str, float], list[str]]:
    """Run the chapters, ``jobs`` at a time; the times of those that ran, the stems of those that failed."""
    times, failed = {}, []

    def record(stem: str, seconds: float | None, error: str | None) -> None:
        if error is not None:  # keep going: the other chapters still run
            failed.append(stem)
            print(f"{stem}: FAILED in {error} (its partial run is in {out})", flush=True)
            return
        times[stem] = round(seconds, 1)
        print(f"{stem}: {seconds:.1f} s", flush=True)
        (out / "times.json").write_text(json.dumps(times, indent=1))

    if jobs == 1:
        for stem in stems:
            print(f"running {stem} at scale={scale} ...", flush=True)
            record(stem, *_run_chapter(stem, out, scale, seed, 1, None, notebooks, seeds))
        return times, failed
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    order = sorted(stems, key=lambda s: committed_seconds(s, notebooks), reverse=True)  # the longest first
    gpus = visible_gpus()
    print(f"running {len(order)} chapters at scale={scale}, {jobs} at a time"
          + (f", on {len(gpus)} GPU{'s' * (len(gpus) > 1)}" if gpus else ""), flush=True)
    # spawn: a fresh interpreter per worker, each setting its own CUDA_VISIBLE_DEVICES before a chapter starts
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(_run_chapter, stem, out, scale, seed, jobs, gpu_order(i, gpus), notebooks, seeds): stem
                   for i, stem in enumerate(order)}
        for future in as_completed(futures):
            try:
                result = future.result()
            except Exception as err:  # noqa: BLE001 - the worker process itself died
                result = None, f"its worker: {type(err).__name__}: {err}"
            record(futures[future], *result)
    return times, failed


def build_book(runs: Path) -> Path:
    """A copy of the book's sources with the executed notebooks, built to HTML."""
    src = runs / "book-src"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    for name in ("_config.yml", "_toc.yml", "book"):
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy2)(ROOT / name, src / name)
    (src / "notebooks").mkdir()
    for nb in runs.glob("*.ipynb"):
        shutil.copy2(nb, src / "notebooks" / nb.name)
    jb = Path(sys.executable).with_name("jupyter-book")
    subprocess.run([str(jb), "build", str(src)], check=True)
    return src / "_build" / "html"


def own_record(nb) -> dict:
    """What a run glued about itself when it executed (``RUN_KEYS``); only the keys it glued."""
    glued = read_glue(nb)
    return {key: glued[f"run_{key}"] for key in RUN_KEYS if f"run_{key}" in glued}


def adopt(runs: Path, stems: list[str], notebooks: Path = NOTEBOOKS) -> None:
    """Copy full-scale runs over the committed notebooks, each with metadata from its own record.

    Every run is checked before any is copied: a run whose record is missing, not at scale=full,
    or the committed notebook's own (the same ``finished``) refuses the whole adoption. Where some
    runs did not reach their footer (a run stopped part-way), the refusal names them all and the
    ``--only`` that adopts the others."""
    if not runs.is_dir():
        raise SystemExit(f"--adopt {runs}: no such folder")
    chosen, unfinished = {}, []
    for stem in stems:
        source = runs / f"{stem}.ipynb"
        if not source.exists():
            print(f"skip {stem}: no run in {runs}")
            continue
        nb = nbformat.read(source, as_version=4)
        record = own_record(nb)
        if record.keys() != set(RUN_KEYS):
            unfinished.append(f"{source} records no run of its own (its footer glued "
                              f"{sorted(record)}, not {list(RUN_KEYS)}): did it run to the end?")
            continue
        if record["scale"] != "full":
            raise SystemExit(f"{source} was run at scale={record['scale']!r} on "
                             f"{record['device']}; only full-scale runs are adopted")
        committed = own_record(nbformat.read(notebooks / source.name, as_version=4))
        if record["finished"] == committed.get("finished"):
            raise SystemExit(f"{source} holds the committed run ({record['finished']}), "
                             "not a new one")
        chosen[stem] = nb, record
    if unfinished:
        others = (f"\nThe runs that finished can be adopted alone: --adopt {runs} --only {' '.join(chosen)}"
                  if chosen else "")
        raise SystemExit("\n".join(unfinished) + others)
    if not chosen:
        raise SystemExit(f"--adopt {runs}: no run of {stems} in it")
    for stem, (nb, record) in chosen.items():
        meta = nb.metadata.get("halluc_lab", {})
        if any(meta.get(key) != value for key, value in record.items()):  # stale: not from run()
            nb.metadata["halluc_lab"] = record
        nbformat.write(nb, notebooks / f"{stem}.ipynb")
        print(f"adopted {stem}: {nb.metadata['halluc_lab']}")


def ask_before_full_on_cpu(stems: list[str]) -> None:
    """Stop, with an estimate, before full-scale chapters run on the CPU the kernels would pick."""
    from halluc_lab.device import choose_device

    device, why = choose_device()  # as each chapter's setup() will: kernels inherit $HALLUC_DEVICE
    if device.type == "cpu":
        gpu = sum(committed_seconds(s) for s in stems) / 60
        raise SystemExit(f"--scale full on the CPU ({why}): these {len(stems)} chapters took "
                         f"{gpu:.0f} minutes on one GPU, and on a CPU pre-training alone takes "
                         "about 50 minutes: expect hours. Pass --yes to go on, or --scale smoke")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", default="auto", choices=["auto", "smoke", "full"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "_build" / "runs")
    parser.add_argument("--only", nargs="*", help="notebook stems to run (default: every chapter)")
    parser.add_argument("--no-book", action="store_true", help="skip building a book from the runs")
    parser.add_argument("--jobs", type=int, default=1, help="chapters at once, each in its own process (default 1)")
    parser.add_argument("--adopt", type=Path, metavar="RUNS", help="copy full-scale runs over notebooks/")
    parser.add_argument("--yes", action="store_true", help="run at --scale full on a CPU (hours)")
    parser.add_argument("--seeds", type=int, nargs="+", metavar="S",
                        help="training seeds of the compared models (chapters 8-12), e.g. a second seed set "
                             "for replication: --seeds 8 9 10 11 12 13 14 15")
    parser.add_argument("--mps", action="store_true",
                        help="share each GPU through a private CUDA MPS daemon (NVIDIA only; same numbers)")
    args = parser.parse_args()

    stems = toc_notebooks(ROOT)
    if args.only is not None and not args.only:
        raise SystemExit("--only needs at least one chapter; leave it out to run every chapter")
    if args.seed < 0:
        raise SystemExit(f"--seed must be >= 0, got {args.seed}")
    unknown = set(args.only or []) - set(stems)
    if unknown:
        raise SystemExit(f"not in _toc.yml: {sorted(unknown)}; chapters are {stems}")
    stems = [s for s in stems if not args.only or s in args.only]
    if args.seeds is not None:
        if min(args.seeds) < 0 or len(set(args.seeds)) != len(args.seeds):
            raise SystemExit(f"--seeds must be distinct and >= 0, got {args.seeds}")
        lacking = [s for s in stems if not declares(s, "seeds")]
        if lacking:
            raise SystemExit(f"--seeds: these chapters have no `seeds` parameter: {lacking} (use --only)")
    if args.jobs < 1:
        raise SystemExit(f"--jobs must be at least 1, got {args.jobs}")
    if args.mps:
        try:
            control_program()
        except MPSUnavailable as err:
            raise SystemExit(f"--mps: {err}") from None
    if args.adopt:
        adopt(args.adopt, stems)
        return
    if args.scale == "full" and not args.yes:
        ask_before_full_on_cpu(stems)

    os.environ["HALLUC_BATCH"] = "1"  # no progress bars in recorded outputs
    os.environ.pop("MPLBACKEND", None)  # the kernels' inline backend: with Agg, plt.show() records no figure
    # Chapter 11's bm25s imports JAX where it is installed, and JAX takes most of a GPU's memory at its first use
    # by default: with chapters running beside it, their allocations (and JAX's own) would fail.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    if args.out.resolve() == NOTEBOOKS.resolve():
        raise SystemExit("--out must not be notebooks/: runs never overwrite committed notebooks")
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    try:  # under --mps the chapters' kernels, and the processes they start, are clients of one daemon
        with mps_service(Path(tempfile.mkdtemp(prefix="halluc-mps-"))) if args.mps else contextlib.nullcontext():
            times, failed = run_all(stems, args.out, args.scale, args.seed, min(args.jobs, len(stems)),
                                    seeds=args.seeds)
    except MPSUnavailable as err:
        raise SystemExit(f"--mps: {err}") from None
    book = time.perf_counter() - start
    print(f"{len(times)} chapter{'s' * (len(times) != 1)} in {book:.1f} s", flush=True)
    (args.out / "times.json").write_text(json.dumps({**times, "book": round(book, 1)}, indent=1))
    if failed:
        raise SystemExit(f"failed: {failed} (their partial runs are in {args.out})")
    if not args.no_book:
        print(f"book: {build_book(args.out) / 'index.html'}")


if __name__ == "__main__":
    main()
