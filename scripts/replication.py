"""Write book/results/replication.md from two full-scale runs of chapters 8-12 in one code state.

Each chapter glues its pre-registered contrasts (``preregistered_contrasts``,
:func:`halluc_lab.book.replication.records`). Give the two folders of executed notebooks that
``scripts/reproduce.py --scale full --out DIR`` wrote, the first being the run whose outputs are
committed, and this sets every pre-registered verdict of the two runs side by side:

    python scripts/replication.py _build/runs/h200 _build/runs/h100            # two GPU models
    python scripts/replication.py _build/runs/seeds0 _build/runs/seeds8           # two seed sets
    python scripts/replication.py RUN1 RUN2 --only 10b_fair_test     # the chapters run twice so far

A verdict is stable where both runs resolve it the same way; the page says which cards and which
seeds each run used, as the runs recorded them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from halluc_lab.book.notebook import read_glue  # noqa: E402
from halluc_lab.book.replication import (DIFFERS, GLUE_NAME, STABLE, compare,  # noqa: E402
                                         table)

CHAPTERS = ("08_sft", "09_preference", "10_rlvr_backtracking", "10b_fair_test",
            "11_hallucination_rag", "12a_continual_learning", "12b_sycophancy", "12c_safety",
            "12d_vision", "12e_icl_cot")


def seeds_used(nb, glued: dict) -> list[int] | None:
    """The training seeds a run used: the ``seeds`` it was given, else the one seed list it glued
    (a ``*_seeds`` value of ``glued``, its :func:`read_glue`), else None."""
    chosen = nb.metadata.get("halluc_lab", {}).get("parameters", {}).get("seeds")
    if chosen is not None:
        return list(chosen)
    lists = {tuple(v) for k, v in glued.items() if k.endswith("_seeds")
             and isinstance(v, list) and v and all(isinstance(x, int) for x in v)}
    return list(lists.pop()) if len(lists) == 1 else None


def describe(run) -> str:
    """The run's device(s) and seeds, as its notebooks recorded them (``run``: a (notebook, its
    glue) pair per chapter)."""
    devices, seeds = set(), set()
    for nb, glued in run:
        devices.add(str(nb.metadata.get("halluc_lab", {}).get("device", "?")))
        chosen = seeds_used(nb, glued)
        seeds.add("the chapter's default seeds" if chosen is None else
                  "seeds " + ", ".join(map(str, chosen)))
    return f"{' / '.join(sorted(devices))}; {' / '.join(sorted(seeds))}"


def read_run(folder: Path, stems) -> list[tuple]:
    """Each chapter's executed notebook in ``folder`` and its glue, read once."""
    return [(nb, read_glue(nb)) for nb in
            (nbformat.read(folder / f"{stem}.ipynb", as_version=4) for stem in stems)]


def title(nb, stem: str) -> str:
    """The chapter's title (its first level-1 heading) and its file."""
    heads = [line[2:].strip() for c in nb.cells if c.cell_type == "markdown"
             for line in c.source.splitlines() if line.startswith("# ")]
    return f"{heads[0]} (`{stem}`)" if heads else f"`{stem}`"


def page(first: Path, second: Path, stems=CHAPTERS) -> str:
    """The replication page's Markdown, over the chapters ``stems`` (the others are named as not
    yet run twice)."""
    unknown = [s for s in stems if s not in CHAPTERS]
    if unknown or not stems:
        raise SystemExit(f"chapters must be some of {CHAPTERS}, got {list(stems)}")
    missing = [f"{d}/{s}.ipynb" for d in (first, second) for s in stems
               if not (d / f"{s}.ipynb").exists()]
    if missing:
        raise SystemExit(f"missing runs: {missing}")
    runs = [read_run(d, stems) for d in (first, second)]
    a_name, b_name = describe(runs[0]), describe(runs[1])
    parts, counts = [], {STABLE: 0, DIFFERS: 0, "all": 0}
    for i, stem in enumerate(stems):
        glued = [run[i][1] for run in runs]
        absent = [str(d) for d, g in zip((first, second), glued) if GLUE_NAME not in g]
        if absent:
            raise SystemExit(f"{stem}: no glued {GLUE_NAME} in the runs in {absent}")
        rows = compare(glued[0][GLUE_NAME], glued[1][GLUE_NAME])
        counts["all"] += len(rows)
        for r in rows:
            counts[r.status] = counts.get(r.status, 0) + 1
        parts += [f"## {title(runs[0][i][0], stem)}", "",
                  table(rows, "first run", "second run"), ""]
    pending = [s for s in CHAPTERS if s not in stems]
    head = [
        "# Replication: the pre-registered verdicts of chapters 8–12 in two full runs", "",
        "Same seed, same code and the same GPU model give the same bits: that is reproducibility. "
        "The same conclusion from a fresh draw of the training noise — another GPU model, or "
        "another set of seeds — is replication, and the book calls a verdict *stable* only where "
        "both runs resolve it the same way. Each run keeps its own interval (a t-interval over the "
        "per-seed means of the paired differences); nothing here pools the two runs.", "",
        f"- **first run** (the committed outputs): {a_name}",
        f"- **second run**: {b_name}", "",
        f"Of {counts['all']} pre-registered verdicts, {counts[STABLE]} are stable and "
        f"{counts[DIFFERS]} differ between the runs; the rest are not resolved in either run.", "",
    ] + ([f"Not yet run twice in this code state, so not on this page: "
          f"{', '.join(f'`{s}`' for s in pending)}. Until they are, no verdict of theirs is "
          "called stable.", ""] if pending else [])
    return "\n".join(head + parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("first", type=Path, help="the run whose outputs are committed")
    parser.add_argument("second", type=Path, help="the other run")
    parser.add_argument("--only", nargs="+", default=list(CHAPTERS), metavar="STEM",
                        choices=CHAPTERS, help="these chapters alone (default: all of them)")
    parser.add_argument("--out", type=Path, default=ROOT / "book" / "results" / "replication.md")
    args = parser.parse_args()
    args.out.write_text(page(args.first, args.second, tuple(args.only)))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
