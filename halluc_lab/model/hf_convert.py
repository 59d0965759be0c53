"""Hugging Face interchange: the lab's model as ``LlamaForCausalLM`` and back (chapter 6).

Hugging Face serves as reference and peer (ARCHITECTURE.md §8): the same weights give the same
logits and the same greedy tokens on both sides (tests/unit/test_model.py), and
:func:`save_pretrained` writes a checkpoint that ``AutoModelForCausalLM.from_pretrained`` loads;
:func:`load_pretrained` reads it (or one HF wrote) back. The lab fuses ``W_Q, W_K, W_V`` into
``qkv_proj`` and ``W_gate, W_up`` into ``gate_up_proj``; the conversion splits and joins them.
This module imports :mod:`halluc_lab.model.transformer`, never the reverse: the model needs no file
format.

A checkpoint folder declares its weights: ``model.safetensors``, or the shards named by
``model.safetensors.index.json`` when there is one (HF's rule). Only those are read, so a stale
``*.safetensors`` left in the folder cannot override the weights.

Where the formats cannot meet, conversion raises rather than approximates: HF's "dynamic"
RoPE recomputes its base from the current length, so the lab's static NTK-aware scaling has
no HF equivalent.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from halluc_lab.model.config import ModelConfig
from halluc_lab.model.transformer import Transformer
from halluc_lab.model.positional import RopeScaling

Tensor = torch.Tensor


def _rope_parameters(config: ModelConfig) -> dict:
    """``rope_parameters`` of transformers 5 for the lab's RoPE (the same formula or an error)."""
    s = config.rope_scaling or RopeScaling()
    params = {"rope_type": "default", "rope_theta": float(config.rope_theta)}
    if s.kind == "linear":
        params.update(rope_type="linear", factor=float(s.factor))
    elif s.kind == "yarn":
        params.update(rope_type="yarn", factor=float(s.factor),
                      original_max_position_embeddings=s.original_max_positions,
                      beta_fast=float(s.beta_fast), beta_slow=float(s.beta_slow),
                      truncate=s.truncate)
        if s.attention_factor is not None:
            params["attention_factor"] = float(s.attention_factor)
    elif s.kind == "ntk":
        # HF's "dynamic" recomputes the base from the current length and leaves it unscaled up to
        # max_position_embeddings, so no HF rope_type computes the static NTK-aware frequencies.
        raise ValueError("rope_scaling kind 'ntk' has no Hugging Face equivalent (HF 'dynamic' "
                         "changes with the "
                         "sequence length); use kind 'none', 'linear' or 'yarn' to convert")
    return params


def to_hf_config(config: ModelConfig, **kwargs):
    """The ``LlamaConfig`` of the same architecture; ``kwargs`` override fields (e.g.
    ``eos_token_id``)."""
    from transformers import LlamaConfig

    fields = dict(vocab_size=config.vocab_size, hidden_size=config.hidden_size,
                  intermediate_size=config.intermediate_size, num_hidden_layers=config.n_layers,
                  num_attention_heads=config.n_heads, num_key_value_heads=config.n_kv_heads,
                  head_dim=config.head_dim, hidden_act="silu",
                  max_position_embeddings=config.max_positions, rms_norm_eps=float(config.norm_eps),
                  initializer_range=float(config.init_std),
                  tie_word_embeddings=config.tie_embeddings,
                  rope_parameters=_rope_parameters(config), attention_bias=False, mlp_bias=False,
                  bos_token_id=None, eos_token_id=None, pad_token_id=None,
                  architectures=["LlamaForCausalLM"])
    fields.update(kwargs)
    return LlamaConfig(**fields)


