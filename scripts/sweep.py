"""Run a chapter notebook over a grid of its parameters, and gather what every run glued.

    python scripts/sweep.py NOTEBOOK -p NAME VALUE [VALUE ...] [-p ...] [--out OUT] [--jobs N]
                            [--scale smoke|full|auto] [--summary NAME [NAME ...]]
    python scripts/sweep.py notebooks/08_sft.ipynb -p seed 0 1 2 -p n_eval 50 200 --scale smoke --out _build/sweep/08
    python scripts/sweep.py tests/fixtures/sweep_demo.ipynb -p seed 0 1 -p temperature 0.5 1.0 --jobs 2 --summary rate

The grid is the Cartesian product of the ``-p NAME VALUE...`` lists, in the order given (the
last parameter varies fastest). Values are read like papermill's ``-p``: ``3`` is an int,
``0.5`` a float, ``True``/``False`` bools, ``None`` None, anything else a string (quote it,
``'"3"'``, to force a string). Every NAME must be assigned in the notebook's ``parameters``
cell; ``--scale`` sets the notebook's ``scale`` for every run (default: the notebook's own).

Each grid point runs with papermill (kernel ``python3``, ``HALLUC_BATCH=1``, in the notebook's
folder), ``--jobs`` at a time: by default one on a CPU-only machine, up to four where CUDA is
available. A run that fails is recorded with its error's last line; the others go on.

What lands in OUT (default ``_build/sweep/<notebook stem>``):

- ``runs/<name>=<value>,....ipynb`` — every executed run (a failed run keeps its partial notebook);
  characters other than letters, digits and ``._+-`` in a value are percent-encoded (``a/b``: ``a%2Fb``).
- ``results.csv`` — one row per run: the grid parameters, then every scalar the run glued
  (numbers, bools, strings; lists and dicts are left out, counted on the terminal and named in
  sweep.json), then ``status`` (ok/failed), ``error``, ``seconds`` and ``notebook``.
- ``summary.csv`` — one row per setting of the non-seed parameters: ``n_seeds`` (the runs that
  gave values), then for each numeric glued value (or those named by ``--summary``) its mean
  over seeds and the 95% interval ``<value>_low``, ``<value>_high``.
- ``summary.png`` — the chosen values (at most four panels) against the first non-seed
  parameter, one line per setting of the remaining ones, with the intervals as error bars.
- ``sweep.json`` — the grid, the fixed parameters, failures and what was left out.

The interval is over seeds only: mean ± t(0.975, n−1)·s/√n, with s the standard deviation of
the n per-seed values of a setting. It says how far the mean might move with other seeds, all
else fixed; it is not the within-run interval a chapter reports over its own prompts (a Wilson
or bootstrap interval), and with one seed per setting there is none (the cells stay empty).
The interval is cut to where the mean can lie, judged from every run of the sweep: at 0 for a
value no run gave below 0 (a loss, a count), to [0, 1] for a bool. The true mean of such a value
lies there, so the cut interval covers it whenever the uncut one does: the coverage is unchanged.
"""

from __future__ import annotations

import argparse
import ast
import csv
import itertools
import json
import math
import os
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from urllib.parse import quote

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CONFIDENCE = 0.95
MAX_PANELS = 4
RUN_COLUMNS = ("status", "error", "seconds", "notebook")  # results.csv's columns after the glued values
FOOTER_PREFIX = "run_"  # the chapter footer's glued metadata (device, seed, ...): never summarised


class SweepError(ValueError):
    """A problem with the command line or the notebook, found before anything runs."""


# ---------------------------------------------------------------------------- the pure core


