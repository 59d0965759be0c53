"""Recipes: the registry, stages, cache keys derived from the code, checksummed entries, resuming, HF compatibility."""

import collections
import dataclasses
import hashlib
import json
import os
import pickle
import re
import shutil
import warnings

import pytest
import torch

from halluc_lab import recipes
from halluc_lab.recipes import cache as recipe_cache, cache_key, code_trees
from halluc_lab.stages import pretraining
from halluc_lab.training import recipe
from halluc_lab.training import train as halluc_train
from halluc_lab.training.data import IGNORE
from halluc_lab.model.config import ModelConfig
from halluc_lab.evaluation.retrieval import fact_passages
from halluc_lab.stages.preference_data import AgreeableAnnotator
from halluc_lab.stages.sft import BackspaceConfig, RetrievedContext
from halluc_lab.tasks import ArithmeticConfig, make_task
from halluc_lab.training.train import NextTokenLoss, TrainConfig, file_sha256

CPU = torch.device("cpu")


def tiny(steps=30, **train):
    """A pre-training recipe small enough to train in a second."""
    task = ArithmeticConfig(max_digits=2, n_pretrain_documents=200, equations_per_document=3)
    model = ModelConfig(vocab_size=make_task(task).tokenizer().vocab_size, hidden_size=32, n_layers=1,
                        n_heads=2, max_positions=64)
    return recipes.Recipe("arithmetic-pretrain", "smoke", task, model,
                          TrainConfig(steps=steps, lr=1e-2, warmup_steps=3, log_every=10, **train), batch_size=8,
                          seq_len=48, stage=recipes.Pretraining())


def tiny_sft(name="sft-clean", steps=20, train=None, **stage):
    """An SFT recipe on top of :func:`tiny`."""
    pre = tiny()
    return recipes.Recipe(f"arithmetic-{name}", "smoke", pre.task, pre.model,
                          TrainConfig(steps=steps, lr=3e-3, warmup_steps=2, log_every=10, **(train or {})),
                          batch_size=8, seq_len=48, stage=recipes.SFT(n_examples=200, **stage), parent=pre, seed=1)


