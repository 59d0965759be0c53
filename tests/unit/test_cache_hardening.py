"""The recipe cache under bad configuration and damage: names that would leave the cache, an unusable
``$HALLUC_CACHE``, weights that hold NaN behind a matching manifest, and random damage to an entry."""

import json
import os
import shutil
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from halluc_lab import recipes
from halluc_lab.recipes import cache as recipe_cache
from tests.unit import test_recipes
from tests.unit.test_recipes import CPU, same_weights, tiny

trained_entry = test_recipes.trained_entry  # a fixture: one trained tiny recipe, to copy and break


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HALLUC_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.mark.parametrize("name", ["../escape", "a/b", "..", ".hidden", "-flag", "", "a\\b", "a b", "x/../../y"])
def test_a_recipe_name_that_is_not_one_safe_path_component_is_refused(name):
    with pytest.raises(ValueError, match="name must be"):
        recipes.Recipe(name, **{f: getattr(tiny(), f) for f in ("scale", "task", "model", "train", "batch_size",
                                                                 "seq_len", "stage")})


def test_the_discard_path_never_deletes_outside_the_cache(cache, tmp_path):
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    with pytest.raises(recipe_cache.CacheError, match="outside"):
        recipe_cache._discard(str(outside), "a planted fault")
    assert (outside / "keep.txt").read_text() == "mine"


def test_a_halluc_cache_that_is_a_file_names_the_variable_and_the_path(tmp_path, monkeypatch):
    target = tmp_path / "a-file"
    target.write_text("not a folder")
    monkeypatch.setenv("HALLUC_CACHE", str(target))
    with pytest.raises(recipe_cache.CacheError, match=f"HALLUC_CACHE={target} is not a folder"):
        recipes.load_recipe(tiny(steps=8), CPU)


def test_a_missing_halluc_cache_is_created(tmp_path, monkeypatch):
    monkeypatch.setenv("HALLUC_CACHE", str(tmp_path / "new" / "cache"))
    assert recipes.load_recipe(tiny(steps=8), CPU).trained_now


