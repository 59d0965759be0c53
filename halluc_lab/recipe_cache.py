"""What determines a trained model, and the cache that trains it once: derived keys, checksummed entries.

:mod:`halluc_lab.recipes` names each model of the book (its registry and its stages); this module
holds what the cache needs to know of a recipe — :class:`Recipe` and the :class:`Stage` interface
the training goes through — and trains a recipe once and loads it afterwards (ARCHITECTURE.md §3), so
any notebook runs alone, in any order.

**A stage** is a frozen dataclass that owns how its data are assembled and what its training
needs; the cache calls one method, ``fit(recipe, model, device, dtype, checkpoints) -> History``,
whose default runs :func:`halluc_lab.train.train` over four more: ``rows(recipe)`` (every packed row
it trains on), ``data(recipe, device)`` (``step -> Batch``, seeded draws from the rows, so a resumed
run sees what an uninterrupted one would), ``prepare(recipe)`` (``prepare(model, batch, step) ->
batch`` before each step, or None) and ``loss(recipe)`` (``loss(model, batch) -> (summed loss,
count)``). A preference stage (DPO, RSFT) is one more dataclass of those four; an RL stage, whose
training is rounds of rollouts and updates, overrides ``fit`` (:class:`halluc_lab.rlhf.PPOTraining`):
no loop, table or branch of the cache changes.

**Where.** Entries live in ``$HALLUC_CACHE/recipes/<name>/<key>/`` (without ``$HALLUC_CACHE``,
in ``$XDG_CACHE_HOME/halluc_lab`` or ``~/.cache/halluc_lab``), each beside a ``<key>.lock`` file:
a maintained file lock (``filelock``) keeps two processes from training one recipe at once.

**The key** hashes the recipe (its parents included), the autocast dtype, :data:`FORMAT_VERSION`
and :func:`code_fingerprint`: the syntax trees, without docstrings, of the modules the recipe's code
uses (:func:`code_modules`) — those defining the classes of its chain (recipe, stage, task, model,
loss, batch preparation), the loop and the checkpoint format, followed through their ``halluc_lab``
imports. So a changed config or a changed line of that code trains afresh and never loads
another's weights; editing prose, or a module the recipe never imports, does not. Bump
:data:`FORMAT_VERSION` for a change the fingerprint cannot see (a library that computes differently).
Code outside ``halluc_lab`` (a stage a notebook defines) enters the key by its config and class
name only: rename it when its code changes.

**An entry** holds ``model/`` (a Hugging Face checkpoint and tokenizer, which
``AutoModelForCausalLM``/``AutoTokenizer`` load), ``history.json``, ``meta.json``, ``recipe.json``
(what the key covers) and, written last, ``DONE``: the SHA-256 of every other file, checked on
each load. A missing, garbled, truncated or extra file is reported (a :class:`CacheWarning`
naming the path and the fault) and the recipe trained again; an intact entry of a different
recipe raises. While training, ``checkpoints/`` holds the last checkpoints (the registry's recipes
save about every quarter of the run): a killed run resumes from them, not from step 0.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import json
import os
import shutil
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from filelock import FileLock
from torch import nn

from halluc_lab import code_trees, distributed, hf_convert
from halluc_lab.data import Batch, batches
from halluc_lab.model import ModelConfig, Transformer
from halluc_lab.tasks import Task, TaskConfig, make_task
from halluc_lab.tokenizer import Tokenizer
from halluc_lab.train import (CheckpointError, History, Loss, NextTokenLoss, TrainConfig, file_sha256, latest_checkpoint,
                              train)

FORMAT_VERSION = 2  # bump for a change the code fingerprint cannot see (2: entries carry checksums)
SCALES = ("smoke", "full")
ENV_CACHE = "HALLUC_CACHE"


# -- recipes and stages ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Recipe:
    """Everything that determines a trained model."""

    name: str  # "<task>-<stage>", e.g. "kb_walk-sft-clean"
    scale: str  # "smoke" or "full"
    task: TaskConfig  # the task's world, splits and corpus
    model: ModelConfig  # the decoder's shape (a recipe with a parent repeats the parent's)
    train: TrainConfig  # optimisation
    batch_size: int  # packed rows per optimizer step
    seq_len: int  # tokens per packed row
    stage: Stage  # what it trains on and how (halluc_lab.recipes: Pretraining, SFT)
    parent: Recipe | None = None  # the recipe whose weights this one starts from (None: random init)
    seed: int = 0  # model initialisation, data order and data draws

    def __post_init__(self):
        if self.scale not in SCALES:
            raise ValueError(f"scale must be one of {SCALES}, got {self.scale!r}")
        for name, low in (("batch_size", 1), ("seq_len", 1), ("seed", 0)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise ValueError(f"{name} must be an int >= {low}, got {v!r}")
        if not isinstance(self.stage, Stage):
            raise TypeError(f"stage must be a Stage (recipes.Pretraining, recipes.SFT, ...), "
                            f"got {type(self.stage).__name__}")
        if self.parent is not None and self.parent.model != self.model:
            raise ValueError(f"{self.name}: its model config differs from its parent's ({self.parent.name})")

    @property
    def pretraining(self) -> Recipe:
        """The recipe at the root of this one's parents (itself for a pre-training recipe)."""
        return self if self.parent is None else self.parent.pretraining


