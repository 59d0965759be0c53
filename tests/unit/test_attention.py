"""Tests of halluc_lab.model.attention: oracles against PyTorch and Hugging Face, masks, GQA, bad input."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from halluc_lab.model.attention import (AttentionConfig, MultiHeadAttention, causal_mask, fused_attention,
                                  repeat_kv, scaled_dot_product_attention)
from halluc_lab.model.positional import rope_cos_sin, rope_frequencies


def _qkv(B=2, H=3, T_q=5, T_k=5, D=8, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T_q, D, generator=g, dtype=dtype)
    k = torch.randn(B, H, T_k, D, generator=g, dtype=dtype)
    v = torch.randn(B, H, T_k, D, generator=g, dtype=dtype)
    return q, k, v


def test_causal_mask_is_lower_triangular():
    assert torch.equal(causal_mask(4), torch.tril(torch.ones(4, 4, dtype=torch.bool)))


def test_causal_mask_with_cache_aligns_queries_to_the_last_positions():
    m = causal_mask(2, 5)
    assert m.tolist() == [[True, True, True, True, False], [True] * 5]
    assert torch.equal(causal_mask(5, 5)[-2:], m)


@pytest.mark.parametrize("T_q,T_k", [(0, None), (3, 2), (2.0, None), (True, None)])
def test_causal_mask_rejects_bad_sizes(T_q, T_k):
    with pytest.raises(ValueError, match="T_"):
        causal_mask(T_q, T_k)


def test_no_mask_matches_torch():
    q, k, v = _qkv()
    out, w = scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, 5))


def test_causal_matches_torch_is_causal():
    q, k, v = _qkv()
    out, w = scaled_dot_product_attention(q, k, v, causal=True)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-6, rtol=1e-6)
    assert torch.all(w.triu(1) == 0)


def test_causal_with_cache_matches_torch_with_a_bottom_right_mask():
    q, k, v = _qkv(T_q=3, T_k=7)
    out, _ = scaled_dot_product_attention(q, k, v, causal=True)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(3, 7, dtype=torch.bool).tril(diagonal=4))
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)


def test_causal_with_cache_matches_the_last_rows_of_full_attention():
    q, k, v = _qkv(T_q=7, T_k=7)
    full, _ = scaled_dot_product_attention(q, k, v, causal=True)
    last, _ = scaled_dot_product_attention(q[:, :, -3:], k, v, causal=True)
    torch.testing.assert_close(last, full[:, :, -3:], atol=1e-6, rtol=1e-6)


def test_bool_and_additive_masks_match_torch():
    q, k, v = _qkv(T_q=4, T_k=6, seed=1)
    keep = torch.rand(2, 1, 4, 6, generator=torch.Generator().manual_seed(3)) > 0.3
    keep[..., 0] = True  # no fully masked rows here: that case has its own test
    additive = torch.zeros(keep.shape).masked_fill(~keep, float("-inf")) + 0.1 * torch.randn(keep.shape)
    for mask in (keep, additive):
        out, _ = scaled_dot_product_attention(q, k, v, mask)
        torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), atol=1e-6, rtol=1e-6)


def test_bool_mask_combines_with_causal():
    q, k, v = _qkv(T_q=5, T_k=5, seed=2)
    pad = torch.tensor([False, True, True, True, True])  # left padding: key 0 is hidden
    out, w = scaled_dot_product_attention(q, k, v, pad, causal=True)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(5) & pad)
    torch.testing.assert_close(out[:, :, 1:], ref[:, :, 1:], atol=1e-6, rtol=1e-6)
    assert torch.all(w[:, :, 0] == 0) and torch.all(out[:, :, 0] == 0)  # query 0 sees nothing


def test_fully_masked_rows_give_zero_weights_and_outputs_not_nan():
    q, k, v = _qkv(T_q=3, T_k=3)
    keep = torch.ones(3, 3, dtype=torch.bool)
    keep[1] = False
    additive = torch.zeros(3, 3)
    additive[1] = float("-inf")
    for mask in (keep, additive):
        for fn in (lambda *a: scaled_dot_product_attention(*a)[0], fused_attention):
            out = fn(q, k, v, mask)
            assert not out.isnan().any()
            assert torch.all(out[:, :, 1] == 0)
        _, w = scaled_dot_product_attention(q, k, v, mask)
        assert torch.all(w[:, :, 1] == 0) and not w.isnan().any()


def test_no_nan_gradient_through_fully_masked_rows():
    q, k, v = (t.requires_grad_() for t in _qkv(T_q=3, T_k=3))
    keep = torch.ones(3, 3, dtype=torch.bool)
    keep[0] = False
    out, _ = scaled_dot_product_attention(q, k, v, keep)
    out.sum().backward()
    assert all(not t.grad.isnan().any() for t in (q, k, v))


def test_scale_argument_reproduces_unscaled_attention():
    q = torch.tensor([[2.0, 1.0]])
    k = v = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    out, w = scaled_dot_product_attention(q, k, v, scale=1.0)
    torch.testing.assert_close(w[0], torch.softmax(torch.tensor([2.0, 1.0, 3.0]), 0))
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q[None], k[None], v[None], scale=1.0)[0])


def test_matches_nanogpt_listing():
    """001 App. A, Listing 5: nanoGPT's masked_fill / softmax attention."""
    q, k, v = _qkv(B=1, H=2, T_q=6, T_k=6)
    T = 6
    mask = torch.tril(torch.ones(T, T)).view(1, 1, T, T)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
    att = att.masked_fill(mask[:, :, :T, :T] == 0, float("-inf"))
    y = F.softmax(att, dim=-1) @ v
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v, causal=True)[0], y, atol=1e-6, rtol=1e-6)