def parse_value(s: str):
    """A command-line value as papermill's ``-p`` reads it: int, float, bool, None or string.

    >>> [parse_value(s) for s in ["3", "-2", "0.5", "1e-3", "True", "false", "None", "smoke", '"7"']]
    [3, -2, 0.5, 0.001, True, False, None, 'smoke', '7']
    """
    text = s.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]  # quoted: always a string
    if text in ("None", "none", "null", "~"):
        return None
    if text in ("True", "true"):
        return True
    if text in ("False", "false"):
        return False
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def grid(params: dict[str, list]) -> list[dict]:
    """Every combination of the parameters' values, the last parameter varying fastest.

    >>> grid({"seed": [0, 1], "t": [0.5, 1.0]})
    [{'seed': 0, 't': 0.5}, {'seed': 0, 't': 1.0}, {'seed': 1, 't': 0.5}, {'seed': 1, 't': 1.0}]
    """
    if not params:
        raise SweepError("empty grid: give at least one -p NAME VALUE [VALUE ...]")
    for name, values in params.items():
        if len(values) == 0:
            raise SweepError(f"empty grid: parameter {name!r} has no values")
        repeated = sorted({repr(v) for v in values if sum(v == w and type(v) is type(w) for w in values) > 1})
        if repeated:
            raise SweepError(f"parameter {name!r} lists a value twice: {', '.join(repeated)}")
    names = list(params)
    return [dict(zip(names, combo)) for combo in itertools.product(*(params[n] for n in names))]


def _parameters_cell(nb) -> str:
    for cell in nb.cells:
        if cell.cell_type == "code" and "parameters" in cell.metadata.get("tags", []):
            return cell.source
    raise SweepError("the notebook has no cell tagged 'parameters' (papermill needs one to inject values)")


def notebook_parameters(path) -> dict[str, object]:
    """The names the notebook's ``parameters`` cell assigns, with their default values.

    A default that is not a plain literal (``n = 2 ** 10``) is given as its source text.
    """
    import nbformat

    path = Path(path)
    if not path.is_file():
        raise SweepError(f"notebook not found: {path}")
    source = _parameters_cell(nbformat.read(path, as_version=4))
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        raise SweepError(f"the parameters cell of {path} is not valid Python: {err}") from err

    def value(node):
        try:
            return ast.literal_eval(node)
        except (ValueError, SyntaxError, TypeError):
            return ast.unparse(node)

    found: dict[str, object] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign):
            pairs = [(t, stmt.value) for t in stmt.targets]
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            pairs = [(stmt.target, stmt.value)]
        else:
            continue
        for target, node in pairs:
            if isinstance(target, ast.Name):
                found[target.id] = value(node)
            elif isinstance(target, (ast.Tuple, ast.List)):  # a, b = 1, 2
                items = node.elts if isinstance(node, (ast.Tuple, ast.List)) else [None] * len(target.elts)
                for t, v in zip(target.elts, items):
                    if isinstance(t, ast.Name):
                        found[t.id] = value(v) if v is not None else None
    return found


def check_names(names: Iterable[str], known: dict[str, object]) -> None:
    """Reject names the notebook's parameters cell does not assign."""
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SweepError(f"unknown parameter{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}: "
                         f"the notebook's parameters cell assigns {', '.join(known) or 'nothing'}")


def _is_number(v) -> bool:
    import numbers

    return isinstance(v, numbers.Real) and not (isinstance(v, float) and math.isnan(v))


def numeric_columns(rows: Sequence[dict], exclude: Iterable[str] = ()) -> list[str]:
    """Columns whose every present value is a number (bools count: their mean is a rate)."""
    exclude = set(exclude)
    seen: dict[str, bool] = {}
    for row in rows:
        for key, v in row.items():
            if key in exclude or v is None or v == "":
                continue
            seen[key] = seen.get(key, True) and _is_number(v)
    return [k for k, ok in seen.items() if ok]


def default_values(rows: Sequence[dict], params: Iterable[str], seed_key: str = "seed") -> list[str]:
    """The values summarised when none are named: every numeric column but the parameters,
    the run columns (status, seconds, ...) and the chapter footer's ``run_*`` metadata."""
    return [k for k in numeric_columns(rows, exclude=[*params, seed_key, *RUN_COLUMNS])
            if not k.startswith(FOOTER_PREFIX)]


Bounds = tuple[float, float]
UNBOUNDED: Bounds = (-math.inf, math.inf)


