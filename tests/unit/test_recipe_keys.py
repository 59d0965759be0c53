"""The cache key covers what can change a recipe's bits — its stage's code, its task's module, the platform — and
nothing else, so a change to one stage's code stales that stage's keys alone."""

import dataclasses
import json
import os
import random

import pytest
import torch

from halluc_lab import progress, recipes
from halluc_lab.recipes import cache as recipe_cache, cache_key, code_trees
from halluc_lab.recipes.cache_key import Platform
from tests.unit.test_recipes import CPU, same_weights, tiny, tiny_sft

SMOKE = {name: recipes.get(name, "smoke") for name in recipes.NAMES}
POST_TRAINING = ("halluc_lab.stages.preference", "halluc_lab.stages.rlhf", "halluc_lab.stages.rlvr", "halluc_lab.stages.rlvr_rounds")


def _edited(target: str, edit):
    real = code_trees.read_source
    return lambda m: edit(real(m)) if m == target else real(m)


@pytest.mark.parametrize("name", [n for n in recipes.NAMES if n.endswith("-pretrain")])
def test_a_pretraining_key_covers_no_post_training_code_and_no_other_task(name):
    used = recipes.code_modules(SMOKE[name])
    assert not set(POST_TRAINING) & set(used)
    own = code_trees.closure({type(SMOKE[name].task).__module__})  # its task module and what that imports
    assert {m for m in used if m.startswith("halluc_lab.tasks")} <= set(own)


@pytest.mark.parametrize("name", recipes.NAMES)
def test_every_recipe_key_covers_its_stage_module_and_the_loop(name):
    r = SMOKE[name]
    used = recipes.code_modules(r)
    for link in recipe_cache.lineage(r):
        assert type(link.stage).__module__ in used
    assert {"halluc_lab.training.train", "halluc_lab.model.transformer", "halluc_lab.training.recipe"} <= set(used)
    assert not set(cache_key.EXEMPT) & set(used)


def test_adding_a_function_to_rlvr_rounds_changes_only_the_keys_of_rlvr_chains():
    source = _edited("halluc_lab.stages.rlvr_rounds", lambda s: s + "\n\ndef added(x):\n    return x + 1\n")
    moved = {n for n, r in SMOKE.items() if recipes.code_fingerprint(r, source) != recipes.code_fingerprint(r)}
    rlvr = {n for n, r in SMOKE.items()
            if any(type(link.stage).__name__ == "RLVR" for link in recipe_cache.lineage(r))}
    assert rlvr and moved == rlvr


def test_a_change_to_the_preference_stages_leaves_pretraining_and_sft_keys_alone():
    source = _edited("halluc_lab.stages.preference", lambda s: s + "\n\nEXTRA = 1\n")
    moved = {n for n, r in SMOKE.items() if recipes.code_fingerprint(r, source) != recipes.code_fingerprint(r)}
    assert not any(n.endswith(("-pretrain", "-sft-clean", "-sft-backspace", "-sft-scheduled")) for n in moved)
    assert {"kb_walk-dpo", "kb_walk-rsft", "kb_walk-rlvr"} <= moved  # RLVR draws its prompts from preference


def test_imports_under_type_checking_are_not_followed_but_their_else_branch_is():
    source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from halluc_lab.stages.rlvr import RLVR\n"
              "else:\n    from halluc_lab.generation import engine\n")
    _, found = code_trees.parse("halluc_lab.training.losses", source)
    assert found == {"halluc_lab.generation.engine"}


def test_module_hashes_name_the_module_whose_code_moved():
    r = tiny_sft()
    before = recipes.code_hashes(r)
    assert set(before) == set(recipes.code_modules(r))
    source = _edited("halluc_lab.training.losses", lambda s: s + "\nZ = 2\n")
    assert recipe_cache.moved_modules(before) == []
    assert recipe_cache.moved_modules(before, source) == ["halluc_lab.training.losses"]
    assert recipe_cache.moved_modules({"halluc_lab.gone_module": "0" * 16}) == ["halluc_lab.gone_module"]


