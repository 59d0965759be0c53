"""Keep second full-scale runs of chapters 8-12, and write book/results/replication.md from them.

Each chapter glues its pre-registered contrasts (``preregistered_contrasts``,
:func:`halluc_lab.book.replication.records`). The committed notebook is a chapter's first run. A
second run -- another GPU model, or another set of seeds -- is kept in
``book/results/replication_runs.json``: its records, device, seeds and the digest of the code its
models were trained with (the footer's ``run_code``). The page sets the two side by side:

    python scripts/reproduce.py --scale full --only 12b_sycophancy --seeds 8 9 10 11 12 13 14 15 \\
        --out _build/runs/seeds8 --no-book
    python scripts/replication.py keep _build/runs/seeds8 --only 12b_sycophancy   # into the json
    python scripts/replication.py page                                            # the page

``keep`` refuses a run made at another code state than the committed notebook (its ``run_code``
differs) and a run on the same GPU model that shares a seed with it: neither is a replication.
``page`` compares only the kept runs whose code digest is the committed notebook's; a chapter
re-run since (its footer moved) is listed as not yet run twice in this code state. A verdict is
stable where both runs resolve it the same way; each run keeps its own interval.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from halluc_lab.book.notebook import read_glue  # noqa: E402
from halluc_lab.book.replication import (DIFFERS, GLUE_NAME, STABLE, compare,  # noqa: E402
                                         per_seed_table, table)

CHAPTERS = ("08_sft", "09_preference", "10_rlvr_backtracking", "10b_fair_test",
            "11_hallucination_rag", "12a_continual_learning", "12b_sycophancy", "12c_safety",
            "12d_vision", "12e_icl_cot")
NOTEBOOKS = ROOT / "notebooks"
KEPT = ROOT / "book" / "results" / "replication_runs.json"
PAGE = ROOT / "book" / "results" / "replication.md"


def seeds_used(nb, glued: dict) -> list[int] | None:
    """The training seeds a run used: the ``seeds`` it was given, else the one seed list it glued
    (a ``*_seeds`` value of ``glued``, its :func:`read_glue`), else None."""
    chosen = nb.metadata.get("halluc_lab", {}).get("parameters", {}).get("seeds")
    if chosen is not None:
        return list(chosen)
    lists = {tuple(v) for k, v in glued.items() if k.endswith("_seeds")
             and isinstance(v, list) and v and all(isinstance(x, int) for x in v)}
    return list(lists.pop()) if len(lists) == 1 else None


def code_digest(glued: dict) -> str | None:
    """A digest of the code a run's models were trained with: its footer's ``run_code`` (the hash
    of every module its recipe keys cover), or None for a run whose footer glued none."""
    code = glued.get("run_code")
    if code is None:
        return None
    return hashlib.sha256(json.dumps(code, sort_keys=True).encode()).hexdigest()[:16]


def run_of(nb, glued: dict) -> dict:
    """What the page needs of one chapter's run: device, seeds, date, code digest, records."""
    meta = nb.metadata.get("halluc_lab", {})
    return {"device": str(meta.get("device", "?")), "seeds": seeds_used(nb, glued),
            "date": meta.get("date"), "code": code_digest(glued), "records": glued[GLUE_NAME]}


def read_notebook(folder: Path, stem: str) -> tuple:
    """The executed notebook of ``stem`` in ``folder`` and its glue, checked to be a full-scale
    run with its records."""
    path = folder / f"{stem}.ipynb"
    if not path.exists():
        raise SystemExit(f"missing run: {path}")
    nb = nbformat.read(path, as_version=4)
    glued = read_glue(nb)
    if GLUE_NAME not in glued:
        raise SystemExit(f"{path}: no glued {GLUE_NAME}")
    if glued.get("run_scale", nb.metadata.get("halluc_lab", {}).get("scale")) != "full":
        raise SystemExit(f"{path}: not a full-scale run")
    return nb, glued


def read_chapter(folder: Path, stem: str) -> dict:
    """The run of ``stem`` in ``folder``, as :func:`run_of` gives it."""
    return run_of(*read_notebook(folder, stem))


def load(path: Path = KEPT) -> dict:
    """The kept second runs, chapter -> run (empty when none is kept yet)."""
    return json.loads(path.read_text())["second_runs"] if path.exists() else {}


def keep(folder: Path, stems, notebooks: Path = NOTEBOOKS, path: Path = KEPT) -> list[str]:
    """Keep the runs of ``stems`` in ``folder`` as those chapters' second runs; returns what was
    kept. Each must be of the committed notebook's code state and, on the same GPU model, of
    seeds the committed run did not use."""
    kept, said = load(path), []
    for stem in stems:
        run, first = read_chapter(folder, stem), read_chapter(notebooks, stem)
        if run["code"] is None or run["code"] != first["code"]:
            raise SystemExit(f"{stem}: the run's code ({run['code']}) is not the committed "
                             f"notebook's ({first['code']}); run both in one code state")
        shared = set(run["seeds"] or ()) & set(first["seeds"] or ())
        if run["device"] == first["device"] and (shared or run["seeds"] is None):
            raise SystemExit(f"{stem}: same GPU model and seeds {sorted(shared) or 'unknown'} in "
                             "both runs: the same draw of the training noise, not a replication")
        kept[stem] = run
        said.append(f"{stem}: {run['device']}, seeds {run['seeds']}")
    path.write_text(json.dumps({"second_runs": dict(sorted(kept.items()))}, indent=1,
                               ensure_ascii=False) + "\n")
    return said


