"""Replication: two runs' records of a chapter's pre-registered contrasts, set side by side; a
verdict is stable only where both runs resolve it the same way; the page script reads glued runs."""

import sys
from pathlib import Path

import nbformat
import pytest

from halluc_lab.book import replication
from halluc_lab.evaluation.stats import Interval

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import replication as page_script  # noqa: E402

UP, DOWN, FLAT = (Interval(0.1, 0.02, 0.18, method="t", seeds=8, per_seed=(0.1,) * 8),
                  Interval(-0.1, -0.2, -0.01, method="t", seeds=8, per_seed=(-0.1,) * 8),
                  Interval(0.01, -0.05, 0.07, method="t", seeds=8, per_seed=(0.01,) * 8))
PREDICTED = {"a": "higher", "b": "lower", "c": "not resolved"}


def test_a_verdict_is_stable_only_where_both_runs_resolve_it_the_same_way():
    first = replication.records({"a": UP, "b": DOWN, "c": FLAT}, PREDICTED)
    second = replication.records({"a": UP, "b": FLAT, "c": FLAT}, PREDICTED)
    rows = replication.compare(first, second)
    assert [r.status for r in rows] == [replication.STABLE, replication.DIFFERS,
                                        replication.BOTH_UNRESOLVED]
    assert [r.as_predicted for r in rows] == [True, False, False]
    flipped = replication.compare(replication.records({"a": UP}, {"a": "higher"}),
                                  replication.records({"a": DOWN}, {"a": "higher"}))
    assert flipped[0].status == replication.DIFFERS
    against = replication.compare(*[replication.records({"a": DOWN}, {"a": "higher"})] * 2)
    assert against[0].status == replication.STABLE and not against[0].as_predicted
    text = replication.table(rows, "H200", "H100")
    assert "| a | higher | higher (+0.100 [+0.020, +0.180]; t, 8 seeds) |" in text
    assert "stable, as predicted" in text and "| differs |" in text
    seeds = replication.per_seed_table(rows, "H200", "H100")
    assert "| a | " + " ".join(["+0.100"] * 8) + " | " + " ".join(["+0.100"] * 8) + " |" in seeds
    first["c"]["per_seed"] = []  # a run kept without its seeds' values says so
    assert "| c | not kept | " + " ".join(["+0.010"] * 8) + " |" in replication.per_seed_table(
        replication.compare(first, second), "H200", "H100")


def test_a_contrast_registered_without_a_direction_replicates_but_is_never_as_predicted():
    record = replication.records({"a": UP}, {"a": replication.NO_PREDICTION})
    rows = replication.compare(record, record)
    assert rows[0].status == replication.STABLE and not rows[0].as_predicted
    text = replication.table(rows, "H200", "H100")
    assert "| a | no prediction | higher" in text and "against" not in text


def test_a_verdict_is_said_against_its_prediction_in_words_that_fit_every_outcome():
    said = {(side, p): replication.against_prediction(side, p)
            for side in (1, -1, 0) for p in replication.PREDICTIONS}
    assert said[(1, "higher")] == said[(-1, "lower")] == said[(0, "not resolved")] == "as predicted"
    assert said[(1, "not resolved")] == 'against the prediction, which was "not resolved"'
    assert said[(0, "lower")] == 'against the prediction, which was "lower"'
    assert {said[(side, replication.NO_PREDICTION)] for side in (1, -1, 0)} == {
        "registered without a predicted direction"}
    with pytest.raises(ValueError, match="side"):
        replication.against_prediction(2, "higher")
    with pytest.raises(ValueError, match="predicted"):
        replication.against_prediction(1, "up")


def test_records_and_runs_that_do_not_match_are_refused():
    with pytest.raises(ValueError, match="unmatched"):
        replication.records({"a": UP}, {"b": "higher"})
    with pytest.raises(ValueError, match="must be one of"):
        replication.records({"a": UP}, {"a": "up"})
    one = replication.records({"a": UP, "b": DOWN}, {"a": "higher", "b": "lower"})
    with pytest.raises(ValueError, match="different contrasts"):
        replication.compare(one, replication.records({"a": UP}, {"a": "higher"}))
    with pytest.raises(ValueError, match="predicted differently"):
        other = replication.records({"a": UP, "b": DOWN}, {"a": "lower", "b": "lower"})
        replication.compare(one, other)