@settings(max_examples=25, deadline=None)
@given(T_q=st.integers(1, 6), extra=st.integers(0, 4), causal=st.booleans(), seed=st.integers(0, 1000),
       use_mask=st.booleans())
def test_fused_path_agrees_with_reference(T_q, extra, causal, seed, use_mask):
    q, k, v = _qkv(B=1, H=2, T_q=T_q, T_k=T_q + extra, D=4, seed=seed)
    mask = None
    if use_mask:
        mask = torch.rand(T_q, T_q + extra, generator=torch.Generator().manual_seed(seed)) > 0.4
    ref, _ = scaled_dot_product_attention(q, k, v, mask, causal)
    torch.testing.assert_close(fused_attention(q, k, v, mask, causal), ref, atol=1e-6, rtol=1e-6)


def test_repeat_kv_matches_hugging_face():
    from transformers.models.llama.modeling_llama import repeat_kv as hf_repeat_kv
    x = torch.randn(2, 3, 4, 5)
    for n_rep in (1, 2, 4):
        assert torch.equal(repeat_kv(x, n_rep), hf_repeat_kv(x, n_rep))


@pytest.mark.parametrize("n_kv", [6, 2, 1])  # MHA, GQA, MQA
def test_gqa_matches_torch_enable_gqa(n_kv):
    q, _, _ = _qkv(H=6)
    _, k, v = _qkv(H=n_kv, seed=1)
    out, _ = scaled_dot_product_attention(q, repeat_kv(k, 6 // n_kv), repeat_kv(v, 6 // n_kv), causal=True)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])  # MHA, GQA, MQA
def test_module_matches_hugging_face_llama_attention(n_kv_heads):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding
    torch.manual_seed(0)
    hf_cfg = LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=n_kv_heads,
                         max_position_embeddings=64, attention_bias=False)
    hf_cfg._attn_implementation = "eager"
    hf = LlamaAttention(hf_cfg, layer_idx=0).eval()
    ours = MultiHeadAttention(AttentionConfig(d_model=32, n_heads=4, n_kv_heads=n_kv_heads))
    ours.load_state_dict(hf.state_dict())
    x = torch.randn(2, 7, 32)
    pos = torch.arange(7)[None].expand(2, 7)
    cos, sin = LlamaRotaryEmbedding(hf_cfg)(x, pos)
    hf_out, hf_w = hf(x, (cos, sin), attention_mask=torch.zeros(2, 1, 7, 7).masked_fill(~causal_mask(7), float("-inf")))
    inv_freq, af = rope_frequencies(8)
    our_cos, our_sin = rope_cos_sin(pos, inv_freq, af)
    for fast in (True, False):
        ours.config = AttentionConfig(d_model=32, n_heads=4, n_kv_heads=n_kv_heads, fast=fast)
        torch.testing.assert_close(ours(x, our_cos, our_sin), hf_out, atol=1e-6, rtol=1e-5)
    _, w = ours(x, our_cos, our_sin, need_weights=True)
    torch.testing.assert_close(w, hf_w, atol=1e-6, rtol=1e-5)


def test_project_then_attend_over_a_cache_equals_full_forward():
    torch.manual_seed(1)
    mha = MultiHeadAttention(AttentionConfig(d_model=16, n_heads=4, n_kv_heads=2))
    x = torch.randn(1, 6, 16)
    inv_freq, _ = rope_frequencies(4)
    cos, sin = rope_cos_sin(torch.arange(6), inv_freq)
    full = mha(x, cos, sin)
    q, k, v = mha.project(x, cos, sin)
    last = mha.attend(q[:, :, -1:], k, v)  # one new query over all six cached keys
    torch.testing.assert_close(last, full[:, -1:], atol=1e-6, rtol=1e-5)


def test_kv_values_per_token_shrink_with_fewer_kv_heads():
    sizes = [AttentionConfig(64, 8, n).kv_values_per_token for n in (8, 2, 1)]
    assert sizes == [2 * 8 * 8, 2 * 2 * 8, 2 * 1 * 8]


@pytest.mark.parametrize("kwargs,name", [(dict(d_model=30, n_heads=4), "d_model"),
                                          (dict(d_model=32, n_heads=4, n_kv_heads=3), "n_kv_heads"),
                                          (dict(d_model=32, n_heads=0), "n_heads"),
                                          (dict(d_model=32, n_heads=4, head_dim=0), "head_dim")])
def test_attention_config_rejects_bad_shapes(kwargs, name):
    with pytest.raises(ValueError, match=name):
        AttentionConfig(**kwargs)


def test_bad_inputs_raise_clear_errors():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="head dimension"):
        scaled_dot_product_attention(q, k[..., :4], v)
    with pytest.raises(ValueError, match="repeat_kv"):
        scaled_dot_product_attention(q, k[:, :2].expand(2, 2, 5, 8)[:, :2], v[:, :2])
    with pytest.raises(TypeError, match="mask"):
        scaled_dot_product_attention(q, k, v, torch.ones(5, 5, dtype=torch.int64))
    with pytest.raises(ValueError, match="n_rep"):
        repeat_kv(k, 0)
    with pytest.raises(ValueError, match="x must"):
        MultiHeadAttention(AttentionConfig(16, 4))(torch.randn(2, 3, 8))