def t_interval(xs: Sequence[float], confidence: float = CONFIDENCE,
               bounds: Bounds = UNBOUNDED) -> tuple[float, float | None, float | None]:
    """Mean and the t-interval mean ± t((1+c)/2, n−1)·s/√n, cut to ``bounds`` (where the mean can
    lie: the cut interval covers the mean whenever the uncut one does); none for a single value.

    >>> t_interval([0.1, 0.2, 0.9], bounds=(0.0, math.inf))[1]
    0.0
    """
    from scipy.stats import t

    n = len(xs)
    if n == 0:
        return math.nan, None, None
    mean = math.fsum(xs) / n
    if n == 1:
        return mean, None, None
    s = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (n - 1))
    half = float(t.ppf(0.5 + confidence / 2, n - 1)) * s / math.sqrt(n)
    return mean, max(mean - half, bounds[0]), min(mean + half, bounds[1])


def value_bounds(xs: Sequence) -> Bounds:
    """Where the mean of a value can lie, judged from every run of the sweep: [0, 1] for bools (a
    rate), [0, ∞) for a value no run gave below 0 (a loss, a count), else unbounded."""
    if all(isinstance(x, bool) for x in xs):
        return 0.0, 1.0
    return (0.0 if all(x >= 0 for x in xs) else -math.inf), math.inf


def summarise(rows: Sequence[dict], seed_key: str = "seed", values: Sequence[str] | None = None,
              params: Sequence[str] | None = None, confidence: float = CONFIDENCE) -> list[dict]:
    """Mean over seeds, with a t-interval, of each value for each setting of the other parameters.

    ``rows`` are results.csv's rows as dicts. ``params`` names the grid parameters (the seed
    among them or not); without it, every column that is not a value, the seed or a run column
    (status, error, ...) is one. ``values`` names the numbers to summarise; without it, every
    numeric column except the parameters and the footer's ``run_*`` metadata. At least one of
    the two must be given. Each output row holds the setting, ``n_seeds`` (rows of the setting
    with a number for some value) and, per value, ``<value>`` (the mean), ``<value>_low`` and
    ``<value>_high`` (None with a single seed), cut to :func:`value_bounds`. A row without a
    number for a value (a failed run) is left out of that value's mean.
    """
    rows = list(rows)
    if params is None and values is None:
        raise ValueError("summarise needs params (the grid's parameter names) or values (the numbers to summarise)")
    keys = list(dict.fromkeys(k for row in rows for k in row))
    if params is None:
        params = [k for k in keys if k not in values and k not in RUN_COLUMNS]
    group_by = [p for p in params if p != seed_key]
    numeric = numeric_columns(rows, exclude=[*params, seed_key, *RUN_COLUMNS])
    if values is None:
        values = default_values(rows, params, seed_key)
    else:
        bad = [v for v in values if v not in numeric]
        if bad:
            raise SweepError(f"not a numeric value of these runs: {', '.join(map(repr, bad))}; "
                             f"the numeric ones are {', '.join(numeric) or 'none'}")
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault(tuple(repr(row.get(p)) for p in group_by), []).append(row)
    bounds = {v: value_bounds([r[v] for r in rows if _is_number(r.get(v))]) for v in values}
    out = []
    for members in groups.values():
        summary = {p: members[0].get(p) for p in group_by}
        counts, stats = [], {}
        for v in values:
            xs = [float(r[v]) for r in members if _is_number(r.get(v))]
            counts.append(len(xs))
            mean, low, high = t_interval(xs, confidence, bounds[v])
            stats.update({v: mean if xs else None, f"{v}_low": low, f"{v}_high": high})
        summary["n_seeds"] = max(counts, default=0)
        summary.update(stats)
        out.append(summary)
    return out


def run_name(point: dict) -> str:
    """A run's file stem: ``seed=0,temperature=0.5``; every other character percent-encoded, as in a URL,
    so that two different strings never give one stem (``a/b`` is ``a%2Fb``, ``a_b`` stays ``a_b``).

    >>> run_name({"tag": "a/b c", "seed": 0})
    'tag=a%2Fb%20c,seed=0'
    """
    return ",".join(f"{k}={quote(str(v), safe='.+-')}" for k, v in point.items())


def check_run_names(points: list[dict]) -> None:
    """Refuse a grid two of whose runs would write one notebook: values whose text is the same (``1`` and
    ``"1"``), or differ only in case (one file where the file system ignores case)."""
    seen: dict[str, dict] = {}
    for point in points:
        name = run_name(point)
        other = seen.setdefault(name.casefold(), point)
        if other is not point:
            raise SweepError(f"runs {other} and {point} would share the notebook runs/{name}.ipynb: "
                             "give values that differ in more than type or case")