def with_seed(recipe: Recipe, seed: int) -> Recipe:
    """The same chain under another seed: the root's seed becomes ``seed`` and every parent's moves
    by as much, so each keeps its own draws (``with_seed(r, 0)`` is the registry's ``r``)."""
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")
    shift = seed - recipe.pretraining.seed
    parent = None if recipe.parent is None else with_seed(recipe.parent, seed)  # the same root, the same shift
    return dataclasses.replace(recipe, seed=recipe.seed + shift, parent=parent)


Prepare = Callable[[nn.Module, Batch, int], Batch]
"""``prepare(model, batch, step) -> batch``: what is done to a batch before its optimizer step."""


@dataclass(frozen=True)
class Stage:
    """What every stage offers; a subclass defines at least :meth:`rows`."""

    def rows(self, recipe: Recipe) -> Batch:
        """Every packed row the stage trains on."""
        raise NotImplementedError(f"{type(self).__name__} must define rows(recipe)")

    def data(self, recipe: Recipe, device: torch.device) -> Callable[[int], Batch]:
        """``step -> Batch``: ``recipe.batch_size`` rows per step, each epoch in a fresh seeded order."""
        return batches(self.rows(recipe).to(device), recipe.batch_size, recipe.seed)

    def prepare(self, recipe: Recipe) -> Prepare | None:
        """What is done to each batch before its step (None: nothing)."""
        return None

    def loss(self, recipe: Recipe) -> Loss:
        """The loss the loop minimises: next-token cross-entropy on the batch's labels."""
        return NextTokenLoss()

    def fit(self, recipe: Recipe, model: nn.Module, device: torch.device, dtype: torch.dtype,
            checkpoints: str) -> History:
        """Train ``model`` in place (resuming from ``checkpoints``); its history. By default the loss-agnostic
        loop over :meth:`data`, :meth:`prepare` and :meth:`loss`; a stage that is not one loss minimised step by
        step (PPO's rounds of rollouts and updates) overrides this instead."""
        return train(model, self.data(recipe, device), recipe.train, checkpoint_dir=checkpoints, resume=True,
                     loss=self.loss(recipe), prepare=self.prepare(recipe), autocast_dtype=dtype, desc=recipe.name)


# -- the key: the recipe and the code it uses -------------------------------------------------------
def cache_root() -> str:
    """``$HALLUC_CACHE``, else ``$XDG_CACHE_HOME/halluc_lab``, else ``~/.cache/halluc_lab``."""
    if os.environ.get(ENV_CACHE):
        return os.environ[ENV_CACHE]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "halluc_lab")


