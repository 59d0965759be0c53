"""Measurements of trained recipes, cached beside them.

A chapter that compares many arms over many seeds measures each trained model once, and the numbers
can be worth keeping apart from the model: they can be computed where the chains train (in the
worker process that trained the chain, :func:`halluc_lab.recipes.prefetch` with ``measure=``) and
read back later without loading the model. A *measure* is a frozen dataclass whose
``__call__(trained)`` returns plain data (JSON: dicts, lists, numbers, strings, booleans), e.g.
:class:`halluc_lab.evaluation.fair_test.DeadEndsMeasure`.

**The key** of a record hashes the recipe's cache key (so the platform it trained on), the measure
as plain data (its type's name and fields) and the code of the measure's module and every lab
module it imports: a change to how a model is measured measures it again, as a change to how it is
trained trains it again.

**An entry** is ``$HALLUC_CACHE/measured/<name>/<recipe key>/<measure key>.json``: the record with
its SHA-256, written to a temporary file and renamed, so a killed run leaves no half a record. A
record whose digest does not match is reported (a :class:`~halluc_lab.recipes.cache.CacheWarning`)
and measured again. Reading a record counts its recipe as used (a notebook's footer lists it).
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from functools import lru_cache

import torch

from halluc_lab.recipes import code_trees
from halluc_lab.recipes.cache import CacheWarning, load_recipe, note_used, usable_root
from halluc_lab.recipes.cache_key import EXEMPT, Platform, _canonical, key
from halluc_lab.training.recipe import Recipe


@lru_cache(maxsize=None)
def measure_key(measure) -> str:
    """A hash of the measure as plain data and of its module's code (and every lab module that
    module imports)."""
    module = type(measure).__module__
    code = code_trees.module_hashes(code_trees.closure({module}, exempt=EXEMPT))
    blob = json.dumps({"measure": _canonical(measure), "code": code}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def path(recipe: Recipe, measure, device: torch.device | str = "cpu",
         dtype: torch.dtype = torch.float32) -> str:
    """Where the record of ``measure`` on ``recipe`` trained on ``device`` under ``dtype`` lives."""
    platform = Platform.here(device, dtype)
    return os.path.join(usable_root(), "measured", recipe.name, key(recipe, platform),
                        measure_key(measure) + ".json")


def cached(recipe: Recipe, measure, device: torch.device | str = "cpu",
           dtype: torch.dtype = torch.float32) -> bool:
    """Whether a record of ``measure`` on ``recipe`` is in the cache (not yet checked whole)."""
    return os.path.exists(path(recipe, measure, device, dtype))


def _digest(record) -> str:
    return _sha(json.dumps(record, sort_keys=True))


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _read(where: str):
    """The record at ``where``, or None (missing, or reported and dropped when damaged)."""
    if not os.path.exists(where):
        return None
    try:
        with open(where, encoding="utf-8") as f:
            entry = json.load(f)
        if entry["sha256"] == _digest(entry["record"]):
            return entry["record"]
        fault = "its digest does not match its record"
    except (OSError, ValueError, KeyError, TypeError) as e:
        fault = f"unreadable ({type(e).__name__})"
    warnings.warn(f"{where}: {fault}; measuring again", CacheWarning, stacklevel=3)
    os.remove(where)
    return None


def measured(recipe: Recipe, measure, device: torch.device | str,
             dtype: torch.dtype = torch.float32):
    """The record of ``measure`` on ``recipe``'s model (trained on ``device`` under ``dtype``):
    read from the cache, or the model loaded (trained first if need be), measured and cached."""
    if not callable(measure):
        raise TypeError(f"measure must be callable on a trained recipe, got {measure!r}")
    where = path(recipe, measure, device, dtype)
    record = _read(where)
    if record is None:
        text = json.dumps(measure(load_recipe(recipe, device, dtype)), sort_keys=True)
        record = json.loads(text)  # JSON's types (lists, not tuples), as every later read returns
        entry = {"sha256": _sha(text), "record": record, "measure": _canonical(measure)}
        os.makedirs(os.path.dirname(where), exist_ok=True)
        with open(where + ".tmp", "w", encoding="utf-8") as f:
            json.dump(entry, f, sort_keys=True)
        os.replace(where + ".tmp", where)  # the record is whole
    note_used(recipe, Platform.here(device, dtype))
    return record
