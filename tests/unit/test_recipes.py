"""Recipes: names, cache keys, train-once-then-load, and Hugging Face compatibility of the checkpoints."""

import dataclasses
import json
import os

import pytest
import torch

from halluc_lab import recipes
from halluc_lab.model import ModelConfig
from halluc_lab.data import IGNORE
from halluc_lab.sft import BackspaceConfig
from halluc_lab.tasks import ArithmeticConfig, make_task
from halluc_lab.train import TrainConfig

CPU = torch.device("cpu")


def tiny(stage="pretrain", **kw):
    """A recipe small enough to train in a second."""
    task = ArithmeticConfig(max_digits=2, n_pretrain_documents=200, equations_per_document=3)
    model = ModelConfig(vocab_size=make_task(task).tokenizer().vocab_size, hidden_size=32, n_layers=1,
                        n_heads=2, max_positions=64)
    pre = recipes.Recipe("arithmetic-pretrain", "smoke", task, model,
                         TrainConfig(steps=30, lr=1e-2, warmup_steps=3, log_every=10), batch_size=8, seq_len=48)
    if stage == "pretrain":
        return dataclasses.replace(pre, **kw)
    return recipes.Recipe(f"arithmetic-{stage}", "smoke", task, model,
                          TrainConfig(steps=20, lr=3e-3, warmup_steps=2, log_every=10), batch_size=8, seq_len=48,
                          parent=pre, n_examples=200, seed=1, **kw)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HALLUC_CACHE", str(tmp_path))
    return tmp_path


def test_every_name_exists_at_smoke_scale_and_sft_starts_from_its_pretraining():
    for name in recipes.NAMES:
        r = recipes.get(name, "smoke")
        assert r.name == name and r.scale == "smoke"
        if r.stage != "pretrain":
            # path_star's backspace SFT alone continues from clean SFT (recipes._sft_parent says why)
            parent = "path_star-sft-clean" if name == "path_star-sft-backspace" else name.split("-")[0] + "-pretrain"
            assert r.parent == recipes.get(parent, "smoke") and r.model == r.parent.model
            assert r.pretraining == recipes.get(name.split("-")[0] + "-pretrain", "smoke")  # the replay corpus
    assert recipes.get("kb_walk-sft-backspace", "smoke").backspace is not None
    assert recipes.get("kb_walk-sft-scheduled", "smoke").scheduled_sampling > 0


@pytest.mark.parametrize("task", recipes.TASKS)
def test_pretraining_is_exactly_one_pass_over_the_corpus(task):
    r = recipes.get(f"{task}-pretrain", "smoke")
    rows = recipes.training_rows(r).input_ids.shape[0]
    assert r.train.steps == rows // r.batch_size


@pytest.mark.parametrize("bad", ["kb_walk-finetune", "chess-pretrain", "kb_walk"])
def test_unknown_names_and_scales_raise(bad):
    with pytest.raises(ValueError, match="unknown recipe"):
        recipes.get(bad, "smoke")
    with pytest.raises(ValueError, match="scale"):
        recipes.get("kb_walk-pretrain", "huge")


def test_key_changes_with_the_config_the_parent_the_version_and_the_dtype(monkeypatch):
    r = tiny("sft-clean")
    k = recipes.key(r)
    assert recipes.key(tiny("sft-clean")) == k
    assert recipes.key(dataclasses.replace(r, n_examples=201)) != k
    assert recipes.key(dataclasses.replace(r, parent=dataclasses.replace(r.parent, seed=5))) != k
    assert recipes.key(dataclasses.replace(r, task=dataclasses.replace(r.task, reverse_output=True))) != k
    assert recipes.key(r, torch.bfloat16) != k
    monkeypatch.setattr(recipes, "FORMAT_VERSION", recipes.FORMAT_VERSION + 1)
    assert recipes.key(r) != k


