"""halluc_lab.progress: silent in batch runs."""

import io

from halluc_lab.progress import ENV_BATCH, progress


def test_progress_is_disabled_in_batch_runs(monkeypatch):
    monkeypatch.setenv(ENV_BATCH, "1")
    assert progress(range(3)).disable
    monkeypatch.setenv(ENV_BATCH, "0")
    assert not progress(range(3), file=io.StringIO()).disable
    assert list(progress(range(3), disable=True)) == [0, 1, 2]


def test_only_rank_0_of_a_torchrun_run_shows_progress(monkeypatch):
    monkeypatch.setenv(ENV_BATCH, "0")
    monkeypatch.setenv("RANK", "1")
    assert progress(range(3), file=io.StringIO()).disable
    monkeypatch.setenv("RANK", "0")
    assert not progress(range(3), file=io.StringIO()).disable
