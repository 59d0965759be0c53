"""The cache that trains a recipe once and loads it afterwards: checksummed entries under derived
keys.

:mod:`halluc_lab.recipes` names each model of the book; :mod:`halluc_lab.training.recipe` defines
what a recipe is and the :class:`~halluc_lab.training.recipe.Stage` interface its training goes
through. This module trains a recipe once and loads it afterwards (ARCHITECTURE.md §3, §4), so any
notebook runs alone, in any order.

**Where.** Entries live in ``$HALLUC_CACHE/recipes/<name>/<key>/`` (without ``$HALLUC_CACHE``,
in ``$XDG_CACHE_HOME/halluc_lab`` or ``~/.cache/halluc_lab``), each beside a ``<key>.lock`` file:
a maintained file lock (``filelock``) keeps two processes from training one recipe at once.

**The key** (:func:`key`, :mod:`halluc_lab.recipes.cache_key`) hashes the recipe, a format version,
the code that can change its bits and the platform; this module re-exports its names.

**An entry** holds ``model/`` (a Hugging Face checkpoint and tokenizer, which
``AutoModelForCausalLM``/``AutoTokenizer`` load), ``history.json``, ``meta.json``, ``recipe.json``
(what the key covers) and, written last, ``DONE``: the SHA-256 of every other file, checked on
each load, and the weights are checked finite. A missing, garbled, truncated or extra file, or
weights that hold NaN or inf, are reported (a :class:`CacheWarning` naming the path and the fault)
and the recipe trained again; an intact entry of a different recipe or platform raises. While
training, ``checkpoints/`` holds the last checkpoints (the registry's recipes save about every
quarter of the run): a killed run resumes from them, not from step 0.
"""

from __future__ import annotations

import contextlib
import datetime
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

from halluc_lab.model import hf_convert
from halluc_lab.recipes import code_trees
from halluc_lab.recipes.cache_key import Platform, code_hashes, identity, key
# re-exported: the key's names, which recipes gathers from here
from halluc_lab.recipes.cache_key import (FORMAT_VERSION, code_fingerprint,  # noqa: F401
                                          code_modules)  # noqa: F401
from halluc_lab.training import distributed
from halluc_lab.model.transformer import Transformer
from halluc_lab.training.recipe import Recipe, lineage
from halluc_lab.tasks.base import Task, make_task
from halluc_lab.model.tokenizer import Tokenizer
from halluc_lab.training.train import CheckpointError, History, file_sha256, latest_checkpoint

ENV_CACHE = "HALLUC_CACHE"


class CacheError(OSError):
    """The cache cannot be used as configured (``$HALLUC_CACHE`` missing, not a folder,
    read-only)."""


# -- where the cache lives -------------------------------------------------------------------------
def cache_root() -> str:
    """``$HALLUC_CACHE``, else ``$XDG_CACHE_HOME/halluc_lab``, else ``~/.cache/halluc_lab``."""
    if os.environ.get(ENV_CACHE):
        return os.environ[ENV_CACHE]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "halluc_lab")


def _where() -> str:
    """How the cache folder was chosen, for error messages."""
    return (f"${ENV_CACHE}={cache_root()}" if os.environ.get(ENV_CACHE)
            else f"the cache folder {cache_root()}")


def usable_root() -> str:
    """:func:`cache_root`, created if missing; a :class:`CacheError` naming the variable and the
    path if it is not a folder or cannot be made."""
    root = cache_root()
    if os.path.exists(root) and not os.path.isdir(root):
        raise CacheError(f"{_where()} is not a folder: "
                         f"point ${ENV_CACHE} at a folder (or unset it)")
    try:
        os.makedirs(root, exist_ok=True)
    except OSError as e:
        raise CacheError(f"cannot create {_where()} ({e.strerror or e}): point ${ENV_CACHE} "
                         "at a folder "
                         "this process can write") from e
    return root