def _run(folder: Path, stem: str, contrasts: dict, device: str, seeds, glued_seeds=None,
         code: str = "one code state"):
    """A notebook as reproduce.py leaves it: the records and the footer's run glued, the run in the
    metadata (a run given no ``seeds`` records none; ``glued_seeds``: a seed list the chapter glued
    itself; ``code``: stands for the module hashes its footer glued)."""
    folder.mkdir(exist_ok=True)
    record = replication.records(contrasts, {k: PREDICTED[k] for k in contrasts})
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("", execution_count=1)
    glued = {replication.GLUE_NAME: record, "run_scale": "full",
             "run_code": {"modules": {"m": code}}}
    glued |= {"x_seeds": glued_seeds} if glued_seeds else {}
    cell.outputs = [nbformat.v4.new_output(
        "display_data", data={"text/plain": repr(value)},
        metadata={"scrapbook": {"name": name, "mime_prefix": ""}}) for name, value in glued.items()]
    nb.cells = [nbformat.v4.new_markdown_cell("# 8 · SFT"), cell]
    parameters = {"scale": "full", "seed": 0} | ({"seeds": seeds} if seeds is not None else {})
    nb.metadata["halluc_lab"] = {"device": device, "parameters": parameters}
    nbformat.write(nb, folder / f"{stem}.ipynb")


H200, H100 = "cuda (NVIDIA H200)", "cuda (NVIDIA H100)"


def test_the_page_sets_a_kept_second_run_beside_the_committed_one(tmp_path):
    kept = tmp_path / "runs.json"
    _run(tmp_path / "nb", "08_sft", {"a": UP, "b": DOWN}, H200, list(range(8)))
    _run(tmp_path / "b", "08_sft", {"a": UP, "b": FLAT}, H200, list(range(8, 16)))
    with pytest.raises(SystemExit, match="no chapter has a kept second run"):
        page_script.page(tmp_path / "nb", kept)
    assert page_script.keep(tmp_path / "b", ["08_sft"], tmp_path / "nb", kept) == [
        f"08_sft: {H200}, seeds {list(range(8, 16))}"]
    text = page_script.page(tmp_path / "nb", kept)
    assert f"first run** (the committed outputs): {H200}; seeds 0, 1, 2, 3, 4, 5, 6, 7" in text
    assert f"second run**: {H200}; seeds 8, 9" in text and "## 8 · SFT (`08_sft`)" in text
    assert "Of 2 pre-registered verdicts, 1 are stable and 1 differ" in text
    assert "Not yet run twice" in text and "`09_preference`" in text and "`08_sft`," not in text
    # the chapter re-run in a new code state: its kept run no longer counts
    _run(tmp_path / "nb", "08_sft", {"a": UP, "b": DOWN}, H200, list(range(8)), code="the next")
    with pytest.raises(SystemExit, match="no chapter has a kept second run of its committed code"):
        page_script.page(tmp_path / "nb", kept)


def test_a_second_run_of_another_code_state_or_the_same_draw_is_refused(tmp_path):
    kept = tmp_path / "runs.json"
    _run(tmp_path / "nb", "08_sft", {"a": UP}, H200, list(range(8)))
    _run(tmp_path / "code", "08_sft", {"a": UP}, H200, list(range(8, 16)), code="another")
    with pytest.raises(SystemExit, match="is not the committed notebook's"):
        page_script.keep(tmp_path / "code", ["08_sft"], tmp_path / "nb", kept)
    _run(tmp_path / "same", "08_sft", {"a": UP}, H200, list(range(4, 12)))
    with pytest.raises(SystemExit, match="not a replication"):
        page_script.keep(tmp_path / "same", ["08_sft"], tmp_path / "nb", kept)
    with pytest.raises(SystemExit, match="missing run"):
        page_script.keep(tmp_path / "same", ["09_preference"], tmp_path / "nb", kept)
    assert not kept.exists()
    _run(tmp_path / "h100", "08_sft", {"a": UP}, H100, list(range(8)))  # same seeds, another card
    page_script.keep(tmp_path / "h100", ["08_sft"], tmp_path / "nb", kept)
    assert page_script.load(kept)["08_sft"]["device"] == H100


def test_a_run_on_its_default_seeds_is_described_by_the_seeds_it_glued(tmp_path):
    _run(tmp_path / "a", "08_sft", {"a": UP}, H200, None, glued_seeds=[0, 1, 2])
    _run(tmp_path / "b", "08_sft", {"a": UP}, H100, None)
    a, b = (page_script.read_chapter(tmp_path / d, "08_sft") for d in "ab")
    assert page_script.described([a]) == "cuda (NVIDIA H200); seeds 0, 1, 2"
    assert page_script.described([b]) == "cuda (NVIDIA H100); the chapter's default seeds"


def test_the_committed_page_is_the_one_the_committed_runs_give():
    """book/results/replication.md is what scripts/replication.py writes from the committed
    notebooks and the kept second runs: re-running a chapter without re-making the page fails
    here."""
    assert (ROOT / "book" / "results" / "replication.md").read_text() == page_script.page()
