"""Tests of halluc_lab.model.positional: HF RoPE oracles, the two RoPE layouts, sinusoidal identities, YaRN variants."""

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from halluc_lab.model import positional as pos
from halluc_lab.model.positional import (RopeScaling, apply_rope, apply_rope_interleaved, half_to_interleaved,
                                   interleaved_to_half, ntk_aware_base, rope_cos_sin, rope_frequencies,
                                   rotation_matrix, sinusoidal_encoding, sinusoidal_shift_matrix, usage_ratio,
                                   wavelength, yarn_attention_factor, yarn_document_inv_freq, yarn_paper_inv_freq,
                                   yarn_ramp)


def _hf(head_dim=16, base=10000.0, rope=None, max_pos=64):
    from transformers import LlamaConfig
    params = {"rope_type": "default", "rope_theta": base, **(rope or {})}
    return LlamaConfig(hidden_size=head_dim * 2, num_attention_heads=2, head_dim=head_dim,
                       max_position_embeddings=max_pos, rope_parameters=params)


def _hf_init(config):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    kind = config.rope_parameters["rope_type"]
    fn = LlamaRotaryEmbedding.compute_default_rope_parameters if kind == "default" else ROPE_INIT_FUNCTIONS[kind]
    return fn(config)


@pytest.mark.parametrize("head_dim,base", [(16, 10000.0), (64, 10000.0), (128, 500000.0)])
def test_default_frequencies_equal_hugging_face(head_dim, base):
    inv_freq, af = rope_frequencies(head_dim, base)
    hf_inv, hf_af = _hf_init(_hf(head_dim, base))
    assert torch.equal(inv_freq, hf_inv) and af == hf_af == 1.0


@pytest.mark.parametrize("factor", [2.0, 4.0, 8.0])
def test_linear_scaling_equals_hugging_face_linear(factor):
    inv_freq, af = rope_frequencies(32, scaling=RopeScaling("linear", factor))
    hf_inv, hf_af = _hf_init(_hf(32, rope={"rope_type": "linear", "factor": factor}))
    assert torch.equal(inv_freq, hf_inv) and af == hf_af