def directory(recipe: Recipe, platform: Platform | torch.dtype | None = None,
              device: torch.device | str = "cpu") -> str:
    """Where a recipe's checkpoint lives (platform as :func:`key`)."""
    return os.path.join(cache_root(), "recipes", recipe.name, key(recipe, platform, device))


# -- the cache -------------------------------------------------------------------------------------
class CacheWarning(UserWarning):
    """A cache entry was unusable (corrupt, truncated, half-written, non-finite): it is trained
    again."""


@dataclass
class Trained:
    """A recipe's model, ready to use."""

    recipe: Recipe  # what was trained
    model: Transformer  # on the requested device, in eval mode
    tokenizer: Tokenizer  # the task's vocabulary
    task: Task  # the task (verifier, examples)
    history: History  # the training metrics
    path: str  # the cache directory (``path/model`` is the Hugging Face checkpoint)
    # training wall time, as recorded when it was trained (if resumed: since the resume)
    seconds: float
    trained_now: bool  # True if this call trained it (False: loaded from the cache)


# (name, scale, key) -> code hashes, first use first
_USED: dict[tuple[str, str, str], dict[str, str]] = {}


def used() -> list[tuple[str, str]]:
    """``(name, key)`` of every recipe loaded in this process and of the recipes it started from,
    first use first, parents before children (a notebook's footer lists them). The same list whether
    they were trained now or read from the cache."""
    return [(name, k) for name, _, k in _USED]


def note_used(recipe: Recipe, platform: Platform) -> None:
    """Count ``recipe`` and the recipes it started from as used (:func:`used`): a cached recipe's
    parents were not loaded, but its weights come from them."""
    for r in lineage(recipe):
        _USED.setdefault((r.name, r.scale, key(r, platform)), code_hashes(r))


def used_code() -> dict[str, str]:
    """``{module: hash}`` over the keys of every recipe :func:`used` lists: what a footer records,
    so that a later code state can name the modules that moved (:func:`moved_modules`)."""
    out: dict[str, str] = {}
    for hashes in _USED.values():
        out.update(hashes)
    return dict(sorted(out.items()))


def moved_modules(recorded: dict[str, str],
                  source: Callable[[str], str] | None = None) -> list[str]:
    """The modules of ``recorded`` (``{module: hash}``, from :func:`used_code`) whose code is not
    what it was: changed, or gone."""
    moved = []
    for module, digest in sorted(recorded.items()):
        try:
            now = code_trees.module_hash(module, source)
        except (ImportError, AttributeError, OSError, SyntaxError):
            now = None
        if now != digest:
            moved.append(module)
    return moved


def load_recipe(recipe: Recipe, device: torch.device | str, dtype: torch.dtype = torch.float32, *,
                verbose: bool = False) -> Trained:
    """The trained model of ``recipe`` on ``device``, trained under autocast ``dtype`` (bfloat16 on
    CUDA, else float32): loaded from the cache, or trained now (its parent first) and cached.
    ``verbose``: one line per recipe, without paths. :func:`halluc_lab.recipes.load` takes a name
    and a runtime instead."""
    device = torch.device(device)
    platform = Platform.here(device, dtype)
    path = os.path.join(usable_root(), "recipes", recipe.name, key(recipe, platform))
    trained_now, main = False, distributed.is_main()
    try:
        # Under torchrun rank 0 checks the entry and holds the lock, every rank trains (the loops
        # shard the data), and rank 0 alone writes: the ranks must share one filesystem.
        if distributed.broadcast_object(main and _fault(path, recipe, platform) is not None):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with FileLock(path + ".lock") if main else contextlib.nullcontext():
                # None if another process finished it meanwhile
                fault = distributed.broadcast_object(_fault(path, recipe, platform) if main
                                                     else None)
                if fault is not None:
                    if main:
                        _discard(path, fault)
                    distributed.barrier()
                    _train(recipe, path, device, platform, verbose and main)
                    trained_now = True
        out = _read(path, recipe, device, trained_now)
    except OSError as e:
        if isinstance(e, CacheError):
            raise
        raise CacheError(f"{recipe.name}: the cache entry {path} cannot be used "
                         f"({type(e).__name__}: "
                         f"{e.strerror or e}); {_where()} must be a folder this process can "
                         "read and write") from e
    note_used(recipe, platform)
    if verbose and not trained_now and distributed.is_main():
        print(f"{recipe.name} ({recipe.scale}): loaded from the cache (trained in "
              f"{out.seconds:.0f} s)")
    return out


