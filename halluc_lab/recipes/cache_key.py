"""The key of a recipe's cache entry: a hash of everything that decides a trained model's bits.

:mod:`halluc_lab.recipes.cache` trains a recipe once and keeps it under this key, and re-exports
these names (ARCHITECTURE.md §3, §4).

**The key** hashes everything that decides a trained model's bits, and nothing else:

- the recipe (its parents included), as plain data with every config's type name;
- :data:`FORMAT_VERSION`, for what the code cannot show (the entry's layout, a library that computes
  otherwise);
- the code that can change the weights (:func:`code_modules`): the syntax trees, without docstrings,
  of the modules that define the configs of each recipe of the chain (recipe, stage, task, model,
  the stage's nested configs), its loss and batch preparation, and the loop, followed through their
  ``halluc_lab`` imports. A stage lives beside its training, and a task's recipes import their
  task's module only, so a change to RLVR code moves RLVR keys alone and a pre-training key covers
  no post-training code. Modules that cannot change the bits (:data:`EXEMPT`, each backed by a test)
  are left out, and so are this module and the cache itself;
- the platform (:class:`Platform`): the autocast dtype, the number of processes (a sum over ranks
  adds in another order), on a CPU the number of threads, on a GPU its model. Two runs that can give
  different weights never share a key.

The hash of each module is recorded in the entry (``recipe.json``) and glued by a chapter's footer,
so a key that moved names the module whose code did. Code outside ``halluc_lab`` (a stage a notebook
defines) enters the key by its config and class name only: rename it when its code changes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass

import torch

from halluc_lab.recipes import code_trees
from halluc_lab.training import distributed
from halluc_lab.model.transformer import Transformer
from halluc_lab.training.recipe import Recipe, lineage
from halluc_lab.training.train import History

# bump for a change the code fingerprint cannot see (2: checksums; 3: per-stage code, platform)
FORMAT_VERSION = 3
# Modules left out of every key, and why each cannot change a trained model's bits (each backed by a
# test):
EXEMPT = (
    # progress bars: print, draw no random numbers (test_progress_changes_no_bits)
    "halluc_lab.progress",
    "halluc_lab.recipes.code_trees",  # the key's own machinery: FORMAT_VERSION covers it
    # this module, the key's own machinery: FORMAT_VERSION covers it
    "halluc_lab.recipes.cache_key",
    "halluc_lab.recipes.cache",  # the cache's entries and loading: FORMAT_VERSION covers them
)


@dataclass(frozen=True)
class Platform:
    """What besides a recipe and its code decides the bits of the model it trains."""

    dtype: str  # the autocast dtype ("torch.bfloat16" on CUDA, "torch.float32" on a CPU)
    processes: int = 1  # torchrun's world size: a gradient summed over ranks adds in another order
    # on a CPU, torch's intra-op threads (they split sums); None on a GPU
    threads: int | None = None
    # on CUDA, the GPU's model (another model gives other low bits); None elsewhere
    gpu: str | None = None

    @classmethod
    def here(cls, device: torch.device | str = "cpu",
             dtype: torch.dtype = torch.float32) -> Platform:
        """This process's platform for training on ``device`` under autocast ``dtype``."""
        device = torch.device(device)
        return cls(str(dtype), distributed.world_size(),
                   torch.get_num_threads() if device.type == "cpu" else None,
                   torch.cuda.get_device_name(device) if device.type == "cuda" else
                   (None if device.type == "cpu" else device.type))


def _canonical(value):
    """A recipe as plain data, every dataclass in it with its type's name (``asdict`` would drop the
    types, and two configs with the same fields — a task's, a stage's, a policy loss's — would share
    a key)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"__type__": type(value).__name__,
                **{f.name: _canonical(getattr(value, f.name)) for f in dataclasses.fields(value)}}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items()}
    return value


def _config_modules(value, found: set[str]) -> set[str]:
    """The modules defining every dataclass inside ``value`` (the recipe's configs, nested), and
    their bases'."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        found |= {c.__module__ for c in type(value).__mro__}
        for f in dataclasses.fields(value):
            _config_modules(getattr(value, f.name), found)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _config_modules(v, found)
    return found


def code_modules(recipe: Recipe, source: Callable[[str], str] | None = None) -> tuple[str, ...]:
    """The halluc_lab modules whose code can change a recipe's weights, sorted: those defining the
    configs of each recipe of the chain (recipe, stage, task, model and every config nested in
    them), its loss and batch preparation, the model and the loop, and every halluc_lab module they
    import, transitively, but :data:`EXEMPT` (``source(module)``: its text).

    >>> from halluc_lab import recipes
    >>> "halluc_lab.stages.rlvr" in code_modules(recipes.get("kb_walk-sft-clean", "smoke"))
    False
    """
    roots = {Transformer.__module__, train_module()}
    for r in lineage(recipe):
        _config_modules(r, roots)
        for obj in (r.stage.loss(r), r.stage.prepare(r)):
            if obj is not None:
                roots.add(getattr(obj, "__module__", None) or type(obj).__module__)
    return code_trees.closure(roots, source or code_trees.read_source, exempt=EXEMPT)


def train_module() -> str:
    """The loop's module: the default ``fit`` runs it."""
    return History.__module__


def code_hashes(recipe: Recipe, source: Callable[[str], str] | None = None) -> dict[str, str]:
    """``{module: hash}`` of :func:`code_modules`: what a recipe's key covers of the code."""
    return code_trees.module_hashes(code_modules(recipe, source), source)


def code_fingerprint(recipe: Recipe, source: Callable[[str], str] | None = None) -> str:
    """One hash of :func:`code_hashes`, which changes when the code of any module in the key
    does."""
    return code_trees.fingerprint(code_modules(recipe, source), source)


def identity(recipe: Recipe, platform: Platform) -> dict:
    """Everything the cache key covers, as plain data."""
    return {"format": FORMAT_VERSION, "code": code_hashes(recipe),
            "platform": dataclasses.asdict(platform), "recipe": _canonical(recipe)}


def _platform(platform: Platform | torch.dtype | None, device) -> Platform:
    if isinstance(platform, Platform):
        return platform
    return Platform.here(device, torch.float32 if platform is None else platform)


def key(recipe: Recipe, platform: Platform | torch.dtype | None = None,
        device: torch.device | str = "cpu") -> str:
    """The cache key: a hash of the recipe, :data:`FORMAT_VERSION`, the code that can change its
    bits and the platform — a :class:`Platform`, or an autocast dtype (default float32) with
    ``device`` for this process's."""
    blob = json.dumps(identity(recipe, _platform(platform, device)), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