def config_from_hf(hf_config, **overrides) -> ModelConfig:
    """A :class:`ModelConfig` from a ``LlamaConfig`` or its ``config.json`` dict; unsupported
    features raise."""
    d = hf_config.to_dict() if hasattr(hf_config, "to_dict") else dict(hf_config)
    if d.get("model_type", "llama") != "llama":
        raise ValueError(f"only Llama configs convert, got model_type={d.get('model_type')!r}")
    for key, ok in (("hidden_act", "silu"), ("attention_bias", False), ("mlp_bias", False)):
        if d.get(key, ok) != ok:
            raise ValueError(f"{key} must be {ok!r} for the lab's model, got {d[key]!r}")
    heads = d["num_attention_heads"]
    if d.get("head_dim") not in (None, d["hidden_size"] // heads):
        raise ValueError(f"head_dim must be hidden_size / num_attention_heads, got {d['head_dim']}")
    rope = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
    theta = rope.get("rope_theta", d.get("rope_theta", 10000.0))
    kind = rope.get("rope_type", rope.get("type", "default"))
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("partial_rotary_factor must be 1 (RoPE on the whole head)")
    if kind == "default":
        scaling = None
    elif kind == "linear":
        scaling = RopeScaling("linear", float(rope["factor"]))
    elif kind == "yarn":
        if rope.get("mscale") or rope.get("mscale_all_dim"):
            raise ValueError("YaRN with mscale/mscale_all_dim is not supported")
        original = "original_max_position_embeddings"
        scaling = RopeScaling("yarn", float(rope["factor"]),
                              original_max_positions=int(rope.get(original)
                                                         or d["max_position_embeddings"]),
                              beta_fast=float(rope.get("beta_fast") or 32),
                              beta_slow=float(rope.get("beta_slow") or 1),
                              attention_factor=rope.get("attention_factor"),
                              truncate=bool(rope.get("truncate", True)))
    else:
        raise ValueError(f"rope_type {kind!r} has no equivalent here; supported: default, "
                         "linear, yarn")
    fields = dict(vocab_size=d["vocab_size"], hidden_size=d["hidden_size"],
                  n_layers=d["num_hidden_layers"], n_heads=heads,
                  n_kv_heads=d.get("num_key_value_heads") or heads,
                  intermediate_size=d["intermediate_size"], rope_theta=float(theta),
                  rope_scaling=scaling, max_positions=d["max_position_embeddings"],
                  tie_embeddings=bool(d.get("tie_word_embeddings", False)),
                  norm_eps=float(d["rms_norm_eps"]),
                  init_std=float(d.get("initializer_range", 0.02)))
    fields.update(overrides)
    return ModelConfig(**fields)


def hf_state_dict(model: Transformer) -> dict[str, Tensor]:
    """The model's weights under ``LlamaForCausalLM``'s names, fused matrices split (views, no
    copies)."""
    c = model.config
    q, kv, inter = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim, c.intermediate_size
    out = {"model.embed_tokens.weight": model.embed_tokens.weight,
           "model.norm.weight": model.norm.weight, "lm_head.weight": model.embed_tokens.weight
           if model.lm_head is None else model.lm_head.weight}
    for i, block in enumerate(model.layers):
        p = f"model.layers.{i}."
        wq, wk, wv = block.self_attn.qkv_proj.weight.split([q, kv, kv])  # rows: outputs
        gate, up = block.mlp.gate_up_proj.weight.split([inter, inter])
        out.update({p + "self_attn.q_proj.weight": wq, p + "self_attn.k_proj.weight": wk,
                    p + "self_attn.v_proj.weight": wv,
                    p + "self_attn.o_proj.weight": block.self_attn.o_proj.weight,
                    p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up,
                    p + "mlp.down_proj.weight": block.mlp.down_proj.weight,
                    p + "input_layernorm.weight": block.input_layernorm.weight,
                    p + "post_attention_layernorm.weight": block.post_attention_layernorm.weight})
    return out


@torch.no_grad()
def load_hf_state_dict(model: Transformer, state: dict[str, Tensor]) -> None:
    """Copy weights named as ``LlamaForCausalLM``'s into the model; missing or extra names raise."""
    mine = hf_state_dict(model)
    if model.lm_head is None:
        # tied: the embedding is the head
        state = {k: v for k, v in state.items() if k != "lm_head.weight"}
        mine.pop("lm_head.weight")
    state = {k: v for k, v in state.items() if not k.endswith("rotary_emb.inv_freq")}
    missing, extra = sorted(set(mine) - set(state)), sorted(set(state) - set(mine))
    if missing or extra:
        raise ValueError(f"state dict does not match the config: missing {missing[:4]}, "
                         f"unexpected {extra[:4]}")
    for name, target in mine.items():
        if state[name].shape != target.shape:
            raise ValueError(f"{name}: expected shape {tuple(target.shape)}, got "
                             f"{tuple(state[name].shape)}")
        # target is a view into the fused matrix, so this fills it in place
        target.copy_(state[name])


def to_hf(model: Transformer):
    """A ``LlamaForCausalLM`` with the same weights (a copy, float32, on the CPU)."""
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM(to_hf_config(model.config))
    state = {k: v.detach().float().cpu() for k, v in hf_state_dict(model).items()}
    result = hf.load_state_dict(state, strict=False)
    # tied: lm_head is the embedding
    if result.unexpected_keys or set(result.missing_keys) - {"lm_head.weight"}:
        raise RuntimeError(f"weights did not map onto LlamaForCausalLM: {result}")
    return hf.eval()


def from_hf(hf_model) -> Transformer:
    """The lab's model with the weights of a ``LlamaForCausalLM`` (a copy, float32, on the CPU)."""
    model = Transformer(config_from_hf(hf_model.config))
    load_hf_state_dict(model,
                       {k: v.detach().float().cpu() for k, v in hf_model.state_dict().items()})
    return model


# ----------------------------------------------------------------------------- checkpoints in HF's
# format

WEIGHTS_NAME = "model.safetensors"  # HF's file name for unsharded weights
# HF's index of sharded weights: {"weight_map": {name: file}}
INDEX_NAME = "model.safetensors.index.json"


def save_pretrained(model: Transformer, directory: str | Path, **hf_config_kwargs) -> None:
    """Write ``config.json`` and ``model.safetensors`` in Hugging Face's Llama format.

    ``hf_config_kwargs`` go to ``LlamaConfig`` (e.g. ``eos_token_id``). A shard index left in the
    folder by an earlier sharded save is removed with its shards, so the folder declares these
    weights.
    """
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    to_hf_config(model.config, **hf_config_kwargs).save_pretrained(directory)
    if (directory / INDEX_NAME).is_file():
        for shard in _index_shards(directory):
            (directory / shard).unlink(missing_ok=True)
        (directory / INDEX_NAME).unlink()
    tensors = {k: v.detach().contiguous().cpu() for k, v in hf_state_dict(model).items()
               # HF drops the tied copy
               if not (model.config.tie_embeddings and k == "lm_head.weight")}
    save_file(tensors, str(directory / WEIGHTS_NAME), metadata={"format": "pt"})


def load_pretrained(directory: str | Path) -> Transformer:
    """The model :func:`save_pretrained` (or HF's ``LlamaForCausalLM.save_pretrained``) wrote, on
    the CPU.

    Reads ``config.json`` and exactly the weight files the folder declares (see the module
    docstring); raises FileNotFoundError naming the path of a missing one.
    """
    from safetensors.torch import load_file

    directory = Path(directory)
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(f"{directory / 'config.json'} does not exist (a Hugging Face "
                                "checkpoint needs it)")
    files = _index_shards(directory) if (directory / INDEX_NAME).is_file() else [WEIGHTS_NAME]
    for f in files:
        if not (directory / f).is_file():
            declared = (f"declared by {directory / INDEX_NAME}" if f != WEIGHTS_NAME
                        else "(no shard index either)")
            raise FileNotFoundError(f"weight file {directory / f} does not exist {declared}")
    state = {}
    for f in files:
        state.update(load_file(str(directory / f)))
    model = Transformer(config_from_hf(json.loads((directory / "config.json").read_text())))
    load_hf_state_dict(model, state)
    return model


def _index_shards(directory: Path) -> list[str]:
    """The shard files ``model.safetensors.index.json`` names, each once, in order."""
    try:
        weight_map = json.loads((directory / INDEX_NAME).read_text())["weight_map"]
        shards = sorted(set(weight_map.values()))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{directory / INDEX_NAME} is not a safetensors index (needs a "
                         "'weight_map' "
                         f"of tensor name -> file name): {e!r}") from e
    if not shards or any(not isinstance(f, str) or Path(f).name != f for f in shards):
        raise ValueError(f"{directory / INDEX_NAME} must name at least one shard file in its own "
                         f"folder, got {shards}")
    return shards