@pytest.mark.parametrize("factor", [2.0, 4.0])
def test_ntk_equals_hugging_face_dynamic_at_the_length_where_its_factor_is_s(factor):
    """HF's dynamic NTK uses base·(f·T/L − (f−1))^{D/(D−2)}; with f = s that is s when T = L(2s−1)/s."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    L = 64
    T = int(L * (2 * factor - 1) / factor)
    config = _hf(32, rope={"rope_type": "dynamic", "factor": factor}, max_pos=L)
    hf_inv, _ = ROPE_INIT_FUNCTIONS["dynamic"](config, seq_len=T)
    inv_freq, af = rope_frequencies(32, scaling=RopeScaling("ntk", factor))
    torch.testing.assert_close(inv_freq, hf_inv, rtol=1e-6, atol=0)
    assert af == 1.0


def test_ntk_leaves_the_highest_frequency_and_divides_the_lowest_by_s():
    base_inv, _ = rope_frequencies(32)
    ntk_inv, _ = rope_frequencies(32, scaling=RopeScaling("ntk", 4.0))
    assert ntk_inv[0] == base_inv[0]
    torch.testing.assert_close(ntk_inv[-1], base_inv[-1] / 4, rtol=1e-6, atol=0)
    assert ntk_aware_base(10000.0, 4.0, 32) == pytest.approx(10000 * 4 ** (32 / 30))


@pytest.mark.parametrize("head_dim,factor,L,truncate", [(64, 4.0, 256, True), (32, 8.0, 128, True),
                                                         (128, 2.0, 4096, True), (64, 4.0, 256, False)])
def test_yarn_equals_hugging_face_yarn(head_dim, factor, L, truncate):
    rope = {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": L, "truncate": truncate}
    hf_inv, hf_af = _hf_init(_hf(head_dim, rope=rope, max_pos=int(L * factor)))
    inv_freq, af = rope_frequencies(head_dim, scaling=RopeScaling("yarn", factor, L, truncate=truncate))
    torch.testing.assert_close(inv_freq, hf_inv, rtol=1e-6, atol=0)
    assert af == pytest.approx(hf_af) == pytest.approx(0.1 * math.log(factor) + 1)


def test_yarn_keeps_fast_planes_and_interpolates_slow_ones():
    base_inv, _ = rope_frequencies(64)
    inv, _ = rope_frequencies(64, scaling=RopeScaling("yarn", 4.0, 256))
    r = usage_ratio(base_inv, 256)
    torch.testing.assert_close(inv[r > 32], base_inv[r > 32])
    torch.testing.assert_close(inv[r < 1], base_inv[r < 1] / 4)


def test_yarn_temperature_formula_and_its_effect_on_logits():
    assert yarn_attention_factor(1.0) == 1.0
    assert yarn_attention_factor(math.e) == pytest.approx(1.1)
    inv_freq, af = rope_frequencies(8, scaling=RopeScaling("yarn", 16.0, 64))
    cos, sin = rope_cos_sin(torch.arange(5), inv_freq, af)
    plain_cos, plain_sin = rope_cos_sin(torch.arange(5), inv_freq)
    q, k = torch.randn(1, 1, 5, 8), torch.randn(1, 1, 5, 8)
    scaled = apply_rope(q, cos, sin) @ apply_rope(k, cos, sin).transpose(-1, -2)
    plain = apply_rope(q, plain_cos, plain_sin) @ apply_rope(k, plain_cos, plain_sin).transpose(-1, -2)
    torch.testing.assert_close(scaled, plain * af**2, rtol=1e-5, atol=1e-5)  # 1/t = (√(1/t))²


def test_paper_and_hugging_face_yarn_agree_outside_the_ramp_and_differ_inside():
    """Pins both: the paper's γ is linear in r, HF's ramp is linear in the plane index (log r)."""
    base_inv, _ = rope_frequencies(64)
    hf, _ = rope_frequencies(64, scaling=RopeScaling("yarn", 4.0, 256, truncate=False))
    paper = yarn_paper_inv_freq(base_inv, 4.0, 256)
    r = usage_ratio(base_inv, 256)
    outside = (r <= 1) | (r >= 32)
    torch.testing.assert_close(hf[outside], paper[outside], rtol=1e-6, atol=0)
    assert (hf[~outside] - paper[~outside]).abs().max() > 1e-3 * base_inv[~outside].min()


def test_document_yarn_is_the_paper_reversed():
    """004 §7.6.1 as printed keeps slow planes and scales fast ones: the opposite of the YaRN paper."""
    base_inv, _ = rope_frequencies(64)
    doc = yarn_document_inv_freq(base_inv, 4.0, 256)
    r = usage_ratio(base_inv, 256)
    torch.testing.assert_close(doc[r < 1], base_inv[r < 1])  # slow planes untouched
    torch.testing.assert_close(doc[r > 32], base_inv[r > 32] / 4)  # fast planes scaled by 1/s
    g = yarn_ramp(r)
    torch.testing.assert_close(doc, base_inv * (1 - g) + base_inv / 4 * g)


def test_yarn_ramp_endpoints():
    assert yarn_ramp(torch.tensor([0.5, 1.0, 16.5, 32.0, 40.0])).tolist() == [0.0, 0.0, 0.5, 1.0, 1.0]


def test_rope_cos_sin_and_apply_rope_equal_hugging_face():
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb
    config = _hf(16, rope={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}, max_pos=128)
    x = torch.randn(2, 3, 10, 16)
    pos = torch.tensor([list(range(10)), list(range(5, 15))])
    hf_cos, hf_sin = LlamaRotaryEmbedding(config)(x, pos)
    inv_freq, af = rope_frequencies(16, scaling=RopeScaling("yarn", 4.0, 32))
    cos, sin = rope_cos_sin(pos, inv_freq, af)
    assert torch.equal(cos, hf_cos) and torch.equal(sin, hf_sin)
    hf_q, _ = apply_rotary_pos_emb(x, x, hf_cos, hf_sin)
    assert torch.equal(apply_rope(x, cos, sin), hf_q)


def test_interleaved_form_equals_the_documents_block_rotation_matrix():
    inv_freq, _ = rope_frequencies(8)
    x = torch.randn(6, 8, dtype=torch.float64)
    cos, sin = rope_cos_sin(torch.arange(6), inv_freq.double())
    rotated = apply_rope_interleaved(x, cos, sin)
    for m in range(6):
        R = rotation_matrix(m * inv_freq.double())  # R_{Θ,m}, 001 App. A
        torch.testing.assert_close(rotated[m], R @ x[m])


@settings(max_examples=20, deadline=None)
@given(D=st.sampled_from([2, 4, 8, 16]), seed=st.integers(0, 10_000))
def test_interleaved_and_rotate_half_are_the_same_rotation_up_to_a_permutation(D, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, 2, 5, D, generator=g, dtype=torch.float64)
    inv_freq, _ = rope_frequencies(D)
    cos, sin = rope_cos_sin(torch.arange(5), inv_freq.double())
    half = apply_rope(interleaved_to_half(x), cos, sin)
    torch.testing.assert_close(half, interleaved_to_half(apply_rope_interleaved(x, cos, sin)))
    assert torch.equal(half_to_interleaved(interleaved_to_half(x)), x)


@settings(max_examples=20, deadline=None)
@given(m=st.integers(0, 500), n=st.integers(0, 500), shift=st.integers(0, 500), seed=st.integers(0, 10_000))
def test_rope_score_depends_only_on_the_offset(m, n, shift, seed):
    """⟨R_m q, R_n k⟩ = ⟨R_{m+c} q, R_{n+c} k⟩ (004 §7.3, 001 App. A: R_tᵀ R_s = R_{s−t})."""
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, 16, generator=g, dtype=torch.float64)
    inv_freq = rope_frequencies(16)[0].double()

    def score(a, b):
        cos, sin = rope_cos_sin(torch.tensor([a, b]), inv_freq)  # float64, as inv_freq
        return apply_rope(q[None], cos[:1], sin[:1]) @ apply_rope(k[None], cos[1:], sin[1:]).T

    torch.testing.assert_close(score(m, n), score(m + shift, n + shift), rtol=1e-9, atol=1e-9)


def test_sinusoidal_worked_example_of_004():
    pe = sinusoidal_encoding(torch.tensor([0, 1]), 4, dtype=torch.float64)
    assert pe[0].tolist() == [0.0, 1.0, 0.0, 1.0]
    torch.testing.assert_close(pe[1], torch.tensor([math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)],
                                                   dtype=torch.float64))


@settings(max_examples=20, deadline=None)
@given(p=st.integers(0, 1000), k=st.integers(-200, 200))
def test_sinusoidal_shift_is_a_rotation(p, k):
    pe = sinusoidal_encoding(torch.tensor([p, p + k]), 16, dtype=torch.float64)
    torch.testing.assert_close(sinusoidal_shift_matrix(k, 16) @ pe[0], pe[1], rtol=1e-9, atol=1e-9)


def test_the_printed_shift_matrix_of_004_rotates_the_wrong_way():
    omega = math.pi / 4  # 004 §7.2.2's example: period 8, p = 2, k = 3
    pair = torch.tensor([math.sin(2 * omega), math.cos(2 * omega)], dtype=torch.float64)
    printed = rotation_matrix(torch.tensor([3 * omega], dtype=torch.float64)) @ pair
    truth = torch.tensor([math.sin(5 * omega), math.cos(5 * omega)], dtype=torch.float64)
    assert not torch.allclose(printed, truth)
    correct = rotation_matrix(torch.tensor([-3 * omega], dtype=torch.float64)) @ pair
    torch.testing.assert_close(correct, truth)


def test_wavelength_and_usage_ratio():
    inv_freq = torch.tensor([1.0, 0.01])
    torch.testing.assert_close(wavelength(inv_freq), torch.tensor([2 * math.pi, 200 * math.pi]))
    torch.testing.assert_close(usage_ratio(inv_freq, 100), torch.tensor([100 / (2 * math.pi), 1 / (2 * math.pi)]))


@pytest.mark.parametrize("call,name", [
    (lambda: rope_frequencies(7), "head_dim"),
    (lambda: rope_frequencies(8, base=1.0), "base"),
    (lambda: RopeScaling("linear", 0.5), "factor"),
    (lambda: RopeScaling("none", 2.0), "factor"),
    (lambda: RopeScaling("yarn", 2.0), "original_max_positions"),
    (lambda: RopeScaling("rope3", 2.0), "kind"),
    (lambda: RopeScaling("yarn", 2.0, 64, beta_fast=1.0, beta_slow=2.0), "beta_slow"),
    (lambda: rope_cos_sin(torch.tensor([0.5, 1.5]), torch.ones(4)), "positions"),
    (lambda: rope_cos_sin(torch.arange(3), torch.ones(2, 2)), "inv_freq"),
    (lambda: sinusoidal_encoding(torch.arange(3), 5), "d_model"),
    (lambda: apply_rope(torch.randn(1, 1, 3, 5), torch.ones(3, 5), torch.ones(3, 5)), "even"),
    (lambda: apply_rope(torch.randn(1, 1, 3, 4), torch.ones(3, 6), torch.ones(3, 6)), "cos and sin"),
])
def test_bad_input_raises_value_error_naming_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("call,name", [
    (lambda: RopeScaling("linear", INF), "factor"),
    (lambda: RopeScaling("linear", NAN), "factor"),
    (lambda: RopeScaling("yarn", 2.0, 64, beta_fast=INF), "beta_fast"),
    (lambda: RopeScaling("yarn", 2.0, 64, beta_slow=NAN), "beta_slow"),
    (lambda: RopeScaling("yarn", 2.0, 64, attention_factor=INF), "attention_factor"),
    (lambda: RopeScaling("yarn", 2.0, 64, attention_factor=NAN), "attention_factor"),
    (lambda: RopeScaling("linear", 2.0, original_max_positions=0), "original_max_positions"),
    (lambda: rope_frequencies(8, base=INF), "base"),
    (lambda: rope_frequencies(8, base=NAN), "base"),
    (lambda: sinusoidal_encoding(torch.arange(3), 4, base=INF), "base"),
    (lambda: ntk_aware_base(10000.0, -2.0, 8), "factor"),
    (lambda: ntk_aware_base(10000.0, 0.5, 8), "factor"),
    (lambda: ntk_aware_base(10000.0, INF, 8), "factor"),
    (lambda: ntk_aware_base(-1.0, 2.0, 8), "base"),
    (lambda: yarn_attention_factor(NAN), "factor"),
    (lambda: yarn_attention_factor(-1.0), "factor"),
    (lambda: yarn_ramp(torch.ones(3), 1.0, INF), "beta"),
    (lambda: yarn_paper_inv_freq(torch.ones(3), NAN, 64), "factor"),
])
def test_non_finite_and_out_of_range_floats_raise_value_error_naming_the_argument(call, name):
    with pytest.raises(ValueError, match=f"{name} must be"):
        call()


@pytest.mark.parametrize("call,name", [
    (lambda: RopeScaling("linear", "2"), "factor"),
    (lambda: RopeScaling("yarn", 2.0, 64, truncate=1), "truncate"),
    (lambda: rope_frequencies(8, base="10000"), "base"),
    (lambda: ntk_aware_base(10000.0, None, 8), "factor"),
])
def test_arguments_of_the_wrong_type_raise_type_error_naming_them(call, name):
    with pytest.raises(TypeError, match=name):
        call()


def test_the_ntk_base_of_a_valid_factor_is_a_real_number():
    assert isinstance(ntk_aware_base(10000.0, 1.0, 8), float) and ntk_aware_base(10000.0, 1.0, 8) == 10000.0


def test_scaling_variants_via_replace():
    s = RopeScaling("yarn", 4.0, 256)
    assert dataclasses.replace(s, kind="linear").factor == 4.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.factor = 2.0  # type: ignore[misc]


@pytest.mark.gpu
def test_rope_on_cuda_equals_hugging_face_on_cuda():
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb
    config = _hf(64, rope={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}, max_pos=1024)
    x = torch.randn(2, 4, 1024, 64, device="cuda")
    pos = torch.arange(1024, device="cuda")[None].expand(2, -1)
    hf_cos, hf_sin = LlamaRotaryEmbedding(config).cuda()(x, pos)
    inv_freq, af = rope_frequencies(64, scaling=RopeScaling("yarn", 4.0, 256))
    cos, sin = rope_cos_sin(pos, inv_freq.cuda(), af)
    torch.testing.assert_close(cos, hf_cos, atol=1e-6, rtol=0)
    torch.testing.assert_close(sin, hf_sin, atol=1e-6, rtol=0)
    hf_q, _ = apply_rotary_pos_emb(x, x, hf_cos, hf_sin)
    torch.testing.assert_close(apply_rope(x, cos, sin), hf_q, atol=1e-5, rtol=0)


# ------------------------------------------------------------ RoPE as a bilinear form (001 App. A)

def _head(seed: int, d: int = 12, d_h: int = 6, T: int = 5):
    g = torch.Generator().manual_seed(seed)
    H = torch.randn(d, T, generator=g, dtype=torch.float64)  # h_1 … h_T as columns
    W_Q, W_K, W_V = (torch.randn(d_h, d, generator=g, dtype=torch.float64) for _ in range(3))
    return H, W_Q, W_K, W_V, pos.sinusoidal_frequencies(d_h)


@pytest.mark.parametrize("seed", [0, 1])
def test_rope_head_scores_match_complex_rotation_and_the_bilinear_form(seed):
    H, W_Q, W_K, _, theta = _head(seed)
    q, k = W_Q @ H, W_K @ H  # (d_h, T)
    t = torch.arange(H.shape[1], dtype=torch.float64)
    angle = theta[:, None] * t  # (d_h/2, T)
    turn = torch.polar(torch.ones_like(angle), angle)  # e^{i t θ}
    zq, zk = torch.complex(q[0::2], q[1::2]) * turn, torch.complex(k[0::2], k[1::2]) * turn
    oracle = (zq.T[:, None, :] * zk.T[None, :, :].conj()).real.sum(-1) / math.sqrt(W_Q.shape[0])
    torch.testing.assert_close(pos.rope_head_scores(H, W_Q, W_K, theta), oracle, rtol=0, atol=1e-12)
    form = pos.rope_bilinear_scores(H, W_Q, W_K, theta)
    torch.testing.assert_close(form, oracle, rtol=0, atol=1e-12)
    assert pos.rotation_composition_error(theta, 7) < 1e-12


def test_rope_column_head_is_causal_only_with_the_lower_triangle_masked():
    H, W_Q, W_K, W_V, theta = _head(2)
    later = H.clone()
    later[:, -1] += 1.0  # only the last token changes
    leak = {tri: float((pos.rope_column_head(later, W_Q, W_K, W_V, theta, tri)[:, 0]
                        - pos.rope_column_head(H, W_Q, W_K, W_V, theta, tri)[:, 0]).abs().max())
            for tri in ("upper", "lower")}
    assert leak["lower"] == 0.0 and leak["upper"] > 1e-3
    out = pos.rope_column_head(H, W_Q, W_K, W_V, theta, "lower")
    torch.testing.assert_close(out[:, 0], W_V @ H[:, 0])  # token 1 attends to itself alone
    with pytest.raises(ValueError, match="masked_triangle"):
        pos.rope_column_head(H, W_Q, W_K, W_V, theta, "both")