DONE = "DONE"  # the entry's manifest, {"sha256": {file: digest}} of every other file; written last


def _files(path: str) -> list[str]:
    """The files of an entry, relative and '/'-separated, without the manifest, checkpoints and
    dotfiles."""
    out = []
    for root, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if not d.startswith(".")
                   and not (root == path and d == "checkpoints")]
        out += [os.path.relpath(os.path.join(root, f), path).replace(os.sep, "/") for f in files
                if not f.startswith(".") and not (root == path and f == DONE)]
    return sorted(out)


def _json(path: str):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _fault(path: str, recipe: Recipe, platform: Platform) -> str | None:
    """What is wrong with the entry at ``path`` ("" if there are no files yet, or checkpoints only),
    or None if it is complete, each file has its recorded SHA-256 and the weights are finite. Raises
    if it is intact but of another recipe or platform."""
    if not os.path.exists(os.path.join(path, DONE)):
        left = _files(path) if os.path.isdir(path) else []
        return f"no {DONE} file but {left}: an interrupted write" if left else ""
    try:
        recorded = {str(f): str(digest)
                    for f, digest in _json(os.path.join(path, DONE))["sha256"].items()}
    # not the JSON _train writes
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return f"{DONE} is not a manifest of checksums ({type(e).__name__}: {e})"
    files = _files(path)
    if files != sorted(recorded) or "recipe.json" not in recorded:
        return f"its files {files} are not those {DONE} records ({sorted(recorded)})"
    bad = [f for f in files if file_sha256(os.path.join(path, f)) != recorded[f]]
    if bad:
        return f"{bad} differ from the SHA-256 recorded when written (corrupt or truncated)"
    # as written
    expected = json.loads(json.dumps(identity(recipe, platform), sort_keys=True, default=str))
    try:
        written = _json(os.path.join(path, "recipe.json"))
    except ValueError as e:
        return f"recipe.json is not JSON ({e})"
    if written != expected:
        raise ValueError(f"{path} holds a checkpoint of a different recipe or platform "
                         "(same key, other "
                         "config): delete the directory or bump cache_key.FORMAT_VERSION")
    return _unloadable(path, recipe)


def _unloadable(path: str, recipe: Recipe) -> str | None:
    """Why an entry whose checksums match cannot be used — it does not load, or its weights hold NaN
    or inf — or None. Checksums catch damage after the write; this catches what was wrong when
    written (or re-hashed)."""
    try:
        model = _read(path, recipe, torch.device("cpu"), False).model
    # whatever a damaged file raises, the entry is trained again
    except Exception as e:  # noqa: BLE001
        return f"it does not load ({type(e).__name__}: {e})"
    bad = [k for k, t in model.state_dict().items() if t.is_floating_point()
           and not bool(torch.isfinite(t).all())]
    return f"its weights {bad[:5]}{' …' if len(bad) > 5 else ''} hold NaN or inf" if bad else None


