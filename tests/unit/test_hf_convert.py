"""Hugging Face checkpoints: save/load round trips, exactly the declared weight files, the import direction."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import halluc_lab.model.transformer
from halluc_lab.model.hf_convert import INDEX_NAME, WEIGHTS_NAME, load_pretrained, save_pretrained
from halluc_lab.model.config import ModelConfig
from halluc_lab.model.transformer import Transformer
from halluc_lab.model.positional import RopeScaling

V = 97


def tiny(seed=0, **kw) -> Transformer:
    args = dict(vocab_size=V, hidden_size=32, n_layers=2, n_heads=4, n_kv_heads=2, max_positions=64,
                tie_embeddings=False, init_std=0.1)
    args.update(kw)
    return Transformer(ModelConfig(**args), seed=seed)


def ids(B=3, T=12, seed=0):
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


def same_weights(a: Transformer, b: Transformer) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))


def test_save_pretrained_loads_with_auto_model_and_back(tmp_path):
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    model = tiny(2, tie_embeddings=True, rope_scaling=RopeScaling("yarn", 4.0, original_max_positions=32))
    save_pretrained(model, tmp_path / "lab")
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "lab")
    assert isinstance(hf, LlamaForCausalLM)
    x = ids()
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=x).logits, model(x), atol=1e-5, rtol=0)
        hf.save_pretrained(tmp_path / "hf")
        again = load_pretrained(tmp_path / "hf")
        torch.testing.assert_close(again(x), model(x), atol=0, rtol=0)


def test_a_stale_extra_safetensors_file_does_not_override_the_declared_weights(tmp_path):
    model, stale = tiny(seed=1), tiny(seed=2)
    save_pretrained(stale, tmp_path / "old")
    save_pretrained(model, tmp_path / "ckpt")
    # A file that sorts after model.safetensors and holds every tensor name: read too, it would win.
    (tmp_path / "old" / WEIGHTS_NAME).rename(tmp_path / "ckpt" / "old.safetensors")
    assert same_weights(load_pretrained(tmp_path / "ckpt"), model)


def test_a_sharded_checkpoint_reads_exactly_the_shards_its_index_names(tmp_path):
    model, stale = tiny(seed=1), tiny(seed=2)
    save_pretrained(model, tmp_path)
    state = load_file(str(tmp_path / WEIGHTS_NAME))
    (tmp_path / WEIGHTS_NAME).unlink()
    names = sorted(state)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for f, keys in shards.items():
        save_file({k: state[k] for k in keys}, str(tmp_path / f))
    weight_map = {k: f for f, keys in shards.items() for k in keys}
    (tmp_path / INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    save_pretrained(stale, tmp_path / "stale")
    (tmp_path / "stale" / WEIGHTS_NAME).rename(tmp_path / "model-00003-of-00003.safetensors")  # not in the index
    assert same_weights(load_pretrained(tmp_path), model)


def test_a_missing_declared_weight_file_raises_naming_its_path(tmp_path):
    save_pretrained(tiny(), tmp_path)
    (tmp_path / WEIGHTS_NAME).rename(tmp_path / "other.safetensors")
    with pytest.raises(FileNotFoundError, match=str(tmp_path / WEIGHTS_NAME)):
        load_pretrained(tmp_path)
    (tmp_path / INDEX_NAME).write_text(json.dumps({"weight_map": {"model.norm.weight": "shard-1.safetensors"}}))
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "shard-1.safetensors")):
        load_pretrained(tmp_path)
    (tmp_path / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_pretrained(tmp_path)


@pytest.mark.parametrize("index", [{"weight_map": "model.safetensors"}, {"weight_map": {}}, {"metadata": {}},
                                   {"weight_map": {"a": "../elsewhere.safetensors"}}])
def test_a_malformed_shard_index_raises(tmp_path, index):
    save_pretrained(tiny(), tmp_path)
    (tmp_path / INDEX_NAME).write_text(json.dumps(index))
    with pytest.raises(ValueError, match=INDEX_NAME):
        load_pretrained(tmp_path)


def test_saving_over_a_sharded_checkpoint_removes_its_index_and_shards(tmp_path):
    save_pretrained(tiny(seed=2), tmp_path)
    (tmp_path / WEIGHTS_NAME).rename(tmp_path / "shard-1.safetensors")
    weight_map = {k: "shard-1.safetensors" for k in load_file(str(tmp_path / "shard-1.safetensors"))}
    (tmp_path / INDEX_NAME).write_text(json.dumps({"weight_map": weight_map}))
    model = tiny(seed=1)
    save_pretrained(model, tmp_path)
    assert not (tmp_path / INDEX_NAME).exists() and not (tmp_path / "shard-1.safetensors").exists()
    assert same_weights(load_pretrained(tmp_path), model)


def test_the_model_module_never_imports_hf_convert():
    tree = ast.parse(Path(halluc_lab.model.transformer.__file__).read_text())
    imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in imported if m and "hf_convert" in m]
    code = "import sys, halluc_lab.model.transformer; sys.exit('halluc_lab.model.hf_convert' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