def _canonical(value):
    """A recipe as plain data, every dataclass in it with its type's name (``asdict`` would drop the types, and
    two configs with the same fields — a task's, a stage's, a policy loss's — would share a key)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"__type__": type(value).__name__,
                **{f.name: _canonical(getattr(value, f.name)) for f in dataclasses.fields(value)}}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items()}
    return value


def code_modules(recipe: Recipe, source: Callable[[str], str] | None = None) -> tuple[str, ...]:
    """The halluc_lab modules whose code shapes a recipe's weights, sorted: those defining the recipe, stage,
    task, model, loss and batch preparation of each recipe of the chain, the loop, the checkpoint format and
    this module, and every halluc_lab module they import, transitively (``source(module)``: its text).

    >>> from halluc_lab import recipes
    >>> "halluc_lab.interactive" in code_modules(recipes.get("kb_walk-sft-clean", "smoke"))
    False
    """
    roots = {__name__, train.__module__, Transformer.__module__, hf_convert.__name__}  # what _train calls
    for r in _lineage(recipe):
        for obj in (r, r.stage, r.task, r.model, r.stage.loss(r), r.stage.prepare(r)):
            roots.add(getattr(obj, "__module__", None) or type(obj).__module__)
    return code_trees.closure(roots, source or code_trees.read_source)


def code_fingerprint(recipe: Recipe, source: Callable[[str], str] | None = None) -> str:
    """:func:`halluc_lab.code_trees.fingerprint` of :func:`code_modules`: a hash of their syntax trees without
    docstrings, which changes when their code does, not when their prose does or with the Python version."""
    source = source or code_trees.read_source
    return code_trees.fingerprint(code_modules(recipe, source), source)


def _identity(recipe: Recipe, dtype: torch.dtype) -> dict:
    """Everything the cache key covers, as plain data."""
    return {"format": FORMAT_VERSION, "code": code_fingerprint(recipe), "dtype": str(dtype),
            "recipe": _canonical(recipe)}


def key(recipe: Recipe, dtype: torch.dtype = torch.float32) -> str:
    """The cache key: a hash of the recipe, the autocast dtype, :data:`FORMAT_VERSION` and the code it uses."""
    blob = json.dumps(_identity(recipe, dtype), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def directory(recipe: Recipe, dtype: torch.dtype = torch.float32) -> str:
    """Where a recipe's checkpoint lives."""
    return os.path.join(cache_root(), "recipes", recipe.name, key(recipe, dtype))


# -- the cache -----------------------------------------------------------------------------------------
class CacheWarning(UserWarning):
    """A cache entry was unusable (corrupt, truncated, half-written): it is trained again."""


@dataclass
class Trained:
    """A recipe's model, ready to use."""

    recipe: Recipe  # what was trained
    model: Transformer  # on the requested device, in eval mode
    tokenizer: Tokenizer  # the task's vocabulary
    task: Task  # the task (verifier, examples)
    history: History  # the training metrics
    path: str  # the cache directory (``path/model`` is the Hugging Face checkpoint)
    seconds: float  # training wall time, as recorded when it was trained (if resumed: since the resume)
    trained_now: bool  # True if this call trained it (False: loaded from the cache)


_USED: dict[tuple[str, str, str], None] = {}  # (name, scale, key) of each recipe loaded in this process, in order


def used() -> list[tuple[str, str]]:
    """``(name, key)`` of every recipe loaded in this process and of the recipes it started from, first use first,
    parents before children (a notebook's footer lists them). The same list whether they were trained now or read
    from the cache."""
    return [(name, k) for name, _, k in _USED]


def _lineage(recipe: Recipe) -> list[Recipe]:
    """The recipe's chain from its pre-training root down to itself."""
    return ([] if recipe.parent is None else _lineage(recipe.parent)) + [recipe]