def _discard(path: str, fault: str) -> None:
    """Report a faulty entry and delete all of it but its checkpoints (a killed run resumes from
    them)."""
    root = os.path.realpath(os.path.join(cache_root(), "recipes"))
    # Recipe's name check keeps this from happening
    if os.path.commonpath([root, os.path.realpath(path)]) != root:
        raise CacheError(f"refusing to delete {path}: it lies outside {root}")
    if fault:
        warnings.warn(f"{path}: {fault}; training it again", CacheWarning, stacklevel=3)
    for name in sorted(set(os.listdir(path)) - {"checkpoints"}) if os.path.isdir(path) else []:
        if os.path.isdir(os.path.join(path, name)) and not os.path.islink(os.path.join(path, name)):
            shutil.rmtree(os.path.join(path, name))
        else:
            os.remove(os.path.join(path, name))


def _start(recipe: Recipe, device: torch.device, dtype: torch.dtype, verbose: bool) -> Transformer:
    """The model a recipe trains from: its parent's weights (loaded, or trained first) or a seeded
    random init."""
    if recipe.parent is None:
        return Transformer(recipe.model, seed=recipe.seed).to(device)
    return load_recipe(recipe.parent, device, dtype, verbose=verbose).model


def _run(recipe: Recipe, checkpoints: str, device: torch.device, dtype: torch.dtype,
         verbose: bool) -> tuple[Transformer, History, float]:
    """Train from the starting model, resuming if possible; the seconds count this stage's training
    alone, not its parent's (which another process may be training while this one waits)."""
    model = _start(recipe, device, dtype, verbose)
    start = time.perf_counter()
    hist = recipe.stage.fit(recipe, model, device, dtype, checkpoints)
    return model, hist, time.perf_counter() - start


def _train(recipe: Recipe, path: str, device: torch.device, platform: Platform,
           verbose: bool) -> None:
    """Train (resuming from ``path/checkpoints``), write the entry's files, then its manifest."""
    dtype = getattr(torch, platform.dtype.removeprefix("torch."))
    checkpoints = os.path.join(path, "checkpoints")
    resumed = latest_checkpoint(checkpoints)
    try:
        model, hist, seconds = _run(recipe, checkpoints, device, dtype, verbose)
    except CheckpointError as e:  # a corrupt checkpoint: report it, start over
        distributed.barrier()  # every rank has failed to read it before it goes
        if distributed.is_main():
            warnings.warn(f"{checkpoints}: {e}; training from step 0", CacheWarning, stacklevel=3)
            shutil.rmtree(checkpoints)
        distributed.barrier()
        resumed = None
        model, hist, seconds = _run(recipe, checkpoints, device, dtype, verbose)
    if distributed.is_main():  # under torchrun every rank holds the same model; one writes it
        _write(recipe, path, model, hist, seconds, device, platform, resumed)
    distributed.barrier()
    if verbose:
        how = "trained" if resumed is None else f"resumed from {os.path.basename(resumed)}"
        ranks = platform.processes
        print(f"{recipe.name} ({recipe.scale}): {how}, {recipe.train.steps} steps on {device.type}"
              f"{f' × {ranks} processes' if ranks > 1 else ''} in {seconds:.1f} s, final loss "
              f"{hist.loss[-1]:.3f}")


def _write(recipe: Recipe, path: str, model: nn.Module, hist: History, seconds: float,
           device: torch.device, platform: Platform, resumed: str | None) -> None:
    """Write a trained entry's files, then its manifest, and drop its checkpoints."""
    checkpoints = os.path.join(path, "checkpoints")
    tok = make_task(recipe.task).tokenizer()
    hf_convert.save_pretrained(model, os.path.join(path, "model"), bos_token_id=tok.bos_id,
                               eos_token_id=tok.eos_id, pad_token_id=tok.pad_id)
    tok.save(os.path.join(path, "model"))
    meta = {"seconds": seconds, "device": str(device), "date": datetime.date.today().isoformat(),
            "resumed_from": None if resumed is None else os.path.basename(resumed),
            "processes": platform.processes}
    for name, data in (("history.json", hist.to_dict()), ("meta.json", meta),
                       ("recipe.json", identity(recipe, platform))):
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
