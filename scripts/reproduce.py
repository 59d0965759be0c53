"""Re-execute every chapter of the book with papermill, and build a book from the runs.

    python scripts/reproduce.py                      # scale=auto into _build/runs, then a book
    python scripts/reproduce.py --scale full --out /tmp/runs --only 03_sampling --no-book
    python scripts/reproduce.py --adopt /tmp/runs    # copy full-scale runs over notebooks/

Runs never write over the committed notebooks; only ``--adopt`` does, and only with
runs whose metadata says they were made at scale=full (ARCHITECTURE.md §3).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import papermill

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from halluc_lab.notebook import RUN_KEYS, read_glue, toc_notebooks  # noqa: E402


def run(stem: str, out: Path, scale: str, seed: int) -> float:
    """Execute one chapter into ``out`` and record its run in the notebook's metadata."""
    target = out / f"{stem}.ipynb"
    start = time.perf_counter()
    papermill.execute_notebook(str(ROOT / "notebooks" / f"{stem}.ipynb"), str(target),
                               parameters={"scale": scale, "seed": seed},
                               cwd=str(ROOT / "notebooks"), progress_bar=False)
    seconds = time.perf_counter() - start
    nb = nbformat.read(target, as_version=4)
    glued = read_glue(nb)
    # The parameters papermill injected live in the metadata instead: the committed notebook
    # keeps scale="auto", so that a reader's (or nbval's) re-run picks the scale for its device.
    nb.cells = [c for c in nb.cells if "injected-parameters" not in c.metadata.get("tags", [])]
    nb.metadata["halluc_lab"] = {key: glued[f"run_{key}"] for key in RUN_KEYS}
    nb.metadata["halluc_lab"].update(parameters={"scale": scale, "seed": seed}, seconds=round(seconds, 1))
    nb.metadata.pop("papermill", None)  # papermill's own record names the temporary paths
    nbformat.write(nb, target)
    return seconds


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


def adopt(runs: Path, stems: list[str]) -> None:
    """Copy full-scale runs over the committed notebooks."""
    for stem in stems:
        source = runs / f"{stem}.ipynb"
        if not source.exists():
            print(f"skip {stem}: no run in {runs}")
            continue
        meta = nbformat.read(source, as_version=4).metadata.get("halluc_lab", {})
        if meta.get("scale") != "full":
            raise SystemExit(f"{source} was run at scale={meta.get('scale')!r}; only full-scale runs are adopted")
        shutil.copy2(source, ROOT / "notebooks" / source.name)
        print(f"adopted {stem}: {meta}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", default="auto", choices=["auto", "smoke", "full"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "_build" / "runs")
    parser.add_argument("--only", nargs="*", help="notebook stems to run (default: every chapter)")
    parser.add_argument("--no-book", action="store_true", help="skip building a book from the runs")
    parser.add_argument("--adopt", type=Path, metavar="RUNS", help="copy full-scale runs over notebooks/")
    args = parser.parse_args()

    stems = toc_notebooks(ROOT)
    unknown = set(args.only or []) - set(stems)
    if unknown:
        raise SystemExit(f"not in _toc.yml: {sorted(unknown)}; chapters are {stems}")
    stems = [s for s in stems if not args.only or s in args.only]
    if args.adopt:
        adopt(args.adopt, stems)
        return

    os.environ["HALLUC_BATCH"] = "1"  # no progress bars in recorded outputs
    os.environ.pop("MPLBACKEND", None)  # the kernels' inline backend: with Agg, plt.show() records no figure
    if args.out.resolve() == (ROOT / "notebooks").resolve():
        raise SystemExit("--out must not be notebooks/: runs never overwrite committed notebooks")
    args.out.mkdir(parents=True, exist_ok=True)
    times, failed = {}, []
    for stem in stems:
        print(f"running {stem} at scale={args.scale} ...", flush=True)
        try:
            times[stem] = round(run(stem, args.out, args.scale, args.seed), 1)
        except papermill.PapermillExecutionError as err:  # keep going: the other chapters still run
            failed.append(stem)
            print(f"  FAILED in cell {err.exec_count}: {err.ename}: {err.evalue}", flush=True)
            continue
        print(f"  {times[stem]:.1f} s", flush=True)
        (args.out / "times.json").write_text(json.dumps(times, indent=1))
    if failed:
        raise SystemExit(f"failed: {failed} (their partial runs are in {args.out})")
    if not args.no_book:
        print(f"book: {build_book(args.out) / 'index.html'}")


if __name__ == "__main__":
    main()