def default_jobs(points: int) -> int:
    """One run at a time on a CPU-only machine; up to four where CUDA is available."""
    try:
        import torch
    except ImportError:
        return 1
    return max(1, min(4, points)) if torch.cuda.is_available() else 1


# ---------------------------------------------------------------------------- running


def _execute(source: str, target: str, parameters: dict, cwd: str) -> dict:
    """Run one grid point with papermill; never raises: a failure comes back as status/error."""
    import papermill
    from reproduce import LocalKernelManager

    saved = {k: os.environ.get(k) for k in ("HALLUC_BATCH", "MPLBACKEND")}
    os.environ["HALLUC_BATCH"] = "1"  # no progress bars in the recorded outputs
    os.environ.pop("MPLBACKEND", None)  # the kernel's inline backend, as in scripts/reproduce.py
    start = time.perf_counter()
    try:
        papermill.execute_notebook(source, target, parameters=parameters, kernel_name="python3",
                                   cwd=cwd, progress_bar=False, log_output=False,
                                   kernel_manager_class=LocalKernelManager)
        status, error = "ok", ""
    except papermill.PapermillExecutionError as err:
        lines = [ln for ln in str(err.evalue).splitlines() if ln.strip()]
        status, error = "failed", f"{err.ename}: {lines[-1] if lines else ''}".rstrip(": ")
    except Exception as err:  # noqa: BLE001 - a kernel that would not start, a missing file, ...
        lines = [ln for ln in str(err).splitlines() if ln.strip()]
        status, error = "failed", f"{type(err).__name__}: {lines[-1] if lines else ''}".rstrip(": ")
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return {"status": status, "error": error, "seconds": round(time.perf_counter() - start, 1)}


def _scalar(v) -> bool:
    return v is None or isinstance(v, (bool, int, float, str))


def gather(target: Path) -> tuple[dict, list[str]]:
    """A run's glued scalars, and the names of the glued values left out (lists, dicts)."""
    import nbformat

    from halluc_lab.book.notebook import read_glue

    glued = read_glue(nbformat.read(target, as_version=4))
    return {k: v for k, v in glued.items() if _scalar(v)}, [k for k, v in glued.items() if not _scalar(v)]


def execute_all(source: Path, out: Path, points: list[dict], fixed: dict, jobs: int) -> list[dict]:
    """Run every grid point (``jobs`` at a time) and return results.csv's rows, in grid order."""
    from tqdm import tqdm

    runs = out / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    targets = [runs / f"{run_name(p)}.ipynb" for p in points]
    tasks = [(str(source), str(t), {**p, **fixed}, str(source.parent)) for p, t in zip(points, targets)]
    results: list[dict | None] = [None] * len(points)
    failed = 0
    with tqdm(total=len(points), desc=f"sweep {source.stem}", unit="run", dynamic_ncols=True) as bar:
        def done(i: int, result: dict) -> None:
            nonlocal failed
            failed += result["status"] != "ok"
            results[i] = result
            bar.set_postfix(failed=failed)
            bar.update()

        if jobs == 1:
            for i, task in enumerate(tasks):
                done(i, _execute(*task))
        else:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor, as_completed

            # spawn: a fresh interpreter per worker, safe after CUDA or tqdm's thread in this one
            with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
                futures = {pool.submit(_execute, *task): i for i, task in enumerate(tasks)}
                for future in as_completed(futures):
                    done(futures[future], future.result())

    rows = []
    for point, target, result in zip(points, targets, results):
        glued, left_out = {}, []
        if result["status"] == "ok":
            try:
                glued, left_out = gather(target)
            except ValueError as err:
                result = {**result, "status": "failed", "error": f"reading glued values: {err}"}
        rows.append({"point": point, "glued": glued, "left_out": left_out,
                     **result, "notebook": str(target.relative_to(out))})
    return rows


# ---------------------------------------------------------------------------- writing


def _cell(v):
    return "" if v is None else v