def test_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("HALLUC_CACHE", str(tmp_path / "c"))
    assert recipes.cache_root() == str(tmp_path / "c")
    monkeypatch.delenv("HALLUC_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert recipes.cache_root() == str(tmp_path / "x" / "halluc_lab")


def test_a_recipe_trains_on_first_use_and_loads_afterwards(cache):
    first = recipes.load_recipe(tiny("sft-clean"), CPU, verbose=False)
    assert first.trained_now and os.path.exists(os.path.join(first.path, "DONE"))
    assert os.path.exists(recipes.directory(tiny()))  # the parent was trained and cached too
    assert not os.path.exists(os.path.join(first.path, "checkpoints"))
    again = recipes.load_recipe(tiny("sft-clean"), CPU, verbose=False)
    assert not again.trained_now and again.history.loss == first.history.loss
    for a, b in zip(again.model.parameters(), first.model.parameters()):
        assert torch.equal(a, b)
    assert first.history.loss[-1] < first.history.loss[0]


def test_a_recipe_directory_holding_another_config_raises(cache):
    done = recipes.load_recipe(tiny(), CPU, verbose=False)
    with open(os.path.join(done.path, "recipe.json")) as f:
        saved = json.load(f)
    saved["recipe"]["batch_size"] = 999
    with open(os.path.join(done.path, "recipe.json"), "w") as f:
        json.dump(saved, f)
    with pytest.raises(ValueError, match="different recipe"):
        recipes.load_recipe(tiny(), CPU, verbose=False)


def test_checkpoint_loads_with_auto_classes_and_hf_generate_matches_the_engine(cache):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from halluc_lab.engine import generate

    trained = recipes.load_recipe(tiny(), CPU, verbose=False)
    hf = AutoModelForCausalLM.from_pretrained(os.path.join(trained.path, "model")).eval()
    hf_tok = AutoTokenizer.from_pretrained(os.path.join(trained.path, "model"))
    prompts = [e.prompt for e in trained.task.examples("heldout", 6, seed=0)]
    ours = generate(trained.model, [[1] + trained.tokenizer.encode(p) for p in prompts], 8, greedy=True).token_lists()
    for p, mine in zip(prompts, ours):
        ids = hf_tok(p, return_tensors="pt").input_ids
        assert ids[0].tolist() == [1] + trained.tokenizer.encode(p)
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                          eos_token_id=None, pad_token_id=0)
        assert out[0, ids.shape[1]:].tolist() == mine


def test_sft_rows_mask_the_prompt_and_backspace_rows_hold_backspaces():
    clean = recipes.training_rows(tiny("sft-clean"))
    tok = make_task(tiny().task).tokenizer()
    eq = tok.token_id("=")
    for ids, labels in zip(clean.input_ids.tolist(), clean.labels.tolist()):
        for t, tid in enumerate(ids):
            if tid in (tok.bos_id, tok.token_id("+")):
                assert labels[t] == IGNORE
            if tid == eq:
                assert labels[t] == IGNORE and labels[t + 1] != IGNORE
    bk = recipes.training_rows(tiny("sft-backspace", backspace=BackspaceConfig(rate=0.5)))
    assert (bk.input_ids == tok.bksp_id).sum() > 50
    assert (bk.labels == tok.bksp_id).sum() == (bk.input_ids == tok.bksp_id).sum()


@pytest.mark.gpu
def test_a_recipe_trains_on_cuda_under_bf16_autocast_and_generates_like_hugging_face(cache):
    from transformers import AutoModelForCausalLM

    from halluc_lab.engine import generate

    cuda = torch.device("cuda")
    trained = recipes.load_recipe(tiny("sft-backspace", backspace=BackspaceConfig(rate=0.2)), cuda, torch.bfloat16,
                                  verbose=False)
    assert next(trained.model.parameters()).is_cuda
    assert trained.history.loss[-1] < trained.history.loss[0]
    assert recipes.directory(trained.recipe, torch.bfloat16) != recipes.directory(trained.recipe)
    hf = AutoModelForCausalLM.from_pretrained(os.path.join(trained.path, "model")).to(cuda).eval()
    prompts = [[1] + trained.tokenizer.encode(e.prompt) for e in trained.task.examples("heldout", 8, seed=0)]
    ours = generate(trained.model, prompts, 6, greedy=True).token_lists()
    for p, mine in zip(prompts, ours):
        ids = torch.tensor([p], device=cuda)
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False,
                          eos_token_id=None, pad_token_id=0)
        assert out[0, len(p):].tolist() == mine


def test_code_fingerprint_ignores_prose_but_not_code(monkeypatch, tmp_path):
    import ast

    src = 'def f(x):\n    """Docstring."""\n    # a comment\n    return x + 1\n'
    prose = 'def f(x):\n    """Other words."""\n\n    return x + 1  # another comment\n'
    code = 'def f(x):\n    """Docstring."""\n    return x + 2\n'
    dump = lambda s: ast.dump(recipes._strip_docstrings(ast.parse(s)))
    assert dump(src) == dump(prose) != dump(code)
    k = recipes.key(tiny())
    monkeypatch.setattr(recipes, "code_fingerprint", lambda: "something else")
    assert recipes.key(tiny()) != k
