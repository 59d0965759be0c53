"""The lab's decoder: reference vs fast paths, Hugging Face parity, packing, padding, the cached
forward."""

import dataclasses
import math
from functools import partial

import pytest
import torch

from halluc_lab.model.hf_convert import config_from_hf, from_hf, to_hf, to_hf_config
from halluc_lab.model.kv_cache import KVCache
from halluc_lab.model.transformer import (MLP, ModelConfig, RMSNorm, Transformer,
                                          rms_norm_reference, segment_positions)
from halluc_lab.model.positional import RopeScaling
from tests.unit._tiny_lm import small_config

V = 97
SCALINGS = {"plain": None, "linear": RopeScaling("linear", 2.0),
            "yarn": RopeScaling("yarn", 4.0, original_max_positions=32)}


tiny = partial(small_config, V, tie_embeddings=False)  # (n_kv_heads=2, **changes) -> ModelConfig


def ids(B=3, T=12, seed=0):
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1], ids=["MHA", "GQA", "MQA"])
def test_fast_path_equals_reference_path(n_kv_heads):
    config = tiny(n_kv_heads)
    fast, ref = Transformer(config), Transformer(dataclasses.replace(config, fast=False))
    x, seg = ids(), torch.tensor([[0] * 5 + [1] * 7] * 3)
    with torch.no_grad():
        torch.testing.assert_close(fast(x), ref(x), atol=1e-5, rtol=0)
        torch.testing.assert_close(fast(x, segment_ids=seg), ref(x, segment_ids=seg), atol=1e-5,
                                   rtol=0)


def test_fused_rms_norm_equals_the_formula():
    x, w = torch.randn(4, 7, 16), torch.randn(16)
    norm = RMSNorm(16, 1e-5)
    norm.weight.data.copy_(w)
    torch.testing.assert_close(norm(x), rms_norm_reference(x, w, 1e-5), atol=1e-6, rtol=1e-6)
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w
    torch.testing.assert_close(norm(x), expected, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("scaling", SCALINGS, ids=list(SCALINGS))
@pytest.mark.parametrize("n_kv_heads", [4, 2, 1], ids=["MHA", "GQA", "MQA"])
@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_logits_equal_hugging_face_llama(scaling, n_kv_heads, tie):
    config = tiny(n_kv_heads, rope_scaling=SCALINGS[scaling], tie_embeddings=tie)
    model = Transformer(config, seed=1)
    hf = to_hf(model)
    x = ids(T=40)
    with torch.no_grad():
        torch.testing.assert_close(model(x), hf(input_ids=x).logits, atol=1e-5, rtol=0)
        torch.testing.assert_close(from_hf(hf)(x), model(x), atol=0, rtol=0)
    assert config_from_hf(hf.config) == model.config


def test_ntk_scaling_has_no_hugging_face_equivalent():
    with pytest.raises(ValueError, match="ntk"):
        to_hf_config(tiny(rope_scaling=RopeScaling("ntk", 2.0)))


def test_unsupported_hugging_face_configs_raise():
    cfg = to_hf_config(tiny()).to_dict()
    for key, value in [("hidden_act", "gelu"), ("attention_bias", True),
                       ("rope_parameters",
                        {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4})]:
        with pytest.raises(ValueError):
            config_from_hf({**cfg, key: value})


def test_segment_positions_restart_at_each_new_segment():
    assert segment_positions(torch.tensor([[1, 1, 1, 2, 2, 0]])).tolist() == [[0, 1, 2, 0, 1, 0]]
    assert segment_positions(torch.tensor([[3, 3], [4, 5]])).tolist() == [[0, 1], [0, 0]]


@pytest.mark.parametrize("n_kv_heads", [4, 1], ids=["MHA", "MQA"])
def test_packed_and_unpacked_logits_are_equal(n_kv_heads):
    model = Transformer(tiny(n_kv_heads, rope_scaling=SCALINGS["linear"]))
    a, b, c = ids(1, 5, 1)[0], ids(1, 9, 2)[0], ids(1, 3, 3)[0]
    packed = torch.cat([a, b, c])[None]  # (1, 17)
    seg = torch.tensor([[0] * 5 + [1] * 9 + [2] * 3])
    with torch.no_grad():
        out = model(packed, segment_ids=seg)[0]
        for piece, start in ((a, 0), (b, 5), (c, 14)):
            torch.testing.assert_close(out[start:start + len(piece)], model(piece[None])[0],
                                       atol=1e-5, rtol=0)


def test_right_padding_leaves_real_positions_unchanged():
    model = Transformer(tiny())
    x = ids(1, 6)
    padded = torch.cat([x, torch.zeros(1, 4, dtype=torch.long)], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(model(padded)[:, :6], model(x), atol=1e-5, rtol=0)


@pytest.mark.parametrize("scaling", SCALINGS, ids=list(SCALINGS))
@pytest.mark.parametrize("n_kv_heads", [4, 2, 1], ids=["MHA", "GQA", "MQA"])
def test_cached_forward_equals_the_full_forward(scaling, n_kv_heads):
    model = Transformer(tiny(n_kv_heads, rope_scaling=SCALINGS[scaling]))
    x = ids(3, 16)
    with torch.no_grad():
        full = model(x)
        cache = model.new_cache(3, 32)
        parts = [model(x[:, :7], cache=cache)]
        parts += [model(x[:, t:t + 1], cache=cache) for t in range(7, 16)]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-5, rtol=0)
    assert cache.lengths.tolist() == [16, 16, 16]


def test_cached_rows_of_different_lengths_match_their_own_full_forward():
    model = Transformer(tiny())
    x = ids(2, 10)
    with torch.no_grad():
        cache = model.new_cache(2, 16)
        model(x[:, :6], cache=cache)
        cache.rollback([1], 4)  # row 1 keeps 2 tokens; its stale slots must stay invisible
        step = torch.stack([x[0, 6], x[1, 2]])[:, None]  # (2, 1)
        out = model(step, cache=cache)[:, 0]
        torch.testing.assert_close(out[0], model(x[:1, :7])[0, -1], atol=1e-5, rtol=0)
        torch.testing.assert_close(out[1], model(x[1:, :3])[0, -1], atol=1e-5, rtol=0)


def test_same_seed_same_weights_other_seed_other_weights():
    a, b, c = Transformer(tiny(), seed=3), Transformer(tiny(), seed=3), Transformer(tiny(), seed=4)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a.embed_tokens.weight, c.embed_tokens.weight)