def test_a_halluc_cache_under_a_file_names_the_variable(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("HALLUC_CACHE", str(tmp_path / "file" / "cache"))
    with pytest.raises(recipe_cache.CacheError, match="HALLUC_CACHE"):
        recipes.load_recipe(tiny(steps=8), CPU)


@pytest.mark.skipif(os.name != "posix", reason="symbolic links and permissions as on POSIX")
def test_an_entry_that_links_to_itself_names_the_variable_and_the_path(cache):
    path = recipes.directory(tiny(steps=8))
    os.makedirs(os.path.dirname(path))
    os.symlink(path, path)  # a loop
    with pytest.raises(recipe_cache.CacheError, match="HALLUC_CACHE"):
        recipes.load_recipe(tiny(steps=8), CPU)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root may write into a read-only folder")
def test_a_read_only_cache_with_a_damaged_entry_names_the_variable_and_the_path(cache):
    done = recipes.load_recipe(tiny(steps=8), CPU)
    (cache / os.path.relpath(done.path, cache) / "meta.json").write_text("{")
    for root, dirs, _ in os.walk(cache):
        for d in [root, *[os.path.join(root, x) for x in dirs]]:
            os.chmod(d, 0o555)
    try:
        with pytest.warns(recipes.CacheWarning), pytest.raises(recipe_cache.CacheError, match="HALLUC_CACHE"):
            recipes.load_recipe(tiny(steps=8), CPU)
    finally:
        for root, dirs, _ in os.walk(cache):
            for d in [root, *[os.path.join(root, x) for x in dirs]]:
                os.chmod(d, 0o755)


def test_a_damaged_entry_the_process_cannot_delete_names_the_variable_and_the_path(cache, monkeypatch):
    """As a read-only cache behaves for a user who is not root: deleting the damaged entry fails."""
    done = recipes.load_recipe(tiny(steps=8), CPU)
    (cache / os.path.relpath(done.path, cache) / "meta.json").write_text("{")

    def refused(path, *a, **k):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(recipe_cache.os, "remove", refused)
    monkeypatch.setattr(recipe_cache.shutil, "rmtree", refused)
    with pytest.warns(recipes.CacheWarning), \
            pytest.raises(recipe_cache.CacheError, match=f"Permission denied.*HALLUC_CACHE={cache}"):
        recipes.load_recipe(tiny(steps=8), CPU)


def _rehash(path: str) -> None:
    """Rewrite an entry's manifest to match its files: damage that a checksum alone cannot see."""
    manifest = {"sha256": {f: recipe_cache.file_sha256(os.path.join(path, f)) for f in recipe_cache._files(path)}}
    with open(os.path.join(path, recipe_cache.DONE), "w") as f:
        json.dump(manifest, f)


def _poison(path: str) -> None:
    weights = os.path.join(path, "model", "model.safetensors")
    tensors = load_file(weights)
    first = sorted(tensors)[0]
    tensors[first] = tensors[first].clone()
    tensors[first].view(-1)[0] = float("nan")
    save_file(tensors, weights, metadata={"format": "pt"})


def test_weights_that_hold_nan_behind_a_matching_manifest_are_reported_and_trained_again(cache):
    done = recipes.load_recipe(tiny(steps=8), CPU)
    _poison(done.path)
    _rehash(done.path)
    with pytest.warns(recipes.CacheWarning, match="NaN or inf"):
        again = recipes.load_recipe(tiny(steps=8), CPU)
    assert again.trained_now and same_weights(again.model, done.model)


# -- random damage, by property ----------------------------------------------------------------------------
def _damage(path: str, kind: str, where: float) -> None:
    """Flip a byte of, truncate or remove one file of the entry (its manifest included); or write NaN into the
    weights and re-hash the manifest to match, damage that checksums alone cannot see."""
    files = recipe_cache._files(path) + [recipe_cache.DONE]
    target = os.path.join(path, files[int(where * len(files)) % len(files)])
    if kind == "flip":
        data = bytearray(open(target, "rb").read())
        if data:
            data[int(where * 7919) % len(data)] ^= 0xFF
        open(target, "wb").write(bytes(data))
    elif kind == "truncate":
        with open(target, "r+b") as f:
            f.truncate(int(os.path.getsize(target) * where))
    elif kind == "remove":
        os.remove(target)
    else:
        _poison(path)
        _rehash(path)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(["flip", "truncate", "remove", "nan"]), where=st.floats(0, 1, exclude_max=True))
@pytest.mark.slow
def test_any_damage_to_an_entry_is_detected_or_the_load_gives_the_undamaged_weights(
        trained_entry, tmp_path_factory, kind, where):
    root, rel, model = trained_entry  # one trained tiny recipe, to copy and damage
    weights = model.state_dict()
    cache = tmp_path_factory.mktemp("damaged")
    shutil.copytree(root, cache, dirs_exist_ok=True)
    _damage(str(cache / rel), kind, where)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HALLUC_CACHE", str(cache))
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            loaded = recipes.load_recipe(tiny(steps=8), CPU)
    got = loaded.model.state_dict()
    assert all(torch.equal(got[k], weights[k]) for k in weights)  # retrained to the same bits, or undamaged
    reported = any(issubclass(w.category, recipes.CacheWarning) for w in seen)
    assert loaded.trained_now == reported or (loaded.trained_now and not reported and kind == "remove"
                                              and not os.path.exists(cache / rel / recipe_cache.DONE))


@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=120) | st.text(max_size=60).map(str.encode))
def test_a_damaged_step_file_is_never_read_as_a_count(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("steps") / "k.json"
    path.write_bytes(data)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        count = recipes._read_count(str(path), "0123456789abcdef")
    assert count is None and any(issubclass(w.category, recipes.CacheWarning) for w in seen)


def test_a_step_file_that_checks_out_is_read(tmp_path):
    path = tmp_path / "k.json"
    k = "0123456789abcdef"
    path.write_text(json.dumps({"key": k, "steps": 17, "check": recipes._count_check(k, 17)}))
    assert recipes._read_count(str(path), k) == 17
