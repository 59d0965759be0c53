"""Data parallelism: two CPU processes under torchrun (gloo) compute what one process computes.

The runs themselves are in ``ddp_worker.py``: each mode runs once under ``torchrun --nproc_per_node=2`` and,
as the reference, once as a plain single process (a world of one). Float sums over two ranks are ordered
differently from one process's, so losses and weights agree to float tolerance, not bit for bit; a resumed
distributed run agrees with an uninterrupted one exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from halluc_lab.training import distributed
from halluc_lab.training.distributed import Topology, shard, topology

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def _run(args: list[str], *, ranks: int, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    """``ddp_worker.py ARGS`` (or another script) in ``ranks`` processes: torchrun for 2, plain python for 1."""
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
                if ranks > 1 else [sys.executable])
    full_env = {**os.environ, "HALLUC_BATCH": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT,
                "CUDA_VISIBLE_DEVICES": "", **(env or {})}  # CPU processes and gloo, on any machine
    for k in distributed.ENV:  # a test run inside another distributed run must not inherit its rank
        full_env.pop(k, None)
    done = subprocess.run([*launcher, *args], cwd=HERE, env=full_env, capture_output=True, text=True, timeout=600)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(args)} on {ranks} process(es) failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def _json(path):
    with open(path) as f:
        return json.load(f)


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


# -- in one process ---------------------------------------------------------------------------------------
def test_topology_reads_what_torchrun_sets():
    assert topology({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4"}) == Topology(3, 1, 4)
    assert topology({}) == Topology() and Topology().is_main and not Topology(1, 1, 2).is_main


@pytest.mark.parametrize("environ", [{"RANK": "0"}, {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "two"},
                                     {"RANK": "2", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}])
def test_topology_rejects_a_partial_or_impossible_environment(environ):
    with pytest.raises(ValueError):
        topology(environ)


def test_shards_are_contiguous_cover_everything_and_differ_by_at_most_one():
    for n in (0, 1, 7, 12):
        for world in (1, 2, 3, 5):
            parts = [shard(n, at=r, of=world) for r in range(world)]
            assert [i for p in parts for i in range(n)[p]] == list(range(n))
            sizes = [p.stop - p.start for p in parts]
            assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
    with pytest.raises(ValueError):
        shard(4, at=2, of=2)
    with pytest.raises(ValueError):
        shard(-1, at=0, of=1)


def test_a_single_process_is_a_world_of_one():
    model = torch.nn.Linear(2, 2)
    assert not distributed.active() and distributed.world_size() == 1 and distributed.is_main()
    assert distributed.wrap(model) is model and not distributed.is_wrapped(model)
    x = torch.ones(3)
    assert distributed.all_sum(x) is x and distributed.gather_objects("a") == ["a"]
    assert distributed.broadcast_object(5) == 5 and distributed.mean_over_ranks(2.5) == 2.5
    assert distributed.start().type in ("cpu", "cuda") and not distributed.active()  # nothing to join


# -- two processes ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every worker mode, once in one process and once in two (the killed run then resumed)."""
    one, two = tmp_path_factory.mktemp("one"), tmp_path_factory.mktemp("two")
    for mode in ("train", "rlvr"):
        _run(["ddp_worker.py", mode, str(one)], ranks=1)
        _run(["ddp_worker.py", mode, str(two)], ranks=2)
    killed = _run(["ddp_worker.py", "crash", str(two)], ranks=2, check=False)
    _run(["ddp_worker.py", "resume", str(two)], ranks=2)
    return one, two, killed


@pytest.mark.slow
def test_two_processes_train_as_one_with_the_same_global_batch(runs):
    one, two, _ = runs
    a, b = _json(one / "train.json"), _json(two / "train.json")
    assert (a["world_size"], b["world_size"]) == (1, 2)
    assert b["step"] == a["step"] == list(range(1, 9))
    assert b["loss"] == pytest.approx(a["loss"], rel=1e-5) and b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
    assert _max_diff(load_file(one / "train-.safetensors"), load_file(two / "train-.safetensors")) < 1e-4


@pytest.mark.slow
def test_a_killed_distributed_run_resumes_as_if_never_interrupted(runs):
    _, two, killed = runs
    assert killed.returncode != 0  # rank 0 died in step 6; torchrun stopped the other rank
    assert sorted(os.listdir(two / "checkpoints")) == ["step-000004", "step-000008"]  # the resume wrote step 8
    straight, resumed = _json(two / "train.json"), _json(two / "resume.json")
    assert resumed["step"] == straight["step"] and resumed["loss"] == straight["loss"]
    assert _max_diff(load_file(two / "train-.safetensors"), load_file(two / "resume-.safetensors")) == 0


@pytest.mark.parametrize("loss", ["Listing3", "GRPO", "DrGRPO", "DAPO"])
@pytest.mark.slow
def test_distributed_rlvr_gathers_the_groups_and_weighs_each_rank_by_its_share(runs, loss):
    """Same rollouts (each prompt sampled from a generator of its own), so the same round statistics and
    updates: the rewards gathered over the ranks, the group advantages, the token- or sequence-level
    normalisation of each loss over the global batch."""
    one, two, _ = runs
    a, b = _json(one / "rlvr.json")[loss], _json(two / "rlvr.json")[loss]
    for key in ("reward", "abstained", "length", "bksp_rate", "zero_groups"):
        assert b[key] == pytest.approx(a[key], abs=1e-9), key
    assert b["kl"] == pytest.approx(a["kl"], rel=1e-4, abs=1e-7)
    assert _max_diff(load_file(one / f"rlvr-{loss}.safetensors"), load_file(two / f"rlvr-{loss}.safetensors")) < 1e-5


@pytest.mark.slow
def test_train_script_trains_a_recipe_on_two_processes_into_the_cache(tmp_path, monkeypatch):
    from halluc_lab import recipes
    from halluc_lab.device import setup

    env = {"HALLUC_CACHE": str(tmp_path)}
    done = _run([os.path.join(ROOT, "scripts", "train.py"), "arithmetic-pretrain", "--scale", "smoke"], ranks=2, env=env)
    assert "arithmetic-pretrain (smoke): trained" in done.stdout and "× 2 processes" in done.stdout
    assert done.stdout.count("is in the cache as") == 1  # rank 0 alone prints
    monkeypatch.setenv("HALLUC_CACHE", str(tmp_path))
    recipe = recipes.get("arithmetic-pretrain", "smoke")
    two = recipes.directory(recipe, recipes.Platform("torch.float32", processes=2, threads=1))
    assert os.path.exists(os.path.join(two, "DONE"))  # one complete entry, under the two processes' key
    assert _json(os.path.join(two, "meta.json"))["processes"] == 2
    single = recipes.load("arithmetic-pretrain", setup("smoke", "cpu", verbose=False))
    assert single.trained_now and single.path != two  # a sum over ranks adds in another order: another key


def test_train_script_rejects_an_unknown_recipe():
    done = _run([os.path.join(ROOT, "scripts", "train.py"), "no-such-recipe"], ranks=1, check=False)
    assert done.returncode == 2 and "unknown recipe 'no-such-recipe'" in done.stderr
