"""scripts/reproduce.py: the GPUs each chapter of a concurrent run is given, the order chapters start in, and a
real two-at-once run of a tiny fixture notebook with papermill."""

import json
import os
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))  # importable by name: the spawned workers import it too

import reproduce  # noqa: E402
from halluc_lab import shared_gpu  # noqa: E402
from halluc_lab.book.notebook import read_glue  # noqa: E402
from tests.unit.test_shared_gpu import stand_in  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "reproduce_demo.ipynb"


def test_each_chapter_sees_every_gpu_rotated_to_start_at_its_own():
    orders = [reproduce.gpu_order(i, ["0", "1", "2", "3"]) for i in range(5)]
    assert orders == ["0,1,2,3", "1,2,3,0", "2,3,0,1", "3,0,1,2", "0,1,2,3"]
    assert reproduce.gpu_order(3, []) is None  # no GPU: the environment is left alone


def test_visible_gpus_follow_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, 5")
    assert reproduce.visible_gpus() == ["2", "5"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert reproduce.visible_gpus() == []


def fixture_chapters(folder: Path, seconds: dict[str, float]) -> Path:
    """Copies of the fixture named after ``seconds``' keys, each recording that committed run time."""
    folder.mkdir()
    for stem, s in seconds.items():
        nb = nbformat.read(FIXTURE, as_version=4)
        nb.metadata["halluc_lab"] = {"seconds": s}
        nbformat.write(nb, folder / f"{stem}.ipynb")
    return folder


@pytest.mark.slow
def test_a_concurrent_run_starts_the_longest_first_and_hands_out_the_gpus_in_turn(tmp_path, monkeypatch):
    notebooks = fixture_chapters(tmp_path / "nb", {"short": 1.0, "long": 50.0, "middle": 7.0})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")  # never opened: the fixture imports no CUDA
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    out = tmp_path / "runs"
    out.mkdir()
    times, failed = reproduce.run_all(["short", "long", "middle"], out, "smoke", 3, jobs=2, notebooks=notebooks)
    assert failed == [] and sorted(times) == ["long", "middle", "short"]
    assert json.loads((out / "times.json").read_text()).keys() == times.keys()
    gpus = {}
    for stem in times:
        nb = nbformat.read(out / f"{stem}.ipynb", as_version=4)
        meta = nb.metadata["halluc_lab"]
        assert meta["parameters"] == {"scale": "smoke", "seed": 3} and meta["chapters_at_once"] == 2
        assert meta["seed"] == 3 and not any("injected-parameters" in c.metadata.get("tags", []) for c in nb.cells)
        gpus[stem] = read_glue(nb)["gpus"]
        # each kernel gets half the cores, not all of them each (torch's default)
        assert read_glue(nb)["threads"] == str(max(1, os.cpu_count() // 2))
    assert gpus == {"long": "4,6", "middle": "6,4", "short": "4,6"}  # started in that order


@pytest.mark.slow
def test_a_failed_chapter_is_reported_and_the_others_still_run_one_at_a_time_too(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # a count the caller set is kept
    notebooks = fixture_chapters(tmp_path / "nb", {"fine": 1.0, "broken": 2.0})
    nb = nbformat.read(notebooks / "broken.ipynb", as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell('raise ValueError("no such model")'))
    nbformat.write(nb, notebooks / "broken.ipynb")
    out = tmp_path / "runs"
    out.mkdir()
    times, failed = reproduce.run_all(["broken", "fine"], out, "smoke", 0, jobs=1, notebooks=notebooks)
    assert failed == ["broken"] and list(times) == ["fine"]
    fine = nbformat.read(out / "fine.ipynb", as_version=4)
    assert "chapters_at_once" not in fine.metadata["halluc_lab"] and read_glue(fine)["threads"] == "3"


def test_one_chapter_alone_leaves_the_callers_thread_count_unset(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    notebooks = fixture_chapters(tmp_path / "nb", {"alone": 1.0})
    seconds, error = reproduce._run_chapter("alone", tmp_path, "smoke", 0, 1, None, notebooks)
    assert error is None and seconds > 0
    assert "OMP_NUM_THREADS" not in os.environ


def test_a_run_prints_no_kernel_transport_warning(tmp_path, capfd):
    notebooks = fixture_chapters(tmp_path / "nb", {"quiet": 1.0})
    reproduce.run("quiet", tmp_path, "smoke", 0, notebooks=notebooks)
    printed = capfd.readouterr()
    assert "without encryption" not in printed.out + printed.err
    assert "without encryption" not in (tmp_path / "quiet.ipynb").read_text()


@pytest.mark.parametrize("jobs", ["0", "-2"])
def test_fewer_than_one_job_is_refused_before_anything_runs(jobs, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["reproduce.py", "--jobs", jobs, "--out", str(tmp_path / "runs")])
    with pytest.raises(SystemExit, match=f"--jobs must be at least 1, got {jobs}"):
        reproduce.main()
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_a_dead_kernel_a_missing_notebook_or_footer_fails_that_chapter_and_the_book_goes_on(tmp_path):
    notebooks = fixture_chapters(tmp_path / "nb", {"fine": 1.0, "dies": 2.0, "no_footer": 3.0})
    nb = nbformat.read(notebooks / "dies.ipynb", as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell("import os\nos._exit(1)"))
    nbformat.write(nb, notebooks / "dies.ipynb")
    nb = nbformat.read(notebooks / "no_footer.ipynb", as_version=4)
    nb.cells = nb.cells[:1]  # the parameters only: nothing glued
    nbformat.write(nb, notebooks / "no_footer.ipynb")
    out = tmp_path / "runs"
    out.mkdir()
    times, failed = reproduce.run_all(["dies", "missing", "no_footer", "fine"], out, "smoke", 0, jobs=1,
                                      notebooks=notebooks)
    assert failed == ["dies", "missing", "no_footer"] and list(times) == ["fine"]


@pytest.mark.parametrize("args, message", [
    (["--adopt", "no/such/folder"], "no such folder"),
    (["--seed", "-1"], "--seed must be >= 0, got -1"),
    (["--only"], "--only needs at least one chapter"),
    (["--scale", "full", "--only", "03_sampling"], "--scale full on the CPU .* on one GPU.* --yes"),
])
def test_bad_command_lines_are_refused_before_anything_runs(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HALLUC_DEVICE", "cpu")
    monkeypatch.setattr(sys, "argv", ["reproduce.py", *args, "--out", str(tmp_path / "runs")])
    with pytest.raises(SystemExit, match=message):
        reproduce.main()
    assert not (tmp_path / "runs").exists()


def papermill_run(source: Path, target: Path, scale: str) -> Path:
    """``source`` executed by papermill alone, as the README's command does (its metadata kept)."""
    import papermill

    papermill.execute_notebook(str(source), str(target), parameters={"scale": scale}, progress_bar=False)
    return target


@pytest.mark.slow
def test_adopt_reads_the_runs_own_record_never_the_metadata_it_kept(tmp_path):
    notebooks = fixture_chapters(tmp_path / "nb", {"ch": 1.0})
    committed = papermill_run(notebooks / "ch.ipynb", tmp_path / "committed.ipynb", "full")
    nb = nbformat.read(committed, as_version=4)
    nb.metadata["halluc_lab"] = reproduce.own_record(nb)  # a committed full-scale run on a GPU
    nb.metadata["halluc_lab"]["device"] = "cuda (NVIDIA H100 80GB HBM3)"
    nbformat.write(nb, notebooks / "ch.ipynb")
    before = (notebooks / "ch.ipynb").read_text()
    runs = tmp_path / "runs"
    runs.mkdir()

    papermill_run(notebooks / "ch.ipynb", runs / "ch.ipynb", "smoke")  # keeps the committed metadata
    assert nbformat.read(runs / "ch.ipynb", as_version=4).metadata["halluc_lab"]["scale"] == "full"
    with pytest.raises(SystemExit, match="scale='smoke'"):
        reproduce.adopt(runs, ["ch"], notebooks)
    (runs / "ch.ipynb").write_text(before)  # the committed notebook itself, not a run
    with pytest.raises(SystemExit, match="the committed run"):
        reproduce.adopt(runs, ["ch"], notebooks)
    nb = nbformat.read(runs / "ch.ipynb", as_version=4)
    nb.cells = nb.cells[:1]
    nbformat.write(nb, runs / "ch.ipynb")
    with pytest.raises(SystemExit, match="records no run of its own"):
        reproduce.adopt(runs, ["ch"], notebooks)
    assert (notebooks / "ch.ipynb").read_text() == before

    papermill_run(notebooks / "ch.ipynb", runs / "ch.ipynb", "full")
    reproduce.adopt(runs, ["ch"], notebooks)
    adopted = nbformat.read(notebooks / "ch.ipynb", as_version=4)
    assert adopted.metadata["halluc_lab"] == reproduce.own_record(adopted)
    assert adopted.metadata["halluc_lab"]["device"] == "cpu"


@pytest.mark.slow
def test_adopt_names_the_runs_that_stopped_part_way_and_how_to_adopt_the_others(tmp_path):
    notebooks = fixture_chapters(tmp_path / "nb", {"done": 1.0, "stopped": 1.0})
    before = {p.name: p.read_text() for p in notebooks.glob("*.ipynb")}
    runs = tmp_path / "runs"
    runs.mkdir()
    papermill_run(notebooks / "done.ipynb", runs / "done.ipynb", "full")
    stopped = nbformat.read(papermill_run(notebooks / "stopped.ipynb", runs / "stopped.ipynb", "full"),
                            as_version=4)
    stopped.cells = stopped.cells[:1]  # as papermill leaves a run killed before its footer
    nbformat.write(stopped, runs / "stopped.ipynb")
    with pytest.raises(SystemExit) as refused:
        reproduce.adopt(runs, ["done", "stopped"], notebooks)
    message = str(refused.value)
    assert "stopped.ipynb records no run of its own" in message and "done.ipynb" not in message.split("\n")[0]
    assert message.endswith(f"--adopt {runs} --only done")
    assert {p.name: p.read_text() for p in notebooks.glob("*.ipynb")} == before  # nothing copied

    reproduce.adopt(runs, ["done"], notebooks)  # what the message says to run
    assert reproduce.own_record(nbformat.read(notebooks / "done.ipynb", as_version=4))["scale"] == "full"


def test_a_second_seed_set_reaches_a_chapter_that_takes_one(tmp_path):
    notebooks = fixture_chapters(tmp_path / "nb", {"ch": 1.0, "plain": 1.0})
    nb = nbformat.read(notebooks / "ch.ipynb", as_version=4)
    nb.cells[0].source += "\nseeds = None"
    nb.cells.append(nbformat.v4.new_code_cell('glue("seeds_seen", seeds, display=False)'))
    nbformat.write(nb, notebooks / "ch.ipynb")
    assert reproduce.declares("ch", "seeds", notebooks)
    assert not reproduce.declares("plain", "seeds", notebooks)
    out = tmp_path / "runs"
    out.mkdir()
    reproduce.run("ch", out, "smoke", 0, notebooks=notebooks, seeds=[8, 9])
    ran = nbformat.read(out / "ch.ipynb", as_version=4)
    assert read_glue(ran)["seeds_seen"] == [8, 9]
    assert ran.metadata["halluc_lab"]["parameters"] == {"scale": "smoke", "seed": 0, "seeds": [8, 9]}


@pytest.mark.parametrize("argv, message", [
    (["--only", "01_autoregressive", "--seeds", "8"], "no `seeds` parameter: ['01_autoregressive']"),
    (["--only", "08_sft", "--seeds", "8", "8"], "distinct"),
])
def test_seeds_are_refused_where_a_chapter_cannot_take_them(monkeypatch, argv, message):
    monkeypatch.setattr(sys, "argv", ["reproduce.py", "--scale", "smoke", *argv])
    with pytest.raises(SystemExit, match=message.replace("[", r"\[").replace("]", r"\]")):
        reproduce.main()


def test_mps_without_nvidias_control_program_is_refused_before_anything_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-cuda-mps-control on it, as on any machine without CUDA
    monkeypatch.setattr(sys, "argv", ["reproduce.py", "--mps", "--only", "03_sampling", "--scale", "smoke",
                                      "--out", str(tmp_path / "runs")])
    with pytest.raises(SystemExit, match="--mps: nvidia-cuda-mps-control is not on PATH.*needs a CUDA GPU"):
        reproduce.main()
    assert not (tmp_path / "runs").exists()


def test_under_mps_the_chapters_run_as_clients_of_a_daemon_stopped_afterwards(tmp_path, monkeypatch):
    log = stand_in(tmp_path, monkeypatch)
    seen = {}

    def run_all(stems, out, *args, **kwargs):  # what the chapters' processes would inherit
        seen["pipe"] = os.environ.get(shared_gpu.ENV_PIPE)
        return {stem: 1.0 for stem in stems}, []

    monkeypatch.setattr(reproduce, "run_all", run_all)
    for name in (shared_gpu.ENV_PIPE, "HALLUC_BATCH", "MPLBACKEND", "XLA_PYTHON_CLIENT_PREALLOCATE"):
        monkeypatch.delenv(name, raising=False)  # main() sets some of these; each is put back after
    monkeypatch.setattr(sys, "argv", ["reproduce.py", "--mps", "--only", "03_sampling", "--scale", "smoke",
                                      "--no-book", "--out", str(tmp_path / "runs")])
    reproduce.main()
    assert seen["pipe"] is not None and seen["pipe"].endswith("pipe")
    assert log.read_text().splitlines() == [f"start {seen['pipe']}", f"quit {seen['pipe']}"]
    assert shared_gpu.ENV_PIPE not in os.environ
