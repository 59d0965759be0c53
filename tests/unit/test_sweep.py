"""scripts/sweep.py: the grid, value parsing, name checks, the over-seeds summary, and real sweeps
of the tiny fixture notebook (tests/fixtures/sweep_demo.ipynb) with papermill."""

import csv
import json
import math
import sys
from pathlib import Path

import nbformat
import pytest
from scipy import stats

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))  # importable by name: the sweep's spawned workers import it too

import sweep  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "sweep_demo.ipynb"


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# ------------------------------------------------------------------ the pure core


def test_grid_is_the_product_with_the_last_parameter_fastest():
    points = sweep.grid({"seed": [0, 1, 2], "t": [0.5, 1.0]})
    assert points == [{"seed": s, "t": t} for s in (0, 1, 2) for t in (0.5, 1.0)]
    assert list(points[0]) == ["seed", "t"]  # keys keep the command line's order
    assert sweep.grid({"a": ["x"]}) == [{"a": "x"}]


@pytest.mark.parametrize("params, message", [
    ({}, "empty grid"),
    ({"seed": []}, "has no values"),
    ({"seed": [0, 1, 0]}, "lists a value twice"),
])
def test_grid_rejects_empty_and_repeated(params, message):
    with pytest.raises(sweep.SweepError, match=message):
        sweep.grid(params)


def test_grid_keeps_equal_values_of_different_types():
    assert len(sweep.grid({"x": [1, True, "1"]})) == 3


@pytest.mark.parametrize("text, value", [
    ("3", 3), ("-2", -2), ("0.5", 0.5), ("1e-3", 1e-3), ("True", True), ("false", False),
    ("None", None), ("null", None), ("smoke", "smoke"), ('"7"', "7"), ("'None'", "None"),
    ("a b", "a b"), ("1.0", 1.0),
])
def test_parse_value(text, value):
    parsed = sweep.parse_value(text)
    assert parsed == value and type(parsed) is type(value)


def test_notebook_parameters_reads_the_parameters_cell():
    assert sweep.notebook_parameters(FIXTURE) == {"seed": 0, "temperature": 1.0, "scale": "smoke"}
    assert set(sweep.notebook_parameters(ROOT / "notebooks" / "08_sft.ipynb")) >= {"scale", "seed", "device"}


def test_notebook_parameters_non_literal_defaults_and_tuples(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import math\nn: int = 2 ** 10  # comment\na, b = 1, 'x'\nf = math.sqrt(2)",
        metadata={"tags": ["parameters"]})])
    path = tmp_path / "p.ipynb"
    nbformat.write(nb, path)
    assert sweep.notebook_parameters(path) == {"n": "2 ** 10", "a": 1, "b": "x", "f": "math.sqrt(2)"}


def test_notebook_without_parameters_cell_or_missing(tmp_path):
    path = tmp_path / "plain.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("seed = 0")]), path)
    with pytest.raises(sweep.SweepError, match="no cell tagged 'parameters'"):
        sweep.notebook_parameters(path)
    with pytest.raises(SystemExit, match="no cell tagged 'parameters'"):
        sweep.main([str(path), "-p", "seed", "1"])
    with pytest.raises(SystemExit, match="notebook not found"):
        sweep.main([str(tmp_path / "missing.ipynb"), "-p", "seed", "1"])


def test_unknown_parameter_is_rejected_with_the_known_names(tmp_path):
    with pytest.raises(SystemExit) as err:
        sweep.main([str(FIXTURE), "-p", "seed", "0", "-p", "temp", "0.5", "--out", str(tmp_path)])
    message = str(err.value)
    assert "'temp'" in message and "seed, temperature, scale" in message
    assert not (tmp_path / "runs").exists()  # rejected before anything ran


@pytest.mark.parametrize("args, message", [
    ([], "empty grid"),
    (["-p", "seed"], "at least one value"),
    (["-p", "seed", "0", "--jobs", "0"], "--jobs must be at least 1"),
    (["-p", "seed", "0", "-p", "seed", "1"], "given twice"),
    (["-p", "scale", "smoke", "--scale", "full"], "not both"),
])
def test_command_line_errors(tmp_path, args, message):
    with pytest.raises(SystemExit, match=message):
        sweep.main([str(FIXTURE), *args, "--out", str(tmp_path)])