def described(runs) -> str:
    """The GPU models and seeds of some chapters' runs (each a :func:`run_of` dict), as the page
    names a run: "cuda (NVIDIA H200); seeds 0, 1, …"."""
    devices = sorted({r["device"] for r in runs})
    seeds = sorted({"the chapter's default seeds" if r["seeds"] is None else
                    "seeds " + ", ".join(map(str, r["seeds"])) for r in runs})
    return f"{' / '.join(devices)}; {' / '.join(seeds)}"


def title(nb, stem: str) -> str:
    """The chapter's title (its first level-1 heading) and its file."""
    heads = [line[2:].strip() for c in nb.cells if c.cell_type == "markdown"
             for line in c.source.splitlines() if line.startswith("# ")]
    return f"{heads[0]} (`{stem}`)" if heads else f"`{stem}`"


def page(notebooks: Path = NOTEBOOKS, path: Path = KEPT) -> str:
    """The replication page's Markdown: every chapter whose kept second run is of its committed
    notebook's code state, its verdicts beside the committed run's."""
    kept = load(path)
    unknown = sorted(set(kept) - set(CHAPTERS))
    if unknown:
        raise SystemExit(f"{path}: chapters must be some of {CHAPTERS}, got {unknown}")
    parts, firsts, seconds, shown, older = [], [], [], [], []
    counts = {STABLE: 0, DIFFERS: 0, "all": 0}
    for stem in CHAPTERS:
        if stem not in kept:
            continue
        nb, glued = read_notebook(notebooks, stem)
        first, second = run_of(nb, glued), kept[stem]
        if first["code"] != second["code"]:
            older.append(stem)
            continue
        rows = compare(first["records"], second["records"])
        counts["all"] += len(rows)
        for r in rows:
            counts[r.status] = counts.get(r.status, 0) + 1
        firsts.append(first)
        seconds.append(second)
        shown.append(stem)
        parts += [f"## {title(nb, stem)}", "", table(rows, "first run", "second run"), "",
                  "Each seed's paired difference, the values each run's interval is made from:", "",
                  per_seed_table(rows, "first run", "second run"), ""]
        if second.get("note"):  # how a second run was kept, where not whole
            parts += [f"The second run was {second['note']}.", ""]
    if not shown:
        raise SystemExit("no chapter has a kept second run of its committed code state")
    pending = [s for s in CHAPTERS if s not in shown]
    head = [
        "# Replication: the pre-registered verdicts of chapters 8–12 in two full runs", "",
        "Same seed, same code and the same GPU model give the same bits: that is reproducibility. "
        "The same conclusion from a fresh draw of the training noise — another GPU model, or "
        "another set of seeds — is replication, and the book calls a verdict *stable* only where "
        "both runs resolve it the same way. Each run keeps its own interval (a t-interval over the "
        "per-seed means of the paired differences); nothing here pools the two runs. Each "
        "chapter's second run was made in the code state of its committed notebook (the same "
        "code digest); `scripts/replication.py` writes this page from the committed notebooks "
        "and the kept second runs (`book/results/replication_runs.json`).", "",
        f"- **first run** (the committed outputs): {described(firsts)}",
        f"- **second run**: {described(seconds)}", "",
        f"Of {counts['all']} pre-registered verdicts, {counts[STABLE]} are stable and "
        f"{counts[DIFFERS]} differ between the runs; the rest are not resolved in either run.", "",
    ] + ([f"Not yet run twice in this code state, so not on this page: "
          f"{', '.join(f'`{s}`' for s in pending)}"
          + (f" (the second runs of {', '.join(f'`{s}`' for s in older)} are of an earlier "
             "code state)" if older else "")
          + ". Until they are, no verdict of theirs is called stable.", ""] if pending else [])
    return "\n".join(head + parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = parser.add_subparsers(dest="verb", required=True)
    k = verbs.add_parser("keep", help="keep a folder's runs as their chapters' second runs")
    k.add_argument("folder", type=Path, help="executed notebooks (scripts/reproduce.py --out)")
    k.add_argument("--only", nargs="+", required=True, metavar="STEM", choices=CHAPTERS,
                   help="the chapters of the folder to keep")
    p = verbs.add_parser("page", help="write the replication page")
    p.add_argument("--out", type=Path, default=PAGE)
    args = parser.parse_args()
    if args.verb == "keep":
        for line in keep(args.folder, args.only):
            print(f"kept {line}")
    else:
        args.out.write_text(page())
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