@pytest.mark.parametrize("fn", [scaled_dot_product_attention, fused_attention], ids=["reference", "fused"])
def test_mixed_dtypes_raise_type_error_naming_q_k_v(fn):
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="q, k and v must share one dtype"):
        fn(q, k.bfloat16(), v)
    with pytest.raises(TypeError, match="v must be a floating-point tensor"):
        fn(q, k, v.long())


@pytest.mark.parametrize("fn", [scaled_dot_product_attention, fused_attention], ids=["reference", "fused"])
@pytest.mark.parametrize("shape", [(5, 4), (4, 5, 5), (2, 3, 5, 5, 1), (7, 1, 5, 5), (1, 2, 3, 5, 5)])
def test_a_mask_that_does_not_broadcast_to_the_scores_raises_value_error(fn, shape):
    q, k, v = _qkv()  # scores (2, 3, 5, 5)
    for mask in (torch.ones(shape, dtype=torch.bool), torch.zeros(shape)):
        with pytest.raises(ValueError, match=r"mask must broadcast to the scores' shape \(2, 3, 5, 5\)"):
            fn(q, k, v, mask)


def test_masks_that_broadcast_are_still_accepted():
    q, k, v = _qkv(T_q=4, T_k=6)
    for shape in [(6,), (4, 6), (1, 4, 6), (2, 1, 4, 6), (2, 3, 4, 1)]:
        mask = torch.ones(shape, dtype=torch.bool)
        torch.testing.assert_close(fused_attention(q, k, v, mask), scaled_dot_product_attention(q, k, v)[0],
                                   atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), "2"])
def test_a_non_finite_scale_raises(scale):
    with pytest.raises(ValueError, match="scale"):
        scaled_dot_product_attention(*_qkv(), scale=scale)


def test_the_module_passes_mask_errors_through():
    mha = MultiHeadAttention(AttentionConfig(16, 4))
    with pytest.raises(ValueError, match="mask must broadcast"):
        mha(torch.randn(2, 3, 16), mask=torch.ones(3, 4, dtype=torch.bool))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-5), (torch.bfloat16, 3e-2)])
def test_fused_attention_on_cuda_agrees_with_the_reference(dtype, tol):
    """PyTorch picks flash / memory-efficient kernels on CUDA; masks and dead rows must still match."""
    q, k, v = (t.cuda() for t in _qkv(B=2, H=4, T_q=6, T_k=9, D=64, seed=5))
    keep = torch.rand(2, 1, 6, 9, generator=torch.Generator().manual_seed(6)).cuda() > 0.3
    keep[0, 0, 2] = False  # one fully masked row
    for mask, causal in ((None, False), (None, True), (keep, False), (keep, True)):
        ref, _ = scaled_dot_product_attention(q, k, v, mask, causal)
        fast = fused_attention(q.to(dtype), k.to(dtype), v.to(dtype), mask, causal)
        assert not fast.isnan().any()
        torch.testing.assert_close(fast.float(), ref, atol=tol, rtol=tol)
    same_length = [t[:, :, :6] for t in (q, k, v)]
    ref, _ = scaled_dot_product_attention(*same_length, causal=True)
    torch.testing.assert_close(fused_attention(*(t.to(dtype) for t in same_length), causal=True).float(), ref,
                               atol=tol, rtol=tol)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"d_model": True, "n_heads": 1}, ValueError, "d_model must be a positive int"),
    ({"d_model": 8, "n_heads": 2, "head_dim": 2.5}, ValueError, "head_dim must be a positive int"),
    ({"d_model": 8, "n_heads": 2, "n_kv_heads": "1"}, ValueError, "n_kv_heads must be a positive"),
    ({"d_model": 8, "n_heads": 2, "n_kv_heads": 0}, ValueError, "n_kv_heads must be a positive"),
    ({"d_model": 8, "n_heads": 2, "fast": "no"}, TypeError, "fast must be a bool"),
])
def test_attention_config_names_a_bad_field(kwargs, error, match):
    with pytest.raises(error, match=match):
        AttentionConfig(**kwargs)


def test_attention_config_accepts_numpy_integers_as_ints():
    import numpy as np

    cfg = AttentionConfig(np.int64(8), np.int64(2), n_kv_heads=np.int32(1))
    assert cfg == AttentionConfig(8, 2, n_kv_heads=1) and type(cfg.d_model) is int
