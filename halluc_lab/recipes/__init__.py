"""Named training recipes: every model of the book, its stages, trained on first use and cached.

Chapters 7–8 define and train them; every later chapter gets its models only from here
(ARCHITECTURE.md §3). A recipe (:class:`Recipe`) is a frozen config: the task's world, the model's
shape, the optimisation, the stage and the recipe whose weights it starts from::

    import halluc_lab as hl
    from halluc_lab import recipes
    rt = hl.setup()
    kb = recipes.load("kb_walk-sft-clean", rt)   # trains kb_walk-pretrain, then this; or loads both
    kb.model, kb.tokenizer, kb.task, kb.history

**Stages** own how their data are assembled and what their training needs (the :class:`Stage`
interface of :mod:`halluc_lab.training.recipe`); each is defined beside its training and
re-exported here: :class:`Pretraining` (:mod:`halluc_lab.stages.pretraining`), :class:`SFT`
(:mod:`halluc_lab.stages.sft`), :class:`DPO`, :class:`RSFT` and :class:`OwnErrorsSFT`
(:mod:`halluc_lab.stages.preference`), :class:`PPO` (:mod:`halluc_lab.stages.rlhf`), :class:`RLVR`
(:mod:`halluc_lab.stages.rlvr`). Nothing chooses a stage by its name.

**Names** are ``<task>-<stage>`` with task in :data:`TASKS` and stage in :data:`STAGES`, each at
both scales (``recipes.get(name, "smoke")``). The registry is three tables in
:mod:`halluc_lab.recipes.registry` (:data:`SCALE_PLANS`, :data:`TASK_PLANS`, :data:`STAGE_PLANS`),
re-exported here: a new stage is a row, not a branch. :func:`with_seed` runs a whole chain under
another seed.

**The cache** — keys derived from the code that can change each recipe's bits and the platform,
checksummed entries, resumable training, the lock — is :mod:`halluc_lab.recipes.cache`; its public
names are re-exported here. :func:`chains` trains and loads every named recipe under several seeds.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import multiprocessing
import os
import tempfile
import warnings
from collections.abc import Hashable, Mapping, Sequence
from functools import lru_cache, partial

import torch

from halluc_lab.training.data import Batch
from halluc_lab.stages.preference import DPO, RSFT, OwnErrorsSFT
from halluc_lab.stages.pretraining import Pretraining
from halluc_lab.training.recipe import SCALES, Deferred, Recipe, Stage, with_seed
from halluc_lab.recipes.cache import (CacheError, CacheWarning, Platform, Trained, cache_root,
                                     code_fingerprint, code_hashes, code_modules, directory, key,
                                     load_recipe, used, used_code)
from halluc_lab.recipes.measured import cached, measured
from halluc_lab.recipes.registry import (NAMES, SCALE_PLANS, STAGE_PLANS, STAGES, TASK_PLANS, TASKS,
                                 _PARTS)
from halluc_lab.stages.rlhf import PPO
from halluc_lab.stages.rlvr import RLVR
from halluc_lab.stages.sft import SFT, ScheduledSampling
from halluc_lab.tasks import make_task
from halluc_lab.training.train import TrainConfig

__all__ = ["Recipe", "Deferred", "with_seed", "Stage", "Pretraining", "SFT", "ScheduledSampling",
           "DPO", "RSFT", "PPO", "OwnErrorsSFT", "RLVR", "get", "NAMES", "TASKS", "STAGES",
           "SCALES", "training_rows", "load", "load_recipe", "chains", "Trained", "CacheWarning",
           "CacheError", "Platform", "key", "directory", "cache_root", "code_modules",
           "code_hashes", "code_fingerprint", "used", "used_code", "prefetch", "measured", "cached",
           "SCALE_PLANS",
           "STAGE_PLANS", "TASK_PLANS"]


@lru_cache(maxsize=None)
def get(name: str, scale: str) -> Recipe:
    """The recipe called ``name`` at ``scale``: ``get("arithmetic-sft-backspace", "smoke")``.

    A stage the task's plan gives no steps trains one pass over its rows (pre-training): that
    count needs the whole corpus, so the recipe's ``train`` is :class:`Deferred`, counted on its
    first read (by the key, by training). Its name, stage and parents are there at once."""
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    if name not in _PARTS:
        raise ValueError(f"unknown recipe {name!r}; names are '<task>-<stage>' with task in "
                         f"{TASKS} and stage in {STAGES}")
    task, stage = _PARTS[name]
    plan, how, shape = TASK_PLANS[task, scale], STAGE_PLANS[stage], SCALE_PLANS[scale]
    parent = plan.parents.get(stage, how.parent)
    model = dataclasses.replace(shape.model,
                                vocab_size=make_task(plan.world).tokenizer().vocab_size)
    draft = Recipe(name, scale, plan.world, model, TrainConfig(steps=1, warmup_steps=0),
                   shape.batch_size, shape.seq_len, how.stage(plan),
                   None if parent is None else get(f"{task}-{parent}", scale), how.seed)
    steps, lr = plan.steps.get(stage), plan.lr.get(stage, how.lr[scale])
    train = (_train(draft, lr, how.warmup_divisor, steps) if steps else
             Deferred(partial(_train, draft, lr, how.warmup_divisor)))
    return dataclasses.replace(draft, train=train)


def _train(draft: Recipe, lr: float, warmup_divisor: int, steps: int | None = None) -> TrainConfig:
    """A registry recipe's optimisation: ``steps`` (None: one pass over the draft's rows)."""
    steps = steps or _one_pass(draft)
    return TrainConfig(steps=steps, lr=lr, warmup_steps=min(100, steps // warmup_divisor),
                       weight_decay=0.0, log_every=50,
                       checkpoint_every=max(1, min(200, steps // 4)))  # a killed run loses ≤ 1/4


def _one_pass(recipe: Recipe) -> int:
    """Optimizer steps of one pass over the recipe's rows.

    Counting them means generating and packing the whole corpus (seconds at smoke scale, about ten
    per task at full scale), so the count is kept in the cache beside the models, under the
    recipe's key: the key covers the recipe and the code that builds its rows, so a changed corpus
    is counted again. The file records the key and a checksum of the count; a file that does not
    match (edited, garbled, another key's) is reported and the rows counted again, so it can never
    decide how long a recipe trains.
    """
    k = key(recipe)
    path = os.path.join(cache_root(), "steps", recipe.name, f"{k}.json")
    if os.path.exists(path):
        steps = _read_count(path, k)
        if steps is not None:
            return steps
    rows = training_rows(recipe).input_ids.shape[0]
    steps = rows // recipe.batch_size
    if steps < 1:
        raise ValueError(f"{recipe.name}: its {rows} rows make no whole batch of "
                         f"{recipe.batch_size}: make the corpus bigger or the batch smaller")
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=os.path.dirname(path), suffix=".tmp",
                                         delete=False) as f:
            json.dump({"key": k, "steps": steps, "check": _count_check(k, steps)}, f)
        os.replace(f.name, path)  # whole or not at all: another process may read it now
    except OSError:
        pass  # a read-only cache still counts, only every time
    return steps


def _count_check(k: str, steps: int) -> str:
    return hashlib.sha256(f"{k}:{steps}".encode()).hexdigest()[:16]


def _read_count(path: str, k: str) -> int | None:
    """The count a step file holds if it is whole and checks out, else None (reported with its
    path)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        steps = data["steps"]
        if (data["key"] == k and isinstance(steps, int) and not isinstance(steps, bool)
                and steps >= 1 and data["check"] == _count_check(k, steps)):
            return steps
        fault = "its count does not match its key and checksum"
    except (OSError, ValueError, KeyError, TypeError) as e:
        fault = f"it is not a step count ({type(e).__name__}: {e})"
    warnings.warn(f"{path}: {fault}; counting the rows again", CacheWarning, stacklevel=3)
    return None


def training_rows(recipe: Recipe) -> Batch:
    """The packed rows a recipe trains on (the whole set;
    :func:`halluc_lab.training.data.batches` draws from it)."""
    return recipe.stage.rows(recipe)


def load(name: str | Recipe, rt, *, verbose: bool = False) -> Trained:
    """The trained model of a recipe on ``rt.device`` (a :class:`~halluc_lab.device.Runtime`):
    loaded from the cache, or trained now (its parent first) and cached. A name is the registry's
    recipe at ``rt.scale`` under the run's seed (``with_seed(get(name, rt.scale), rt.seed)``); a
    :class:`Recipe` is taken as it is. ``verbose``: one line per recipe."""
    recipe = name if isinstance(name, Recipe) else with_seed(get(name, rt.scale), rt.seed)
    return load_recipe(recipe, rt.device, rt.dtype, verbose=verbose)


def chains(names: Sequence[str] | Mapping[Hashable, str], seeds: Sequence[int],
           rt) -> dict[tuple, Trained]:
    """Every named recipe under every seed, each seed covering its whole chain, trained at once
    where the device allows (:func:`prefetch`) and loaded: ``{(label, seed): Trained}``.
    ``names``: recipe names (each its own label), or ``{label: name}``, e.g.
    ``{"SFT": "kb_walk-sft-clean", "RLVR": "kb_walk-rlvr"}``.

    A chapter that compares arms over seeds starts with this line instead of building the chains
    itself."""
    labelled = dict(names) if isinstance(names, Mapping) else {n: n for n in names}
    if isinstance(names, str) or not labelled:
        raise ValueError(f"names must be a non-empty sequence of recipe names or a mapping "
                         f"label -> name, got {names!r}")
    if isinstance(seeds, (str, bytes)) or not list(seeds):
        raise ValueError(f"seeds must be a non-empty sequence of ints >= 0, got {seeds!r}")
    todo = {(label, s): with_seed(get(name, rt.scale), s)
            for label, name in labelled.items() for s in seeds}
    prefetch(list(todo.values()), rt.device, rt.dtype)
    return {k: load_recipe(r, rt.device, rt.dtype) for k, r in todo.items()}


# -- several chains at once ------------------------------------------------------------------------
def _train_chains(groups: list[list[Recipe]], device: str, dtype: torch.dtype,
                  gpu: int | None = None, threads: int | None = None, measure=None) -> None:
    """Worker: load (train if needed) each chain's recipes in order, deterministic kernels on, and
    record ``measure`` of each (:func:`measured`) if given; ``gpu``: the index of the GPU that
    ``"cuda"`` means in this process; ``threads``: its CPU threads (:func:`worker_threads`)."""
    from halluc_lab.device import set_deterministic

    if gpu is not None:
        torch.cuda.set_device(gpu)
    if threads is not None:
        torch.set_num_threads(threads)
    set_deterministic(True)
    for chain in groups:
        for recipe in chain:  # a recorded measure needs no model: nothing to load or train
            if measure is None:
                load_recipe(recipe, device, dtype)
            else:
                measured(recipe, measure, device, dtype)


def _root(recipe: Recipe) -> Recipe:
    return recipe.pretraining


def worker_threads(device: torch.device | str, workers: int) -> int:
    """CPU threads for each of ``workers`` training processes on ``device``.

    On a CPU, this process's count: it is in a CPU recipe's key, so a worker must train with it.
    On a GPU the key holds the GPU model, not the threads, and each worker gets its share of this
    process's threads: spawned workers that each took every core (torch's default) kept a 64-core
    host with four GPUs at a load average of 600, the GPUs 0-28% busy."""
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    if torch.device(device).type == "cpu":
        return torch.get_num_threads()
    return max(1, torch.get_num_threads() // workers)


def prefetch(recipes: Sequence[Recipe], device: torch.device | str,
             dtype: torch.dtype = torch.float32, *, processes: int | None = None,
             measure=None, group_of=_root) -> None:
    """Make sure every recipe is trained and cached, training independent chains at once.

    Recipes that share a pre-training root (one seed's chain) train one after another in one
    process, parents first; chains of different roots (other seeds, other tasks) train in parallel
    processes. A training step of the lab's models is launch-bound on a GPU, so several processes
    keep it busy where one cannot (the speed-up is on the results page). ``processes``: how many at
    once (default: one per chain on CUDA, 1 elsewhere, where the work runs in this process). On a
    machine with several GPUs and ``device`` "cuda" (no index), the processes take the GPUs in
    turn: one seed's chain per GPU. Afterwards :func:`load` reads every recipe from the cache.

    ``measure``: record it of every recipe asked for, in the process that trains it
    (:func:`measured`; a picklable measure); a recipe whose record is cached is not loaded.
    ``group_of``: what makes recipes one chain (default: their pre-training root); e.g.
    ``lambda r: r`` once the parents are cached, to train the branches of one root, such as
    several RL runs from one SFT model, at once.
    """
    device = torch.device(device)
    by_root: dict[Hashable, list[Recipe]] = {}
    for r in recipes:
        by_root.setdefault(group_of(r), []).append(r)
    groups = list(by_root.values())
    n = processes if processes is not None else (len(groups) if device.type == "cuda" else 1)
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"processes must be an int >= 1, got {processes!r}")
    if n == 1:
        _train_chains(groups, str(device), dtype, measure=measure)
        return
    ctx = multiprocessing.get_context("spawn")  # CUDA cannot be used in a forked child
    gpus = torch.cuda.device_count() if device.type == "cuda" and device.index is None else 0
    threads = worker_threads(device, min(n, len(groups)))
    with ctx.Pool(min(n, len(groups))) as pool:
        pool.starmap(_train_chains, [(groups[i::n], str(device), dtype,
                                      i % gpus if gpus > 1 else None, threads, measure)
                                     for i in range(min(n, len(groups)))])