# -- the platform ---------------------------------------------------------------------------------------
def test_the_key_covers_the_platform_so_no_key_holds_two_models():
    r = tiny()
    one = Platform("torch.float32", processes=1, threads=1)
    variants = [dataclasses.replace(one, threads=2), dataclasses.replace(one, processes=2),
                dataclasses.replace(one, dtype="torch.bfloat16"),
                Platform("torch.bfloat16", gpu="NVIDIA H100 80GB HBM3"),
                Platform("torch.bfloat16", gpu="NVIDIA H200")]
    keys = {recipes.key(r, p) for p in [one, *variants]}
    assert len(keys) == 1 + len(variants)
    assert Platform.here("cpu").threads == torch.get_num_threads() and Platform.here("cpu").gpu is None


def test_a_cpu_run_with_other_threads_trains_under_its_own_key(cache):
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = recipes.load_recipe(tiny(steps=8), CPU)
        torch.set_num_threads(2)
        double = recipes.load_recipe(tiny(steps=8), CPU)
    finally:
        torch.set_num_threads(old)
    assert double.trained_now and single.path != double.path  # trained again, under its own key
    with open(os.path.join(double.path, "recipe.json")) as f:
        assert json.load(f)["platform"]["threads"] == 2


def test_an_entry_written_under_another_platform_is_refused_not_overwritten(cache):
    done = recipes.load_recipe(tiny(steps=8), CPU)
    with open(os.path.join(done.path, "recipe.json")) as f:
        saved = json.load(f)
    saved["platform"]["processes"] = 2  # as if two processes had trained it into this key
    with open(os.path.join(done.path, "recipe.json"), "w") as f:
        json.dump(saved, f)
    with open(os.path.join(done.path, "DONE")) as f:
        manifest = json.load(f)
    manifest["sha256"]["recipe.json"] = recipe_cache.file_sha256(os.path.join(done.path, "recipe.json"))
    with open(os.path.join(done.path, "DONE"), "w") as f:
        json.dump(manifest, f)
    with pytest.raises(ValueError, match="different recipe or platform"):
        recipes.load_recipe(tiny(steps=8), CPU)


def test_progress_changes_no_bits(cache, monkeypatch):
    """The exemption of :mod:`halluc_lab.progress` from every key: a run with live bars trains the same bits."""
    torch.manual_seed(0)
    state, py = torch.get_rng_state(), random.getstate()
    assert list(progress.progress(range(5), desc="x")) == list(range(5))
    assert torch.equal(torch.get_rng_state(), state) and random.getstate() == py
    quiet = recipes.load_recipe(tiny(steps=8), CPU)
    monkeypatch.delenv("HALLUC_BATCH", raising=False)
    loud = recipes.load_recipe(dataclasses.replace(tiny(steps=8), name="arithmetic-pretrain-loud"), CPU)
    assert loud.trained_now and same_weights(quiet.model, loud.model)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HALLUC_CACHE", str(tmp_path))
    return tmp_path


def test_chains_trains_every_named_recipe_under_every_seed_and_labels_them(monkeypatch):
    from halluc_lab.device import Runtime

    asked, loaded = [], []
    monkeypatch.setattr(recipes, "prefetch", lambda rs, device, dtype: asked.extend(rs))
    monkeypatch.setattr(recipes, "load_recipe", lambda r, device, dtype: loaded.append(r) or r)
    rt = Runtime(torch.device("cpu"), torch.float32, "smoke", 0, "asked for")
    got = recipes.chains({"SFT": "kb_walk-sft-clean", "RLVR": "kb_walk-rlvr"}, [0, 3], rt)
    assert set(got) == {("SFT", 0), ("SFT", 3), ("RLVR", 0), ("RLVR", 3)} and asked == loaded
    assert got["RLVR", 3] == recipes.with_seed(SMOKE["kb_walk-rlvr"], 3)
    assert recipes.chains(["kb_walk-sft-clean"], [1], rt) == {
        ("kb_walk-sft-clean", 1): recipes.with_seed(SMOKE["kb_walk-sft-clean"], 1)}
    for bad in ("kb_walk-sft-clean", [], {}):
        with pytest.raises(ValueError, match="names"):
            recipes.chains(bad, [0], rt)
    with pytest.raises(ValueError, match="seeds"):
        recipes.chains(["kb_walk-sft-clean"], [], rt)