def write_csv(path: Path, rows: list[dict], columns: list[str]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({c: _cell(row.get(c)) for c in columns})


def plot_summary(summary: list[dict], values: list[str], group_by: list[str], path: Path,
                 title: str) -> str | None:
    """One panel per value (at most four, two columns): mean ± interval against the first parameter
    that varies; that parameter (None where only the seed varies)."""
    from matplotlib import rc_context
    from matplotlib.figure import Figure

    values = values[:MAX_PANELS]
    x_key = next((p for p in group_by if len({repr(r[p]) for r in summary}) > 1), group_by[0] if group_by else None)
    rest = [p for p in group_by if p != x_key and len({repr(r[p]) for r in summary}) > 1]
    xs_all = [r[x_key] for r in summary] if x_key else [None] * len(summary)
    numeric_x = all(_is_number(x) and not isinstance(x, bool) for x in xs_all)
    categories = list(dict.fromkeys(repr(x) for x in xs_all))
    labels = {repr(x): str(x) if x_key else "all seeds" for x in xs_all}

    def position(x):
        return x if numeric_x else categories.index(repr(x))

    series: dict[str, list[dict]] = {}
    for r in summary:
        series.setdefault(", ".join(f"{p}={r[p]}" for p in rest), []).append(r)

    ncols = 1 if len(values) == 1 else 2
    nrows = math.ceil(len(values) / ncols)
    with rc_context({"font.size": 11, "axes.titlesize": 12, "axes.labelsize": 11, "legend.fontsize": 10,
                     "xtick.labelsize": 10, "ytick.labelsize": 10}):
        fig = Figure(figsize=(5.0 * ncols, 3.8 * nrows + 0.5), layout="constrained")
        axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
        for ax, value in zip(axes, values):
            for label, members in series.items():
                members = sorted(members, key=lambda r: position(r.get(x_key)) if x_key else 0)
                xs = [position(r.get(x_key)) if x_key else 0 for r in members]
                ys = [math.nan if r[value] is None else r[value] for r in members]
                lo = [0.0 if r[f"{value}_low"] is None else r[value] - r[f"{value}_low"] for r in members]
                hi = [0.0 if r[f"{value}_high"] is None else r[f"{value}_high"] - r[value] for r in members]
                ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=4, label=label or None)
            if not numeric_x:
                ax.set_xticks(range(len(categories)), [labels[c] for c in categories])
            ax.set_xlabel(x_key if x_key else "(only the seed varies)")
            ax.set_ylabel(value)
            ax.grid(alpha=0.3)
            if any(series):
                ax.legend()
        for ax in axes[len(values):]:
            ax.set_visible(False)
        fig.suptitle(title)
        fig.savefig(path, dpi=120)
    return x_key


# ---------------------------------------------------------------------------- the command


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sweep.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebook", type=Path, help="the chapter notebook to run")
    parser.add_argument("-p", "--parameter", nargs="+", action="append", default=[], metavar=("NAME", "VALUE"),
                        help="a parameter and its values (repeat -p for more parameters)")
    parser.add_argument("--out", type=Path, help="output folder (default: _build/sweep/<notebook stem>)")
    parser.add_argument("--jobs", type=int, help="runs at once (default: 1 on CPU, min(4, runs) with CUDA)")
    parser.add_argument("--scale", choices=["smoke", "full", "auto"],
                        help="the notebook's scale for every run (default: the notebook's own)")
    parser.add_argument("--summary", nargs="+", metavar="NAME",
                        help="glued values to summarise and plot (default: every numeric one)")
    return parser.parse_args(argv)