def same_weights(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HALLUC_CACHE", str(tmp_path))
    return tmp_path


@pytest.fixture
def fresh_registry():
    recipes.get.cache_clear()
    yield
    recipes.get.cache_clear()


# -- the registry ------------------------------------------------------------------------------------
def test_every_name_exists_at_smoke_scale_and_sft_starts_from_its_pretraining():
    for name in recipes.NAMES:
        r = recipes.get(name, "smoke")
        assert r.name == name and r.scale == "smoke"
        assert isinstance(r.stage, recipes.Pretraining) == name.endswith("-pretrain") == (r.parent is None)
        if r.parent is not None:
            # path_star's backspace SFT and its control continue from clean SFT (recipes.TASK_PLANS says why)
            # and chapter 9's preference stages start from clean SFT, their reference policy; chapter 10's RLVR
            # from clean SFT (<bksp> masked) or from backspace SFT (<bksp> allowed), and its RSFT and DPO from the
            # two backspace models and the own-errors model's control
            task, stage = name.split("-", 1)
            parent = (f"{task}-sft-clean" if name in ("path_star-sft-backspace", "path_star-sft-continued")
                      or stage in ("rlvr-clean-bksp", "rlvr-clean-masked")  # chapter 10's fair test
                      or stage in ("dpo", "rsft", "rsft-soft", "ppo", "rlhf", "rlhf-agreeable", "rlvr", "sft-own-errors",
                                   "sft-corrections", "sft-own-errors-direct")
                      else f"{task}-sft-backspace" if stage in ("rlvr-bksp", "rlvr-bksp-masked", "rsft-bksp", "dpo-bksp")
                      else f"{task}-sft-retry" if stage in ("rlvr-retry", "rlvr-retry-masked")
                      else f"{task}-sft-own-errors" if stage in ("rlvr-own", "rsft-own", "dpo-own")
                      else f"{task}-sft-own-errors-direct" if stage == "rlvr-own-direct"
                      else f"{task}-sft-corrections"
                      if stage in ("rlvr-corrections", "rsft-corrections", "dpo-corrections")
                      else f"{task}-pretrain")
            assert r.parent == recipes.get(parent, "smoke") and r.model == r.parent.model
            assert r.pretraining == recipes.get(name.split("-")[0] + "-pretrain", "smoke")  # the replay corpus
    assert recipes.get("kb_walk-sft-backspace", "smoke").stage.backspace == BackspaceConfig(rate=0.1)
    assert recipes.get("kb_walk-sft-scheduled", "smoke").stage.scheduled_sampling == 0.25


@pytest.mark.parametrize("task", recipes.TASKS)
def test_pretraining_is_exactly_one_pass_over_the_corpus_unless_its_steps_are_given(task):
    r = recipes.get(f"{task}-pretrain", "smoke")
    given = recipes.TASK_PLANS[task, "smoke"].steps.get("pretrain")
    rows = recipes.training_rows(r).input_ids.shape[0]
    assert r.train.steps == (given or rows // r.batch_size)


def test_one_pass_is_counted_once_and_kept_under_the_recipe_key(fresh_registry, monkeypatch, tmp_path):
    monkeypatch.setenv("HALLUC_CACHE", str(tmp_path))
    r = recipes.get("arithmetic-pretrain", "smoke")
    rows = recipes.training_rows(r).input_ids.shape[0]
    assert r.train.steps == rows // r.batch_size
    draft = recipes.key(dataclasses.replace(r, train=recipes.TrainConfig(steps=1, warmup_steps=0)))
    kept = tmp_path / "steps" / r.name / f"{draft}.json"
    assert json.loads(kept.read_text())["steps"] == r.train.steps

    def counted(_):
        raise AssertionError("the corpus was built again")

    recipes.get.cache_clear()
    monkeypatch.setattr(recipes, "training_rows", counted)
    assert recipes.get("arithmetic-pretrain", "smoke") == r  # read back, not counted
    whole = json.loads(kept.read_text())
    edited = {**whole, "steps": 5}  # a hand-edited count: its checksum no longer matches
    for bad in ("{not json", "-3", "true", "2.5", "5", json.dumps(edited), json.dumps({**whole, "key": "0" * 16})):
        kept.write_text(bad)
        recipes.get.cache_clear()
        with pytest.warns(recipes.CacheWarning, match=re.escape(str(kept))), \
                pytest.raises(AssertionError, match="built again"):
            recipes.get("arithmetic-pretrain", "smoke").train  # the count is read on first use


def test_a_full_scale_recipe_is_named_without_building_any_corpus(monkeypatch, cache):
    def built(*args):
        raise AssertionError("a corpus was built")

    monkeypatch.setattr(pretraining, "pretraining_rows", built)
    for task in recipes.TASKS:  # not the registry's cached recipes: each made afresh here
        root = recipes.get.__wrapped__(f"{task}-pretrain", "full")
        assert isinstance(root.stage, recipes.Pretraining) and root.parent is None
    ppo = recipes.get.__wrapped__("kb_walk-ppo", "full")
    assert isinstance(ppo.stage, recipes.PPO) and ppo.pretraining.name == "kb_walk-pretrain"


def test_one_pass_is_counted_on_the_first_read_of_train_once(monkeypatch, cache):
    real, calls = pretraining.pretraining_rows, []
    monkeypatch.setattr(pretraining, "pretraining_rows", lambda *a: calls.append(a) or real(*a))
    r = recipes.get.__wrapped__("arithmetic-pretrain", "smoke")
    travelled = pickle.loads(pickle.dumps(r))  # as prefetch sends it to a worker, not yet counted
    assert calls == []
    steps = r.train.steps
    assert len(calls) == 1 and steps == real(*calls[0]).input_ids.shape[0] // r.batch_size
    assert r.train.steps == steps and len(calls) == 1  # counted once, then kept
    assert travelled.train == r.train and len(calls) == 1  # the worker reads the kept count


def as_before(name: str, scale: str) -> recipes.Recipe:
    """The registry's recipe built straight from its tables, pre-training's one pass counted at once
    from the corpus: what ``recipes.get`` returned before it deferred the count."""
    task, stage = name.split("-", 1)
    plan, how = recipes.TASK_PLANS[task, scale], recipes.STAGE_PLANS[stage]
    shape, parent = recipes.SCALE_PLANS[scale], plan.parents.get(stage, how.parent)
    model = dataclasses.replace(shape.model,
                                vocab_size=make_task(plan.world).tokenizer().vocab_size)
    steps = plan.steps.get(stage)
    if not steps:
        assert isinstance(how.stage(plan), recipes.Pretraining)
        rows = pretraining.pretraining_rows(plan.world, shape.seq_len, how.seed)
        steps = rows.input_ids.shape[0] // shape.batch_size
    train = TrainConfig(steps=steps, lr=plan.lr.get(stage, how.lr[scale]),
                        warmup_steps=min(100, steps // how.warmup_divisor), weight_decay=0.0,
                        log_every=50, checkpoint_every=max(1, min(200, steps // 4)))
    parent = None if parent is None else as_before(f"{task}-{parent}", scale)
    return recipes.Recipe(name, scale, plan.world, model, train, shape.batch_size, shape.seq_len,
                          how.stage(plan), parent, how.seed)


def test_every_registry_recipe_is_what_it_was_before_its_steps_were_deferred():
    for name in recipes.NAMES:
        got, before = recipes.get(name, "smoke"), as_before(name, "smoke")
        assert cache_key._canonical(got) == cache_key._canonical(before), name
        assert got == before and recipes.key(got) == recipes.key(before), name


def test_the_isolate_the_key_arm_differs_from_rlvr_bksp_only_in_masking_the_token_during_rl():
    for task in ("kb_walk", "arithmetic"):
        allowed, masked = (recipes.get(f"{task}-{s}", "smoke") for s in ("rlvr-bksp", "rlvr-bksp-masked"))
        assert masked.parent == allowed.parent and masked.parent.name == f"{task}-sft-backspace"
        assert allowed.stage.config.allow_bksp and not masked.stage.config.allow_bksp
        same = dataclasses.replace(masked, name=allowed.name, stage=dataclasses.replace(
            masked.stage, config=dataclasses.replace(masked.stage.config, allow_bksp=True)))
        assert same == allowed


@pytest.mark.parametrize("bad", ["kb_walk-finetune", "chess-pretrain", "kb_walk"])
def test_unknown_names_and_scales_raise(bad):
    with pytest.raises(ValueError, match="unknown recipe"):
        recipes.get(bad, "smoke")
    with pytest.raises(ValueError, match="scale"):
        recipes.get("kb_walk-pretrain", "huge")


def hyper_parameters(r: recipes.Recipe) -> dict:
    """A recipe's hyper-parameters in the flat form they had before stages were dataclasses (the key, the
    code fingerprint and the checkpoint interval left out)."""
    later = {"retrieved": None, "retry": 0.0}  # fields added after the digest was pinned, left out at their defaults
    later_task = {"scratchpad": False}
    stage = {"n_examples": 0, "completion_only": True, "replay_fraction": 0.0, "backspace": None,
             "scheduled_sampling": 0.0,
             **{k: v for k, v in dataclasses.asdict(r.stage).items() if not (k in later and v == later[k])}}
    train = {k: v for k, v in dataclasses.asdict(r.train).items() if k not in ("checkpoint_every", "keep_checkpoints")}
    return {"name": r.name, "scale": r.scale, "task_type": type(r.task).__name__,
            "task": {k: v for k, v in dataclasses.asdict(r.task).items() if not (k in later_task and v == later_task[k])},
            "model": dataclasses.asdict(r.model), "train": train, "batch_size": r.batch_size, "seq_len": r.seq_len,
            "parent": None if r.parent is None else r.parent.name, **stage, "seed": r.seed}


# Computed before the registry became tables: every hyper-parameter of every recipe is what it was.
# Optimizer steps are pinned in the open, for a readable failure; pre-training is one pass over the corpus.
PINNED_STEPS = {
    "smoke": {"kb_walk": (168, 250, 250, 250), "arithmetic": (124, 300, 300, 300), "path_star": (187, 300, 300, 300)},
    "full": {"kb_walk": (495, 400, 400, 400), "arithmetic": (375, 400, 400, 400), "path_star": (500, 2000, 500, 2000)},
}
# Re-pinned when kb_walk's world gained its evaluation-only split (KBWalkConfig.evaluation_fraction).
PINNED_DIGEST = {"smoke": "c179859e9a570919", "full": "15f34f992dfe2cf8"}
PINNED_TASKS = ("kb_walk", "arithmetic", "path_star")  # the tasks of that time; chapter 12's are pinned below
# Packing a full-scale corpus takes about twenty seconds: its rows of 128 tokens, counted before the
# change, stand in for it (one pass is still rows // batch_size).
FULL_CORPUS_ROWS = {"kb_walk-pretrain": 63_395, "arithmetic-pretrain": 48_084, "path_star-pretrain": 64_000,
                    "in_context-pretrain": 64_462, "arithmetic_cot-pretrain": 90_751, "sycophancy-pretrain": 62_148}


@pytest.mark.parametrize("scale", recipes.SCALES)
def test_the_registry_keeps_every_hyper_parameter_at_both_scales(scale, fresh_registry, monkeypatch):
    if scale == "full":
        monkeypatch.setattr(recipes, "_one_pass", lambda r: FULL_CORPUS_ROWS[r.name] // r.batch_size)
    # The recipes that existed when the digest was pinned; later additions are pinned by their own tests.
    pinned = [f"{t}-{s}" for t in PINNED_TASKS for s in ("pretrain", "sft-clean", "sft-backspace", "sft-scheduled")]
    got = {name: recipes.get(name, scale) for name in pinned}
    assert {t: tuple(got[f"{t}-{s}"].train.steps for s in ("pretrain", "sft-clean", "sft-backspace", "sft-scheduled"))
            for t in PINNED_TASKS} == PINNED_STEPS[scale]
    blob = json.dumps({name: hyper_parameters(r) for name, r in got.items()}, sort_keys=True)
    assert hashlib.sha256(blob.encode()).hexdigest()[:16] == PINNED_DIGEST[scale]
    for r in (recipes.get(name, scale) for name in recipes.NAMES):  # a killed run loses at most a quarter, and ≤ 200
        assert 1 <= r.train.checkpoint_every <= min(200, r.train.steps // 4)


@pytest.mark.parametrize("scale", recipes.SCALES)
def test_the_matched_compute_control_continues_clean_sft_as_long_as_backspace_sft_does(scale):
    control, backspace = recipes.get("path_star-sft-continued", scale), recipes.get("path_star-sft-backspace", scale)
    assert control.parent == backspace.parent == recipes.get("path_star-sft-clean", scale)
    assert control.train == backspace.train and control.stage == backspace.parent.stage
    assert "kb_walk-sft-continued" not in recipes.NAMES  # its backspace SFT trains no extra steps


def rows_digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().numpy().tobytes() + str(tuple(t.shape)).encode()).hexdigest()[:16]


# Computed before stages were dataclasses: the stages assemble exactly the rows the recipes trained on.
@pytest.mark.parametrize("name, ids, labels", [
    ("arithmetic-pretrain", "e4e8831b0a7c6ffd", "654a38580fddc61c"),
    ("arithmetic-sft-clean", "377959e62323a3a3", "fa43ce94450c5b58"),
    ("arithmetic-sft-backspace", "e8170accbdad0a78", "541e96d009760119"),
    # with pre-training replay, re-pinned when the replay left out the evaluation-only facts
    ("kb_walk-sft-clean", "67c4eb5a88587a5d", "ce1d0eef025d2770"),
])
def test_stages_build_the_same_rows_as_before(name, ids, labels):
    rows = recipes.training_rows(recipes.get(name, "smoke"))
    assert (rows_digest(rows.input_ids), rows_digest(rows.labels)) == (ids, labels)


def test_sft_rows_mask_the_prompt_and_backspace_rows_hold_backspaces():
    clean = recipes.training_rows(tiny_sft())
    tok = make_task(tiny().task).tokenizer()
    eq = tok.token_id("=")
    for ids, labels in zip(clean.input_ids.tolist(), clean.labels.tolist()):
        for t, tid in enumerate(ids):
            if tid in (tok.bos_id, tok.token_id("+")):
                assert labels[t] == IGNORE
            if tid == eq:
                assert labels[t] == IGNORE and labels[t + 1] != IGNORE
    bk = recipes.training_rows(tiny_sft("sft-backspace", backspace=BackspaceConfig(rate=0.5)))
    assert (bk.input_ids == tok.bksp_id).sum() > 50
    assert (bk.labels == tok.bksp_id).sum() == (bk.input_ids == tok.bksp_id).sum()


def test_only_scheduled_sampling_prepares_batches():
    assert tiny_sft().stage.prepare(tiny_sft()) is None and recipes.Pretraining().prepare(tiny()) is None
    r = tiny_sft("sft-scheduled", scheduled_sampling=0.25)
    assert r.stage.prepare(r) == recipes.ScheduledSampling(0.25, r.train.steps, r.seed)


def test_a_recipe_rejects_a_bad_stage_a_bad_size_and_a_parent_of_another_shape():
    with pytest.raises(TypeError, match="stage"):
        dataclasses.replace(tiny(), stage="pretrain")
    with pytest.raises(ValueError, match="batch_size"):
        dataclasses.replace(tiny(), batch_size=0)
    with pytest.raises(ValueError, match="parent"):
        dataclasses.replace(tiny_sft(), model=dataclasses.replace(tiny().model, hidden_size=64))
    for bad in ({"n_examples": 0}, {"replay_fraction": -1.0}, {"scheduled_sampling": 1.5}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            recipes.SFT(**{"n_examples": 10, **bad})


def test_with_seed_moves_the_whole_chain_and_every_seed_has_its_own_key():
    r = recipes.get("path_star-sft-backspace", "smoke")  # backspace <- clean SFT <- pre-training
    assert recipes.with_seed(r, 0) == r
    s = recipes.with_seed(r, 3)
    assert (s.seed, s.parent.seed, s.pretraining.seed) == (4, 4, 3)
    assert s.name == r.name and dataclasses.replace(s, seed=r.seed, parent=r.parent) == r
    keys = {recipes.key(x) for x in (r, s, dataclasses.replace(r, seed=7))}
    assert len(keys) == 3
    assert recipes.directory(s) != recipes.directory(r)


# -- the key -------------------------------------------------------------------------------------------
def test_key_changes_with_the_config_the_parent_the_version_and_the_dtype(monkeypatch):
    r = tiny_sft()
    k = recipes.key(r)
    assert recipes.key(tiny_sft()) == k
    assert recipes.key(dataclasses.replace(r, stage=dataclasses.replace(r.stage, n_examples=201))) != k
    assert recipes.key(dataclasses.replace(r, parent=dataclasses.replace(r.parent, seed=5))) != k
    assert recipes.key(dataclasses.replace(r, task=dataclasses.replace(r.task, reverse_output=True))) != k
    assert recipes.key(r, torch.bfloat16) != k
    monkeypatch.setattr(cache_key, "FORMAT_VERSION", cache_key.FORMAT_VERSION + 1)
    assert recipes.key(r) != k


def test_configs_of_different_types_with_equal_fields_have_different_keys():
    from halluc_lab.training.rlvr_losses import GRPO, DrGRPO

    r = recipes.get("kb_walk-rlvr", "smoke")
    grpo = dataclasses.replace(r, stage=dataclasses.replace(r.stage, policy_loss=GRPO(clip=0.2)))
    dr = dataclasses.replace(r, stage=dataclasses.replace(r.stage, policy_loss=DrGRPO(clip=0.2)))
    assert dataclasses.asdict(grpo) == dataclasses.asdict(dr)  # asdict alone cannot tell the two losses apart
    assert recipes.key(grpo) != recipes.key(dr)
    assert recipes.key(grpo) == recipes.key(r)  # GRPO(clip=0.2) is the stage's default


def test_code_modules_are_what_the_recipe_imports_and_nothing_else():
    used = recipes.code_modules(recipes.get("kb_walk-sft-clean", "smoke"))
    for m in ("training.losses", "training.data", "model.transformer", "model.attention", "model.positional",
              "model.tokenizer", "stages.sft", "stages.pretraining", "training.train", "training.recipe",
              "tasks.kb_walk", "tasks.base"):
        assert f"halluc_lab.{m}" in used
    # A stage lives beside its training, and a recipe imports its own task's module: SFT's key covers no
    # post-training code and no other task. The registry's tables enter the key as the recipe's config.
    for m in ("stages.preference", "stages.rlhf", "stages.rlvr", "stages.rlvr_rounds", "generation.engine",
              "evaluation.evaluate", "tasks.arithmetic", "tasks", "book.interactive", "book.claims",
              "book.notebook", "foundations.ngram", "foundations.rnn", "evaluation.stats", "recipes",
              "recipes.cache", "recipes.code_trees", "progress", "model.hf_convert"):
        assert f"halluc_lab.{m}" not in used
    # "from halluc_lab.pkg import x" uses x, not the package's __init__ (nor the library's)
    packages = {"halluc_lab"} | {f"halluc_lab.{p}" for p in ("training", "model", "stages", "tasks")}
    assert not packages & set(used)


def test_imports_inside_functions_count_and_from_package_import_module_names_the_module():
    source = ("from halluc_lab.generation import engine\nimport torch\n"
              "def f():\n    import halluc_lab.book.claims\n    from halluc_lab.tasks import make_task\n")
    _, found = code_trees.parse("halluc_lab.training.losses", source)
    assert found == {"halluc_lab.generation.engine", "halluc_lab.book.claims", "halluc_lab.tasks"}


def test_the_code_fingerprint_follows_code_the_recipe_uses_not_prose_or_other_modules(monkeypatch):
    r = tiny_sft()
    real = code_trees.read_source

    def edited(target, edit):
        return lambda m: edit(real(m)) if m == target else real(m)

    base = recipes.code_fingerprint(r)
    code = edited("halluc_lab.training.losses", lambda s: s + "\nREDUCTIONS = REDUCTIONS[:2]\n")
    assert recipes.code_fingerprint(r, code) != base
    prose = edited("halluc_lab.training.losses", lambda s: s.replace('"""Losses as', '"""Reworded: losses as', 1)
                   .replace("# the ignore_index", "# reworded: the ignore_index", 1))
    assert prose("halluc_lab.training.losses") != real("halluc_lab.training.losses")
    assert recipes.code_fingerprint(r, prose) == base
    assert recipes.code_fingerprint(r, edited("halluc_lab.book.interactive", lambda s: s + "\nX = 1\n")) == base
    k = recipes.key(r)
    monkeypatch.setattr(code_trees, "read_source", code)
    assert recipes.key(r) != k


def test_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("HALLUC_CACHE", str(tmp_path / "c"))
    assert recipes.cache_root() == str(tmp_path / "c")
    monkeypatch.delenv("HALLUC_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert recipes.cache_root() == str(tmp_path / "x" / "halluc_lab")


# -- train once, load after ---------------------------------------------------------------------------
def test_a_recipe_trains_on_first_use_and_loads_afterwards(cache):
    first = recipes.load_recipe(tiny_sft(), CPU)
    assert first.trained_now and os.path.exists(recipes.directory(tiny()))  # the parent was trained and cached too
    assert not os.path.exists(os.path.join(first.path, "checkpoints"))
    with open(os.path.join(first.path, "DONE")) as f:  # the manifest: a checksum for every file
        assert sorted(json.load(f)["sha256"]) == recipe_cache._files(first.path)
    again = recipes.load_recipe(tiny_sft(), CPU)
    assert not again.trained_now and again.history.loss == first.history.loss
    assert same_weights(again.model, first.model)
    assert first.history.loss[-1] < first.history.loss[0]
    assert {(tiny().name, recipes.key(tiny())), (tiny_sft().name, recipes.key(tiny_sft()))} <= set(recipes.used())


def test_the_used_list_names_a_cached_recipes_parents_as_training_it_does(cache, monkeypatch):
    monkeypatch.setattr(recipe_cache, "_USED", {})  # a fresh process
    recipes.load_recipe(tiny_sft(), CPU)  # trains the parent, then the recipe
    trained = list(recipes.used())
    monkeypatch.setattr(recipe_cache, "_USED", {})  # a new process, everything cached
    loaded = recipes.load_recipe(tiny_sft(), CPU)
    assert not loaded.trained_now
    assert recipes.used() == trained == [(tiny().name, recipes.key(tiny())), (tiny_sft().name, recipes.key(tiny_sft()))]


def test_load_is_quiet_by_default_and_verbose_says_one_line_per_recipe_without_paths(cache, capsys):
    recipes.load_recipe(tiny_sft(), CPU)
    assert capsys.readouterr() == ("", "")
    recipes.load_recipe(tiny_sft(steps=21), CPU, verbose=True)  # loads the parent, trains the SFT recipe
    again = recipes.load_recipe(tiny_sft(steps=21), CPU, verbose=True)
    out = capsys.readouterr().out.splitlines()
    assert [line.split(": ")[0] for line in out] == ["arithmetic-pretrain (smoke)", "arithmetic-sft-clean (smoke)",
                                                      "arithmetic-sft-clean (smoke)"]
    assert "loaded" in out[0] and "trained" in out[1] and "loaded" in out[2]
    assert again.path.startswith(str(cache)) and not any(str(cache) in line for line in out)


def test_an_intact_entry_of_another_recipe_under_the_key_raises(cache):
    done = recipes.load_recipe(tiny(steps=8), CPU)
    with open(os.path.join(done.path, "recipe.json")) as f:
        saved = json.load(f)
    saved["recipe"]["batch_size"] = 999
    with open(os.path.join(done.path, "recipe.json"), "w") as f:
        json.dump(saved, f)
    with open(os.path.join(done.path, "DONE")) as f:
        manifest = json.load(f)
    manifest["sha256"]["recipe.json"] = file_sha256(os.path.join(done.path, "recipe.json"))
    with open(os.path.join(done.path, "DONE"), "w") as f:  # intact: a real entry of that other recipe
        json.dump(manifest, f)
    with pytest.raises(ValueError, match="different recipe"):
        recipes.load_recipe(tiny(steps=8), CPU)


def test_a_stage_defined_outside_the_library_trains_through_the_same_loop_and_cache(cache):
    @dataclasses.dataclass(frozen=True)
    class SmoothedPretraining(recipes.Pretraining):
        label_smoothing: float = 0.1  # ε of 004 §3.7

        def loss(self, recipe):
            return NextTokenLoss(self.label_smoothing)

    r = dataclasses.replace(tiny(steps=8), stage=SmoothedPretraining())
    assert recipes.key(r) != recipes.key(tiny(steps=8))
    assert recipes.load_recipe(r, CPU).trained_now


# -- corrupt entries are reported and trained again ----------------------------------------------------
def _truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


CORRUPTIONS = {
    "truncated weight file": lambda p: _truncate(p / "model" / "model.safetensors"),
    "garbled history.json": lambda p: (p / "history.json").write_text("{not json"),
    "garbled recipe.json": lambda p: (p / "recipe.json").write_text('{"format": '),
    "empty DONE": lambda p: (p / "DONE").write_text(""),
    "missing meta.json": lambda p: (p / "meta.json").unlink(),
    "missing DONE, half-written model": lambda p: ((p / "DONE").unlink(), _truncate(p / "model" / "model.safetensors")),
    "stale extra weight file": lambda p: (p / "model" / "model-00001-of-00002.safetensors").write_bytes(b"stale"),
}


@pytest.fixture(scope="module")
def trained_entry(tmp_path_factory):
    """A cache holding one trained tiny recipe, to copy and break."""
    root = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HALLUC_CACHE", str(root))
        trained = recipes.load_recipe(tiny(steps=8), CPU)
    return root, os.path.relpath(trained.path, root), trained.model


@pytest.mark.parametrize("fault", CORRUPTIONS)
def test_a_corrupt_cache_entry_is_reported_with_its_path_and_trained_again(fault, trained_entry, cache):
    root, rel, model = trained_entry
    shutil.copytree(root, cache, dirs_exist_ok=True)
    path = cache / rel
    CORRUPTIONS[fault](path)
    with pytest.warns(recipes.CacheWarning, match=re.escape(str(path))):
        again = recipes.load_recipe(tiny(steps=8), CPU)
    assert again.trained_now and same_weights(again.model, model)
    with warnings.catch_warnings():
        warnings.simplefilter("error", recipes.CacheWarning)
        assert not recipes.load_recipe(tiny(steps=8), CPU).trained_now  # now intact


# -- a killed run resumes -------------------------------------------------------------------------------
class Killed(Exception):
    pass


def _train_spy(monkeypatch, name, kill_at=None):
    """Patch the loop the cache calls: record the first batch ``name`` asks for; raise at batch ``kill_at``."""
    real, first = halluc_train.train, []

    def spy(model, data, cfg, **kw):
        def watched(i):
            if kw["desc"] == name:
                first[:] = first or [i]
                if i == kill_at:
                    raise Killed(f"killed at step {i + 1}")
            return data(i)
        return real(model, watched, cfg, **kw)

    monkeypatch.setattr(recipe, "train", spy)  # the default Stage.fit's loop
    return first


@pytest.mark.parametrize("make", [
    lambda: tiny(steps=20, checkpoint_every=5),
    lambda: tiny_sft("sft-scheduled", train={"checkpoint_every": 5}, scheduled_sampling=0.5),  # prepare seeded by step
], ids=["pretraining", "scheduled-sampling-sft"])
def test_a_killed_run_resumes_from_its_last_checkpoint_and_ends_bit_identical(make, cache, monkeypatch):
    r = make()
    whole = recipes.load_recipe(dataclasses.replace(r, name=r.name + "-uninterrupted"), CPU)
    _train_spy(monkeypatch, r.name, kill_at=12)  # dies in step 13: checkpoints at steps 5 and 10
    with pytest.raises(Killed):
        recipes.load_recipe(r, CPU)
    assert sorted(os.listdir(recipes.directory(r))) == ["checkpoints"]
    first = _train_spy(monkeypatch, r.name)
    with warnings.catch_warnings():
        warnings.simplefilter("error", recipes.CacheWarning)  # an interrupted run is no fault
        resumed = recipes.load_recipe(r, CPU)
    assert first == [10] and resumed.trained_now  # step 11 was the first it ran
    assert same_weights(resumed.model, whole.model) and resumed.history.loss == whole.history.loss


def test_a_corrupt_checkpoint_is_reported_and_training_starts_over(cache, monkeypatch):
    r = tiny(steps=20, checkpoint_every=5)
    whole = recipes.load_recipe(dataclasses.replace(r, name="arithmetic-uninterrupted"), CPU)
    _train_spy(monkeypatch, r.name, kill_at=12)
    with pytest.raises(Killed):
        recipes.load_recipe(r, CPU)
    _truncate(os.path.join(recipes.directory(r), "checkpoints", "step-000010", "model.safetensors"))
    first = _train_spy(monkeypatch, r.name)
    with pytest.warns(recipes.CacheWarning, match="step-000010.*training from step 0"):
        again = recipes.load_recipe(r, CPU)
    assert first == [0] and same_weights(again.model, whole.model)


# -- Hugging Face --------------------------------------------------------------------------------------
def test_checkpoint_loads_with_auto_classes_and_hf_generate_matches_the_engine(cache):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from halluc_lab.generation.engine import GREEDY, generate

    trained = recipes.load_recipe(tiny(), CPU)
    hf = AutoModelForCausalLM.from_pretrained(os.path.join(trained.path, "model")).eval()
    hf_tok = AutoTokenizer.from_pretrained(os.path.join(trained.path, "model"))
    prompts = [e.prompt for e in trained.task.examples("heldout", 6, seed=0)]
    ids = [[1] + trained.tokenizer.encode(p) for p in prompts]
    ours = generate(trained.model, ids, 8, sampling=GREEDY).token_lists()
    for p, mine in zip(prompts, ours):
        ids = hf_tok(p, return_tensors="pt").input_ids
        assert ids[0].tolist() == [1] + trained.tokenizer.encode(p)
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                          eos_token_id=None, pad_token_id=0)
        assert out[0, ids.shape[1]:].tolist() == mine


@pytest.mark.gpu
def test_a_recipe_trains_on_cuda_under_bf16_autocast_and_generates_like_hugging_face(cache):
    from transformers import AutoModelForCausalLM

    from halluc_lab.generation.engine import GREEDY, generate

    cuda = torch.device("cuda")
    trained = recipes.load_recipe(tiny_sft("sft-backspace", backspace=BackspaceConfig(rate=0.2)), cuda, torch.bfloat16)
    assert next(trained.model.parameters()).is_cuda
    assert trained.history.loss[-1] < trained.history.loss[0]
    assert recipes.directory(trained.recipe, torch.bfloat16) != recipes.directory(trained.recipe)
    hf = AutoModelForCausalLM.from_pretrained(os.path.join(trained.path, "model")).to(cuda).eval()
    prompts = [[1] + trained.tokenizer.encode(e.prompt) for e in trained.task.examples("heldout", 8, seed=0)]
    ours = generate(trained.model, prompts, 6, sampling=GREEDY).token_lists()
    for p, mine in zip(prompts, ours):
        ids = torch.tensor([p], device=cuda)
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False,
                          eos_token_id=None, pad_token_id=0)
        assert out[0, len(p):].tolist() == mine


def test_strip_docstrings_keeps_code_and_drops_prose():
    import ast

    src = 'def f(x):\n    """Docstring."""\n    # a comment\n    return x + 1\n'
    prose = 'def f(x):\n    """Other words."""\n\n    return x + 1  # another comment\n'
    code = 'def f(x):\n    """Docstring."""\n    return x + 2\n'
    dump = lambda s: ast.dump(code_trees.strip_docstrings(ast.parse(s)))
    assert dump(src) == dump(prose) != dump(code)


def test_the_tree_text_leaves_out_what_python_versions_add_or_drop():
    """The fingerprint's text of a tree has no empty or None fields (3.12's ``type_params=[]``, 3.13's dropped
    empty lists) and no empty strings inside f-strings (3.12's), so 3.11, 3.12 and 3.13 give one key."""
    import ast

    assert code_trees.tree_text(ast.parse("def f(): pass")) == (
        "Module(body=[FunctionDef(name='f', args=arguments(), body=[Pass()])])")
    padded = ast.parse('f"{x:{s}}"')
    fstring = padded.body[0].value
    fstring.values[0].format_spec.values.append(ast.Constant(""))  # as 3.12.1 parses it
    assert code_trees.tree_text(padded) == code_trees.tree_text(ast.parse('f"{x:{s}}"'))
    assert code_trees.tree_text(padded) != code_trees.tree_text(ast.parse('f"{x:{t}}"'))


# -- several chains at once ----------------------------------------------------------------------------
@pytest.mark.slow
def test_prefetch_trains_chains_in_parallel_processes_as_load_would(cache):
    sft = tiny_sft()
    chains = [recipes.with_seed(sft, s) for s in (0, 1)]
    recipes.prefetch(chains, "cpu", processes=2)
    trained = [recipes.load_recipe(r, "cpu") for r in chains]
    assert not any(t.trained_now for t in trained)  # both came from the cache the workers filled
    assert not same_weights(trained[0].model, trained[1].model)  # two seeds, two models
    alone = recipes.load_recipe(chains[1], "cpu")
    assert same_weights(alone.model, trained[1].model)


def test_prefetch_rejects_a_bad_process_count(cache):
    with pytest.raises(ValueError, match="processes"):
        recipes.prefetch([tiny_sft()], "cpu", processes=0)


@pytest.mark.parametrize("scale", recipes.SCALES)
def test_the_preference_stages_draw_the_same_samples_of_their_clean_sft_model(scale):
    for task in ("kb_walk", "arithmetic"):
        dpo, best, soft = (recipes.get(f"{task}-{s}", scale) for s in ("dpo", "rsft", "rsft-soft"))
        assert isinstance(dpo.stage, recipes.DPO) and isinstance(best.stage, recipes.RSFT)
        assert (dpo.stage.beta, dpo.stage.flip_rate, best.stage.beta, soft.stage.beta) == (0.1, 0.1, None, 1.0)
        # one seed, one prompt count, N = 8: every method learns from the same answers of the same model
        assert dpo.seed == best.seed == soft.seed and dpo.parent == best.parent == recipes.get(f"{task}-sft-clean", scale)
        assert dpo.stage.n_prompts == best.stage.n_prompts == soft.stage.n_prompts
        assert dpo.stage.samples == best.stage.samples == soft.stage.samples == 8
        assert dpo.train.lr < best.train.lr < dpo.parent.train.lr  # preference tuning runs below the SFT rate
    assert "path_star-dpo" not in recipes.NAMES  # no preference stage where the plan gives none


@pytest.mark.parametrize("scale", recipes.SCALES)
def test_chapter_10s_rsft_and_dpo_are_chapter_9s_from_the_backspace_models_and_the_control(scale):
    for task in ("kb_walk", "arithmetic"):
        for method in ("rsft", "dpo"):
            base = recipes.get(f"{task}-{method}", scale)
            for suffix, parent in (("bksp", "sft-backspace"), ("own", "sft-own-errors"),
                                   ("corrections", "sft-corrections")):
                r = recipes.get(f"{task}-{method}-{suffix}", scale)
                assert r.parent == recipes.get(f"{task}-{parent}", scale)  # matched: only the start differs
                assert (r.stage, r.train, r.seed, r.batch_size, r.seq_len) == (base.stage, base.train, base.seed,
                                                                                base.batch_size, base.seq_len)
    assert not any(n.startswith(("sycophancy-rsft", "path_star-dpo")) for n in recipes.NAMES)


# -- chapter 11: SFT on retrieved context ----------------------------------------------------------------
@pytest.mark.parametrize("scale", ["smoke", pytest.param("full", marks=pytest.mark.slow)])
def test_rag_sft_is_kb_walks_clean_sft_with_retrieved_context_at_matched_compute(scale):
    rag, clean = recipes.get("kb_walk-sft-rag", scale), recipes.get("kb_walk-sft-clean", scale)
    assert rag.stage == dataclasses.replace(clean.stage, retrieved=RetrievedContext()) and clean.stage.retrieved is None
    assert (rag.train, rag.parent, rag.seed, rag.model, rag.task) == (clean.train, clean.parent, clean.seed,
                                                                      clean.model, clean.task)
    assert rag.train.steps == {"smoke": 250, "full": 400}[scale] and rag.parent.name == "kb_walk-pretrain"
    assert recipes.key(rag) != recipes.key(clean)
    reader = recipes.get("kb_walk-sft-rag-reader", scale)  # the same with counterfactual final passages
    assert reader.stage == dataclasses.replace(rag.stage, retrieved=RetrievedContext(counterfactual=0.5))
    assert (reader.train, reader.parent, reader.seed) == (rag.train, rag.parent, rag.seed)
    assert len({recipes.key(reader), recipes.key(rag), recipes.key(clean)}) == 3
    for task in ("arithmetic", "path_star"):  # their facts are not passages: no such recipe
        for stage in ("sft-rag", "sft-rag-reader"):
            assert f"{task}-{stage}" not in recipes.NAMES
            with pytest.raises(ValueError, match="unknown recipe"):
                recipes.get(f"{task}-{stage}", scale)


def _sequences(rows, tok) -> list[tuple[list[str], list[int]]]:
    """Each packed sequence of ``rows`` as (its tokens, its labels), padding left out."""
    out = []
    for ids, labels, seg in zip(rows.input_ids.tolist(), rows.labels.tolist(), rows.segment_ids.tolist()):
        for s in sorted(set(seg) - {0}):
            at = [t for t, x in enumerate(seg) if x == s]
            out.append((tok.decode([ids[t] for t in at]).split(), [labels[t] for t in at]))
    return out


def _examples(rows, tok) -> list[tuple[str, str, str]]:
    """(passages, question, completion) of each SFT example in ``rows`` (replayed documents have no ``=``)."""
    out = []
    for tokens, _ in _sequences(rows, tok):
        if "=" in tokens:
            eq = tokens.index("=")
            last = max((t for t in range(eq) if tokens[t] == "."), default=0)  # the last passage's end
            passages = tokens[1:last + 1] if last else []
            out.append((" ".join(passages), " ".join(tokens[len(passages) + 1:eq + 1]), " ".join(tokens[eq + 1:-1])))
    return out


def test_rag_sft_rows_carry_passages_in_about_half_the_examples_and_never_a_rare_fact():
    rag, clean = recipes.get("kb_walk-sft-rag", "smoke"), recipes.get("kb_walk-sft-clean", "smoke")
    task = make_task(rag.task)
    tok = task.tokenizer()
    got = _examples(recipes.training_rows(rag), tok)
    assert len(got) == rag.stage.n_examples
    with_context = [p for p, _, _ in got if p]
    assert 0.45 < len(with_context) / len(got) < 0.55  # share = 0.5 of 3,000
    # The same examples as clean SFT (matched compute), some with passages before them.
    assert (collections.Counter((q, c) for _, q, c in got)
            == collections.Counter((q, c) for _, q, c in _examples(recipes.training_rows(clean), tok)))
    # After SFT a rare fact is still known only from pre-training: no example shows one. (Replayed pre-training
    # documents may repeat one, as in clean SFT; they are not examples.)
    allowed = {p for p, (e, r) in zip(fact_passages(task), task.facts) if task.usable_in_training(e, r)}
    shown = {p.strip() + " ." for text in with_context for p in text.split(" .") if p.strip()}
    assert shown <= allowed and len(shown) > 0.9 * len(allowed)
    sizes = collections.Counter(len(text.split(" .")) - 1 for text in with_context)
    assert set(sizes) == set(range(1, rag.stage.retrieved.passages + 1))  # 1 … k passages, each number used


def test_clean_sft_rows_are_unchanged_by_the_retrieved_field():
    # The pinned digests of test_stages_build_the_same_rows_as_before were computed before the field existed.
    clean = recipes.get("kb_walk-sft-clean", "smoke")
    explicit = dataclasses.replace(clean, stage=recipes.SFT(n_examples=clean.stage.n_examples,
                                                            replay_fraction=clean.stage.replay_fraction, retrieved=None))
    a, b = recipes.training_rows(clean), recipes.training_rows(explicit)
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.labels, b.labels)
    assert (rows_digest(a.input_ids), rows_digest(a.labels)) == ("67c4eb5a88587a5d", "ce1d0eef025d2770")


def test_retrieved_context_combines_with_backspace_passages_never_targets_and_needs_kb_walk():
    rag = recipes.get("kb_walk-sft-rag", "smoke")
    both = dataclasses.replace(rag, stage=dataclasses.replace(rag.stage, n_examples=300,
                                                              backspace=BackspaceConfig(rate=0.3)))
    tok = make_task(rag.task).tokenizer()
    seqs = [(t, lab) for t, lab in _sequences(recipes.training_rows(both), tok) if "=" in t]
    assert sum("<bksp>" in t for t, _ in seqs) > 100 and sum("." in t for t, _ in seqs) > 100
    for tokens, labels in seqs:  # the passages and the question are prompt: no loss on them
        assert all(lab == IGNORE for lab in labels[:tokens.index("=") + 1])
    with pytest.raises(TypeError, match="retrieved"):
        recipes.SFT(n_examples=10, retrieved=0.5)
    with pytest.raises(TypeError, match="kb_walk"):  # arithmetic has no facts to show
        recipes.training_rows(tiny_sft(retrieved=RetrievedContext()))


@pytest.mark.parametrize("scale", recipes.SCALES)
def test_chapter_12s_recipes_share_arithmetics_model_sums_and_steps(scale, fresh_registry, monkeypatch):
    if scale == "full":  # full-scale corpora take minutes to pack: their counted rows stand in
        monkeypatch.setattr(recipes, "_one_pass", lambda r: FULL_CORPUS_ROWS[r.name] // r.batch_size)
    direct, cot = recipes.get("arithmetic-sft-clean", scale), recipes.get("arithmetic_cot-sft-clean", scale)
    syc = recipes.get("sycophancy-sft-clean", scale)
    # chain of thought: the same sums, examples and rate, written out with a scratchpad; at full scale the same
    # steps and pre-training documents as the direct arm, at smoke scale (which only proves the code) fewer
    smaller = {"smoke": dict(steps=150, documents=2000), "full": dict(steps=direct.train.steps,
                                                                      documents=direct.task.n_pretrain_documents)}[scale]
    assert cot.task == dataclasses.replace(direct.task, scratchpad=True, equations_per_document=2,
                                           n_pretrain_documents=smaller["documents"])
    assert (cot.stage, cot.seed) == (direct.stage, direct.seed)
    assert cot.train == syc.train == dataclasses.replace(direct.train, steps=smaller["steps"],
                                                         warmup_steps=smaller["steps"] // 20,
                                                         checkpoint_every=min(200, smaller["steps"] // 4))
    assert dataclasses.replace(cot.model, vocab_size=1) == dataclasses.replace(direct.model, vocab_size=1)
    # sycophancy: arithmetic's world with statements; its RLHF arms differ only in the annotators
    assert syc.task.base == direct.task and (syc.task.p_stated, syc.task.p_wrong) == (0.5, 0.5)
    plain, agreeable = recipes.get("sycophancy-rlhf", scale), recipes.get("sycophancy-rlhf-agreeable", scale)
    assert plain.parent == agreeable.parent == syc and plain.train == agreeable.train
    assert plain.stage.reward_model.annotator is None
    assert agreeable.stage == dataclasses.replace(plain.stage, reward_model=dataclasses.replace(
        plain.stage.reward_model, annotator=AgreeableAnnotator(bonus=2.5)))
    assert recipes.key(plain) != recipes.key(agreeable)
    assert recipes.get("sycophancy-rlvr", scale).parent == syc
    icl = recipes.get("in_context-sft-clean", scale)
    assert icl.train.steps == {"smoke": 150, "full": 2000}[scale] and icl.parent.name == "in_context-pretrain"
    for name in ("in_context-rlvr", "arithmetic_cot-dpo", "arithmetic-rlhf-agreeable", "kb_walk-rlhf-agreeable"):
        assert name not in recipes.NAMES  # only the stages the chapter compares


def test_a_recipes_seconds_count_its_own_training_not_its_parents(cache, monkeypatch):
    """A recipe whose parent is trained first (or by another process, while this one waits) records
    the seconds of its own stage: a clock that jumps 1,000 s while the parent is made never enters."""
    import types

    clock = types.SimpleNamespace(now=0.0)
    real_start = recipe_cache._start

    def slow_parent(recipe, *args, **kw):
        model = real_start(recipe, *args, **kw)
        clock.now += 1000.0  # the parent's training, or the wait for it
        return model

    def fit(self, recipe, model, device, dtype, checkpoints):
        clock.now += 5.0  # this stage's own training
        return real_fit(self, recipe, model, device, dtype, checkpoints)

    r = tiny_sft(steps=4)
    real_fit = type(r.stage).fit
    monkeypatch.setattr(recipe_cache, "time", types.SimpleNamespace(perf_counter=lambda: clock.now))
    monkeypatch.setattr(recipe_cache, "_start", slow_parent)
    monkeypatch.setattr(type(r.stage), "fit", fit)
    trained = recipes.load_recipe(r, "cpu")
    assert trained.seconds == 5.0


def test_prefetch_workers_share_the_threads_on_a_gpu_and_keep_them_on_a_cpu():
    threads = torch.get_num_threads()
    assert recipes.worker_threads("cpu", 4) == threads  # a CPU recipe's key holds its thread count
    assert recipes.worker_threads("cuda", 4) == max(1, threads // 4)  # torch.device needs no GPU
    assert recipes.worker_threads(torch.device("cuda", 1), 10 * threads) == 1
    with pytest.raises(ValueError, match="workers"):
        recipes.worker_threads("cuda", 0)