def load_recipe(recipe: Recipe, device: torch.device | str, dtype: torch.dtype = torch.float32, *,
                verbose: bool = False) -> Trained:
    """The trained model of ``recipe`` on ``device``, trained under autocast ``dtype`` (bfloat16 on CUDA, else
    float32): loaded from the cache, or trained now (its parent first) and cached. ``verbose``: one line per
    recipe, without paths. :func:`halluc_lab.recipes.load` takes a name and a runtime instead."""
    device = torch.device(device)
    path = directory(recipe, dtype)
    trained_now, main = False, distributed.is_main()
    # Under torchrun rank 0 checks the entry and holds the lock, every rank trains (the loops shard the data),
    # and rank 0 alone writes: the ranks must share one filesystem.
    if distributed.broadcast_object(main and _fault(path, recipe, dtype) is not None):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with FileLock(path + ".lock") if main else contextlib.nullcontext():
            # None if another process finished it meanwhile
            fault = distributed.broadcast_object(_fault(path, recipe, dtype) if main else None)
            if fault is not None:
                if main:
                    _discard(path, fault)
                distributed.barrier()
                _train(recipe, path, device, dtype, verbose and main)
                trained_now = True
    out = _read(path, recipe, device, trained_now)
    for r in _lineage(recipe):  # a cached recipe's parents were not loaded, but its weights come from them
        _USED[r.name, r.scale, os.path.basename(directory(r, dtype))] = None
    if verbose and not trained_now and distributed.is_main():
        print(f"{recipe.name} ({recipe.scale}): loaded from the cache (trained in {out.seconds:.0f} s)")
    return out


DONE = "DONE"  # the entry's manifest, {"sha256": {file: digest}} of every other file; written last


def _files(path: str) -> list[str]:
    """The files of an entry, relative and '/'-separated, without the manifest, checkpoints and dotfiles."""
    out = []
    for root, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if not d.startswith(".") and not (root == path and d == "checkpoints")]
        out += [os.path.relpath(os.path.join(root, f), path).replace(os.sep, "/") for f in files
                if not f.startswith(".") and not (root == path and f == DONE)]
    return sorted(out)