def plan(args: argparse.Namespace) -> tuple[Path, dict[str, list], dict, list[dict], int]:
    """Check everything that can be checked before a run: notebook, names, grid, jobs."""
    source = args.notebook.resolve()
    if not source.is_file():
        raise SweepError(f"notebook not found: {args.notebook}")
    known = notebook_parameters(source)
    params: dict[str, list] = {}
    for entry in args.parameter:
        name, values = entry[0], entry[1:]
        if not values:
            raise SweepError(f"-p {name}: give at least one value")
        if name in params:
            raise SweepError(f"-p {name} is given twice; list all its values after one -p")
        params[name] = [parse_value(v) for v in values]
    check_names(params, known)
    fixed = {}
    if args.scale is not None:
        if "scale" in params:
            raise SweepError("give the scale either with --scale or with -p scale, not both")
        check_names(["scale"], known)
        fixed["scale"] = args.scale
    points = grid(params)
    check_run_names(points)
    jobs = default_jobs(len(points)) if args.jobs is None else args.jobs
    if jobs < 1:
        raise SweepError(f"--jobs must be at least 1, got {jobs}")
    return source, params, fixed, points, min(jobs, len(points))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the sweep; 0 when every run succeeded, 1 when some failed (their rows say why)."""
    args = parse_args(argv)
    try:
        source, params, fixed, points, jobs = plan(args)
    except SweepError as err:
        raise SystemExit(f"sweep.py: error: {err}") from None
    out = (args.out or ROOT / "_build" / "sweep" / source.stem).resolve()
    if out == (ROOT / "notebooks").resolve():
        raise SystemExit("sweep.py: error: --out must not be notebooks/")
    print(f"{len(points)} runs of {source.name}, {jobs} at a time, into {out}", flush=True)
    runs = execute_all(source, out, points, fixed, jobs)

    names = list(params) + [k for k in fixed if k not in params]
    glued_names = list(dict.fromkeys(k for r in runs for k in r["glued"]))
    taken = set(names) | set(RUN_COLUMNS)
    column = {k: f"glued_{k}" if k in taken else k for k in glued_names}
    rows = [{**r["point"], **fixed, **{column[k]: v for k, v in r["glued"].items()},
             **{c: r[c] for c in RUN_COLUMNS}} for r in runs]
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "results.csv", rows, names + list(column.values()) + list(RUN_COLUMNS))
    left_out = sorted({k for r in runs for k in r["left_out"]})
    if left_out:
        plural = "s" * (len(left_out) > 1)
        print(f"left out of results.csv: {len(left_out)} glued value{plural} that are not scalars "
              "(lists, dicts; sweep.json names them)")

    failed = [r for r in rows if r["status"] != "ok"]
    for r in failed:
        print(f"FAILED {r['notebook']}: {r['error']}")
    ok_rows = [r for r in rows if r["status"] == "ok"]
    summary, values, shown, x_axis = [], [], [], None
    if ok_rows:
        values = list(dict.fromkeys(args.summary)) if args.summary else default_values(rows, names)
        try:
            summary = summarise(rows, values=values, params=names)
        except SweepError as err:
            raise SystemExit(f"sweep.py: error: {err} (results.csv is written)") from None
        group_by = [p for p in names if p != "seed"]
        axes = [p for p in params if p != "seed"]  # the grid's, not a fixed --scale
        write_csv(out / "summary.csv", summary,
                  group_by + ["n_seeds"] + [c for v in values for c in (v, f"{v}_low", f"{v}_high")])
        if values:
            seeds = "seed" in params and len(params["seed"]) > 1
            note = f"mean over {len(params['seed'])} seeds, 95% t-interval" if seeds else "one run per point: no interval"
            # unless named, constants (a sample count, say) give way to values that move
            varying = [v for v in values if len({s[v] for s in summary if s[v] is not None}) > 1]
            shown = (values if args.summary else varying or values)[:MAX_PANELS]
            x_axis = plot_summary(summary, shown, axes, out / "summary.png",
                                  f"{source.stem}: {note}")
            if len(shown) < len(values):
                print(f"summary.png shows {', '.join(shown)}; summary.csv has all {len(values)} values")
    (out / "sweep.json").write_text(json.dumps({
        "notebook": str(source), "grid": params, "fixed": fixed, "jobs": jobs, "runs": len(rows),
        "failed": {r["notebook"]: r["error"] for r in failed}, "left_out": left_out,
        "summary_values": values, "plotted": shown, "x_axis": x_axis,
        "interval": f"{CONFIDENCE:.0%} t-interval over seeds only, cut at 0 for values no run "
                    "gave below 0, to [0, 1] for bools",
    }, indent=1, default=str))
    print(f"results: {out / 'results.csv'} ({len(rows)} runs, {len(failed)} failed)")
    if summary:
        print(f"summary: {out / 'summary.csv'}" + (f", {out / 'summary.png'}" if values else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