@pytest.mark.slow
def test_values_that_differ_only_in_unsafe_characters_get_runs_of_their_own(tmp_path, capfd):
    names = [sweep.run_name({"tag": v}) for v in ["a/b", "a_b", "a b", "a%2Fb", "a,b=c"]]
    assert len(set(names)) == 5 and not any("/" in n for n in names)
    code = sweep.main([str(FIXTURE), "-p", "scale", "a/b", "a_b", "a b", "--jobs", "1", "--out", str(tmp_path)])
    assert code == 0
    assert len(list((tmp_path / "runs").glob("*.ipynb"))) == 3
    printed = capfd.readouterr()
    assert "without encryption" not in printed.out + printed.err  # the kernels' transport is encrypted
    for row in read_csv(tmp_path / "results.csv"):
        nb = nbformat.read(tmp_path / row["notebook"], as_version=4)
        injected = [c.source for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
        assert f'scale = "{row["scale"]}"' in injected[0]


@pytest.mark.parametrize("values", [["1", '"1"'], ["A", "a"]])
def test_a_grid_whose_runs_would_share_a_notebook_is_refused(tmp_path, values):
    with pytest.raises(SystemExit, match="would share the notebook"):
        sweep.main([str(FIXTURE), "-p", "scale", *values, "--out", str(tmp_path)])
    assert not (tmp_path / "runs").exists()


def t_interval_by_hand(xs, floor=0.0):
    """The t-interval; cut at 0, as the sweep cuts that of a value no run gave below 0."""
    n = len(xs)
    mean = sum(xs) / n
    s = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = stats.t.ppf(0.975, n - 1) * s / math.sqrt(n)
    return mean, max(mean - half, floor), mean + half


def test_an_interval_is_cut_only_where_no_run_went():
    rows = [{"seed": 0, "loss": 0.1, "gain": -0.5, "hit": True},
            {"seed": 1, "loss": 0.2, "gain": 0.4, "hit": True},
            {"seed": 2, "loss": 0.9, "gain": 0.3, "hit": False}]
    (out,) = sweep.summarise(rows, params=["seed"])
    assert out["loss_low"] == 0.0 and t_interval_by_hand([0.1, 0.2, 0.9], floor=-math.inf)[1] < 0
    assert out["loss_high"] == pytest.approx(t_interval_by_hand([0.1, 0.2, 0.9])[2])
    uncut = t_interval_by_hand([-0.5, 0.4, 0.3], floor=-math.inf)
    assert out["gain_low"] == pytest.approx(uncut[1])
    assert (out["hit_low"], out["hit_high"]) == (0.0, 1.0)  # a rate: its interval stays in [0, 1]


def test_summarise_means_and_t_intervals_over_seeds():
    rows = [
        {"seed": 0, "t": 0.5, "acc": 0.20, "loss": 2.0, "label": "a", "status": "ok", "seconds": 3.0},
        {"seed": 1, "t": 0.5, "acc": 0.30, "loss": 1.0, "label": "a", "status": "ok", "seconds": 4.0},
        {"seed": 2, "t": 0.5, "acc": 0.40, "loss": 3.0, "label": "a", "status": "ok", "seconds": 5.0},
        {"seed": 0, "t": 1.0, "acc": 0.70, "loss": 0.5, "label": "b", "status": "ok", "seconds": 3.0},
        {"seed": 1, "t": 1.0, "acc": 0.90, "loss": 0.7, "label": "b", "status": "ok", "seconds": 3.0},
        {"seed": 2, "t": 1.0, "status": "failed", "error": "ValueError: boom", "seconds": 1.0},
    ]
    out = sweep.summarise(rows, params=["seed", "t"])
    assert [r["t"] for r in out] == [0.5, 1.0]
    assert [r["n_seeds"] for r in out] == [3, 2]  # the failed run gives no value
    assert "label" not in out[0] and "seconds" not in out[0]  # strings and run columns are not summarised
    for summary, group in ((out[0], [0.20, 0.30, 0.40]), (out[1], [0.70, 0.90])):
        mean, low, high = t_interval_by_hand(group)
        assert summary["acc"] == pytest.approx(mean)
        assert summary["acc_low"] == pytest.approx(low) and summary["acc_high"] == pytest.approx(high)
    # by hand: mean 2, s = 1, t_{0.975,2} = 4.302653 -> half width 4.302653 / sqrt(3) = 2.484137
    assert out[0]["loss"] == pytest.approx(2.0)
    assert out[0]["loss_high"] - out[0]["loss"] == pytest.approx(2.484137, abs=1e-6)
    only = sweep.summarise(rows, values=["loss"], params=["seed", "t"])
    assert set(only[0]) == {"t", "n_seeds", "loss", "loss_low", "loss_high"}


def test_summarise_one_seed_has_no_interval_and_footer_values_are_skipped():
    rows = [{"seed": 0, "t": t, "acc": a, "run_seed": 0, "run_device": "cpu"} for t, a in ((0.5, 0.1), (1.0, 0.2))]
    out = sweep.summarise(rows, params=["seed", "t"])
    assert out == [{"t": 0.5, "n_seeds": 1, "acc": 0.1, "acc_low": None, "acc_high": None},
                   {"t": 1.0, "n_seeds": 1, "acc": 0.2, "acc_low": None, "acc_high": None}]
    with pytest.raises(sweep.SweepError, match="the numeric ones are acc, run_seed"):
        sweep.summarise(rows, values=["label"], params=["seed", "t"])
    with pytest.raises(ValueError, match="needs params"):
        sweep.summarise(rows)


def test_summarise_seed_only_grid_is_one_setting():
    rows = [{"seed": s, "acc": a} for s, a in ((0, 1.0), (1, 2.0), (2, 4.0))]
    (out,) = sweep.summarise(rows, params=["seed"])
    assert out["n_seeds"] == 3 and out["acc"] == pytest.approx(7 / 3)
    assert (out["acc_low"], out["acc_high"]) == pytest.approx(t_interval_by_hand([1.0, 2.0, 4.0])[1:])


def test_run_name_and_default_jobs():
    assert sweep.run_name({"seed": 0, "temperature": 0.5}) == "seed=0,temperature=0.5"
    assert sweep.run_name({"tasks": "a/b c"}) == "tasks=a%2Fb%20c"
    import torch

    assert sweep.default_jobs(6) == (4 if torch.cuda.is_available() else 1)


# ------------------------------------------------------------------ real sweeps (papermill)


@pytest.mark.slow
def test_sweep_end_to_end_with_two_jobs(tmp_path):
    out = tmp_path / "sweep"
    code = sweep.main([str(FIXTURE), "-p", "seed", "0", "1", "-p", "temperature", "0.5", "1.0",
                       "--jobs", "2", "--out", str(out)])
    assert code == 0
    runs = sorted(p.name for p in (out / "runs").glob("*.ipynb"))
    assert runs == ["seed=0,temperature=0.5.ipynb", "seed=0,temperature=1.0.ipynb",
                    "seed=1,temperature=0.5.ipynb", "seed=1,temperature=1.0.ipynb"]

    results = read_csv(out / "results.csv")
    assert len(results) == 4
    assert list(results[0])[:2] == ["seed", "temperature"]  # parameters first
    assert {"rate", "score", "n_samples", "label", "beats_half"} <= set(results[0])
    assert "first_hits" not in results[0]  # a glued list is left out
    assert [(r["seed"], r["temperature"]) for r in results] == [("0", "0.5"), ("0", "1.0"), ("1", "0.5"), ("1", "1.0")]
    assert all(r["status"] == "ok" and r["error"] == "" for r in results)
    assert results[1]["label"] == "T=1.0" and results[0]["n_samples"] == "200"

    summary = read_csv(out / "summary.csv")
    assert len(summary) == 2
    assert [s["temperature"] for s in summary] == ["0.5", "1.0"]
    for s in summary:
        rates = [float(r["rate"]) for r in results if r["temperature"] == s["temperature"]]
        mean, low, high = t_interval_by_hand(rates)
        assert s["n_seeds"] == "2"
        assert float(s["rate"]) == pytest.approx(mean)
        assert float(s["rate_low"]) == pytest.approx(low) and float(s["rate_high"]) == pytest.approx(high)
    assert (out / "summary.png").stat().st_size > 10_000


@pytest.mark.slow
def test_a_seed_only_sweep_plots_no_fixed_scale_and_counts_what_it_left_out(tmp_path, capsys):
    code = sweep.main([str(FIXTURE), "-p", "seed", "0", "1", "--scale", "smoke",
                       "--summary", "rate", "--jobs", "1", "--out", str(tmp_path)])
    assert code == 0
    report = json.loads((tmp_path / "sweep.json").read_text())
    assert report["x_axis"] is None and report["left_out"] == ["first_hits"]
    printed = capsys.readouterr().out
    assert "1 glued value that" in printed and "first_hits" not in printed


@pytest.mark.slow
def test_failed_run_is_recorded_and_the_others_gathered(tmp_path):
    code = sweep.main([str(FIXTURE), "-p", "temperature", "0", "1.0", "--summary", "rate", "--jobs", "1",
                       "--out", str(tmp_path)])
    assert code == 1
    failed, ok = read_csv(tmp_path / "results.csv")
    assert failed["status"] == "failed"
    assert failed["error"] == "ValueError: temperature must be > 0, got 0"
    assert failed["rate"] == ""
    assert ok["status"] == "ok" and 0 <= float(ok["rate"]) <= 1
    summary = read_csv(tmp_path / "summary.csv")
    assert list(summary[0]) == ["temperature", "n_seeds", "rate", "rate_low", "rate_high"]
    assert [s["n_seeds"] for s in summary] == ["0", "1"]
    assert summary[1]["rate"] == ok["rate"] and summary[1]["rate_low"] == ""  # one seed: no interval
    assert (tmp_path / "summary.png").exists()