def _json(path: str):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _fault(path: str, recipe: Recipe, dtype: torch.dtype) -> str | None:
    """What is wrong with the entry at ``path`` ("" if there are no files yet, or checkpoints only), or None
    if it is complete and each file has its recorded SHA-256. Raises if it is intact but of another recipe."""
    if not os.path.exists(os.path.join(path, DONE)):
        left = _files(path) if os.path.isdir(path) else []
        return f"no {DONE} file but {left}: an interrupted write" if left else ""
    try:
        recorded = {str(f): str(digest) for f, digest in _json(os.path.join(path, DONE))["sha256"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:  # not the JSON _train writes
        return f"{DONE} is not a manifest of checksums ({type(e).__name__}: {e})"
    files = _files(path)
    if files != sorted(recorded) or "recipe.json" not in recorded:
        return f"its files {files} are not those {DONE} records ({sorted(recorded)})"
    bad = [f for f in files if file_sha256(os.path.join(path, f)) != recorded[f]]
    if bad:
        return f"{bad} differ from the SHA-256 recorded when written (corrupt or truncated)"
    expected = json.loads(json.dumps(_identity(recipe, dtype), sort_keys=True, default=str))  # as written
    if _json(os.path.join(path, "recipe.json")) != expected:
        raise ValueError(f"{path} holds a checkpoint of a different recipe (same key, other config): "
                         "delete the directory or bump recipe_cache.FORMAT_VERSION")
    return None


def _discard(path: str, fault: str) -> None:
    """Report a faulty entry and delete all of it but its checkpoints (a killed run resumes from them)."""
    if fault:
        warnings.warn(f"{path}: {fault}; training it again", CacheWarning, stacklevel=3)
    for name in sorted(set(os.listdir(path)) - {"checkpoints"}) if os.path.isdir(path) else []:
        if os.path.isdir(os.path.join(path, name)):
            shutil.rmtree(os.path.join(path, name))
        else:
            os.remove(os.path.join(path, name))


def _run(recipe: Recipe, checkpoints: str, device: torch.device, dtype: torch.dtype,
         verbose: bool) -> tuple[Transformer, History]:
    """Train from the parent's weights (loaded or trained first) or a seeded random init; resume if possible."""
    if recipe.parent is None:
        model = Transformer(recipe.model, seed=recipe.seed).to(device)
    else:
        model = load_recipe(recipe.parent, device, dtype, verbose=verbose).model
    return model, recipe.stage.fit(recipe, model, device, dtype, checkpoints)


def _train(recipe: Recipe, path: str, device: torch.device, dtype: torch.dtype, verbose: bool) -> None:
    """Train (resuming from ``path/checkpoints``), write the entry's files, then its manifest."""
    checkpoints = os.path.join(path, "checkpoints")
    resumed = latest_checkpoint(checkpoints)
    start = time.perf_counter()
    try:
        model, hist = _run(recipe, checkpoints, device, dtype, verbose)
    except CheckpointError as e:  # a corrupt checkpoint: report it, start over
        distributed.barrier()  # every rank has failed to read it before it goes
        if distributed.is_main():
            warnings.warn(f"{checkpoints}: {e}; training from step 0", CacheWarning, stacklevel=3)
            shutil.rmtree(checkpoints)
        distributed.barrier()
        resumed = None
        model, hist = _run(recipe, checkpoints, device, dtype, verbose)
    seconds = time.perf_counter() - start
    if distributed.is_main():  # under torchrun every rank holds the same model; one writes it
        _write(recipe, path, model, hist, seconds, device, dtype, resumed)
    distributed.barrier()
    if verbose:
        how, ranks = "trained" if resumed is None else f"resumed from {os.path.basename(resumed)}", distributed.world_size()
        print(f"{recipe.name} ({recipe.scale}): {how}, {recipe.train.steps} steps on {device.type}"
              f"{f' × {ranks} processes' if ranks > 1 else ''} in {seconds:.1f} s, final loss {hist.loss[-1]:.3f}")


def _write(recipe: Recipe, path: str, model: nn.Module, hist: History, seconds: float, device: torch.device,
           dtype: torch.dtype, resumed: str | None) -> None:
    """Write a trained entry's files, then its manifest, and drop its checkpoints."""
    checkpoints = os.path.join(path, "checkpoints")
    tok = make_task(recipe.task).tokenizer()
    hf_convert.save_pretrained(model, os.path.join(path, "model"), bos_token_id=tok.bos_id,
                               eos_token_id=tok.eos_id, pad_token_id=tok.pad_id)
    tok.save(os.path.join(path, "model"))
    meta = {"seconds": seconds, "device": str(device), "date": datetime.date.today().isoformat(),
            "resumed_from": None if resumed is None else os.path.basename(resumed),
            "processes": distributed.world_size()}
    for name, data in (("history.json", hist.to_dict()), ("meta.json", meta),
                       ("recipe.json", _identity(recipe, dtype))):
        with open(os.path.join(path, name), "w", encoding="utf-8") as f:
            json.dump(data, f, sort_keys=True, default=str, indent=1)
    manifest = {"sha256": {name: file_sha256(os.path.join(path, name)) for name in _files(path)}}
    with open(os.path.join(path, DONE + ".tmp"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
    os.replace(os.path.join(path, DONE + ".tmp"), os.path.join(path, DONE))  # the entry is complete
    shutil.rmtree(checkpoints, ignore_errors=True)


def _read(path: str, recipe: Recipe, device: torch.device, trained_now: bool) -> Trained:
    model = hf_convert.load_pretrained(os.path.join(path, "model"))
    if model.config != recipe.model:
        raise ValueError(f"{path}: the saved model's config differs from the recipe's")
    task = make_task(recipe.task)
    tok = Tokenizer.load(os.path.join(path, "model"))
    if tok != task.tokenizer():
        raise ValueError(f"{path}: the saved tokenizer differs from the task's vocabulary")
    hist = History.from_dict(_json(os.path.join(path, "history.json")))
    seconds = _json(os.path.join(path, "meta.json"))["seconds"]
    return Trained(recipe, model.to(device).eval(), tok, task, hist, path, seconds, trained_now)