def test_training_step_gives_finite_gradients_everywhere():
    model = Transformer(tiny(tie_embeddings=True))
    x = ids(2, 8)
    logits = model(x[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), x[:, 1:].reshape(-1))
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_bf16_autocast_on_cpu_stays_close_to_fp32():
    model = Transformer(tiny())
    x = ids()
    with torch.no_grad():
        ref = model(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = model(x)
    assert low.dtype == torch.bfloat16
    assert (low.float() - ref).abs().max() < 0.1


@pytest.mark.parametrize("kw", [dict(hidden_size=30), dict(n_kv_heads=3), dict(n_layers=0),
                                dict(vocab_size=-1), dict(norm_eps=0.0),
                                dict(rope_scaling="linear"),
                                dict(hidden_size=30, n_heads=6, n_kv_heads=6)])
def test_bad_configs_raise(kw):
    with pytest.raises((ValueError, TypeError)):
        tiny(**kw)


def test_bad_calls_raise_clear_errors():
    model = Transformer(tiny())
    cache = model.new_cache(3, 8)
    with pytest.raises(ValueError, match="input_ids"):
        model(torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="segment_ids"):
        model(ids(), segment_ids=torch.zeros(3, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="cannot be combined"):
        model(ids(3, 2), segment_ids=torch.zeros(3, 2, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="rows"):
        model(ids(2, 2), cache=cache)
    with pytest.raises(ValueError, match="do not fit"):
        model(ids(3, 9), cache=cache)
    assert cache.lengths.tolist() == [0, 0, 0]  # nothing was written


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_logits_to_keep_gives_the_same_logits_as_slicing_the_full_ones(tie):
    model = Transformer(tiny(tie_embeddings=tie))
    x = ids(3, 10)
    per_row = torch.tensor([[9, 0], [4, 4], [2, 7]])  # (B, K): each row its own positions
    with torch.no_grad():
        full = model(x)  # (3, 10, V)
        torch.testing.assert_close(model(x, logits_to_keep=1), full[:, -1:], atol=1e-6, rtol=0)
        torch.testing.assert_close(model(x, logits_to_keep=4), full[:, -4:], atol=1e-6, rtol=0)
        torch.testing.assert_close(model(x, logits_to_keep=10), full, atol=0, rtol=0)
        torch.testing.assert_close(model(x, logits_to_keep=torch.tensor([0, 5])), full[:, [0, 5]],
                                   atol=1e-6, rtol=0)
        torch.testing.assert_close(model(x, logits_to_keep=per_row),
                                   full[torch.arange(3)[:, None], per_row], atol=1e-6, rtol=0)
        assert model(x, logits_to_keep=torch.zeros(0, dtype=torch.long)).shape == (3, 0, V)


def test_logits_to_keep_with_a_cache_still_fills_the_cache():
    model = Transformer(tiny())
    x = ids(2, 9)
    with torch.no_grad():
        cache = model.new_cache(2, 16)
        none = torch.zeros(0, dtype=torch.long)
        assert model(x[:, :8], cache=cache, logits_to_keep=none).shape == (2, 0, V)
        last = model(x[:, 8:], cache=cache)[:, -1]
        torch.testing.assert_close(last, model(x)[:, -1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("keep", [-1, 11, 1.0, True, torch.tensor([10]), torch.tensor([0.0]),
                                  torch.zeros(2, 1, dtype=torch.long),
                                  torch.zeros(3, 1, 1, dtype=torch.long)])
def test_bad_logits_to_keep_raises_naming_it_before_the_cache_changes(keep):
    model = Transformer(tiny())
    cache = model.new_cache(3, 16)
    with pytest.raises(ValueError, match="logits_to_keep"):
        model(ids(3, 10), cache=cache, logits_to_keep=keep)
    assert cache.lengths.tolist() == [0, 0, 0] and cache.k.abs().sum() == 0


def test_token_ids_outside_the_vocabulary_raise_before_anything_is_written():
    model = Transformer(tiny())
    cache = model.new_cache(3, 16)
    for bad in (V, -1):
        x = ids(3, 4)
        x[1, 2] = bad
        with pytest.raises(ValueError, match=rf"input_ids must hold token ids in \[0, {V - 1}\]"):
            model(x, cache=cache)
    assert cache.lengths.tolist() == [0, 0, 0] and cache.k.abs().sum() == 0
    for dtype in (torch.float32, torch.bool, torch.uint8):
        with pytest.raises(TypeError, match="input_ids must be an int64 or int32"):
            model(ids(3, 4).to(dtype))
    with pytest.raises(TypeError, match="input_ids"):
        model([[1, 2]])
    model(ids(3, 4).int())  # int32 ids are fine


@pytest.mark.parametrize("kw,name", [(dict(rope_theta=math.nan), "rope_theta"),
                                     (dict(rope_theta=math.inf), "rope_theta"),
                                     (dict(rope_theta=1.0), "rope_theta"),
                                     (dict(init_std=math.inf), "init_std"),
                                     (dict(init_std=math.nan), "init_std"),
                                     (dict(norm_eps=math.inf), "norm_eps")])
def test_non_finite_or_out_of_range_config_floats_raise_naming_the_field(kw, name):
    with pytest.raises(ValueError, match=f"{name} must be a finite number"):
        tiny(**kw)


@pytest.mark.parametrize("kw,name", [(dict(rope_theta="1e4"), "rope_theta"),
                                     (dict(init_std=None), "init_std"),
                                     (dict(tie_embeddings=1), "tie_embeddings"),
                                     (dict(fast="yes"), "fast")])
def test_config_fields_of_the_wrong_type_raise_type_error(kw, name):
    with pytest.raises(TypeError, match=name):
        tiny(**kw)


def test_model_config_accepts_numpy_integers_as_ints():
    import numpy as np

    from halluc_lab.model.config import ModelConfig

    cfg = ModelConfig(vocab_size=np.int64(10), hidden_size=np.int32(8), n_layers=1, n_heads=2)
    assert cfg == ModelConfig(vocab_size=10, hidden_size=8, n_layers=1, n_heads=2)
    assert type(cfg.vocab_size) is int and type(cfg.hidden_size) is int


def test_a_forward_pass_past_max_positions_is_refused():
    model = Transformer(tiny(max_positions=16), seed=0).eval()
    with torch.no_grad():
        model(ids(T=16))  # the whole context is fine
        past = "position 17 is past the model's context, config.max_positions=16"
        with pytest.raises(ValueError, match=past):
            model(ids(T=17))
        cache = KVCache.for_model(model.config, 3, 64)  # a cache longer than the context
        model(ids(T=12), cache=cache)
        model(ids(T=4, seed=1), cache=cache)
        with pytest.raises(ValueError, match=r"position 17 .* the cache holds up to 16"):
            model(ids(T=1, seed=2), cache=cache)


def test_001_eq_17_swiglu_is_a_gated_sigma_that_halves_the_width():
    """001 App. A eq. (17), FFN(x) = W_2 σ(Wx + b_1) + b_2, σ = SwiGLU: σ maps 2I numbers to I."""
    silu = torch.nn.functional.silu
    d, inter = 16, 24
    mlp = MLP(ModelConfig(vocab_size=8, hidden_size=d, n_heads=2, intermediate_size=inter)).double()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in mlp.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=torch.float64))
        x = torch.randn(5, d, generator=g, dtype=torch.float64)
        W, W_2 = mlp.gate_up_proj.weight, mlp.down_proj.weight  # (2I, d), (d, I)
        gate, up = (x @ W.T).chunk(2, dim=-1)  # (5, I) each
        assert W.shape == (2 * inter, d) and W_2.shape == (d, inter)
        assert torch.equal((silu(gate) * up) @ W_2.T, mlp(x))  # σ([u; v]) = SiLU(u) ⊙ v
        with pytest.raises(RuntimeError, match="cannot be multiplied"):
            silu(x @ W.T) @ W_2.T  # σ element-wise: 2I = 48 numbers against W_2's I = 24
        ungated = silu(gate) @ W_2.T
        assert float((ungated - mlp(x)).norm() / mlp(x).norm()) == pytest.approx(0.82, abs=0.005)
    n_weights = sum(p.numel() for p in mlp.parameters())
    assert n_weights == 3 * d * inter == 1152  # a GeLU FFN of width I: 2dI = 768
