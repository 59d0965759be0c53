"""Chapter 6 (the KV cache): what the smoke run of notebooks/06_kv_cache.ipynb must show."""

import math
from fractions import Fraction

import pytest

NOTEBOOK = "06_kv_cache"
pytestmark = pytest.mark.notebook


def test_claims_disagree_only_where_the_errata_say(glue):
    assert glue["kv_cache_worked_disagreements"] == 1  # 004 §6.2.1: the cached step computes q_3, not q_4
    assert glue["kv_cache_cost_disagreements"] == 2  # 001: "O(t²) total" and "quadratic to linear" total
    assert glue["kv_cache_memory_disagreements"] == 1  # 001: "fixed-length representation"
    # 002's cached loop: it feeds new_token before sampling one; under either reading of its helpers the cache
    # does not hold the sequence (two rows each) and the tokens part from the uncached loop's
    assert glue["kv_cache_listing_002_disagreements"] == 5
    assert glue["kv_cache_disagreements"] == 9


def test_past_keys_and_values_do_not_change_when_tokens_arrive(glue):
    assert glue["kv_cache_past_kv_change"] < 1e-12


def test_hand_computed_steps_reproduce_the_models_attention(glue):
    assert glue["kv_cache_trace_max_diff"] < 1e-10
    assert glue["kv_cache_trace_frames"] == 10


def test_counted_work_has_the_exponents_of_the_documents(glue):
    assert glue["kv_cache_pairs_exponent_uncached"] == pytest.approx(3.0, abs=0.05)
    assert glue["kv_cache_pairs_exponent_cached"] == pytest.approx(2.0, abs=0.05)
    assert glue["kv_cache_bytes_exponent_length"] == 1.0


def test_timed_contexts_are_counted_between_the_dense_and_attention_exponents(glue):
    # The latency figure sets measured slopes beside these counted ones (smoke: t = 128…512 for the
    # 2-layer, width-64 timing model): dense work alone gives 1, attention alone 2 (uncached) or 1 (cached).
    assert 1.0 < glue["kv_cache_latency_count_exponent_uncached"] < 2.0
    assert 0.0 < glue["kv_cache_latency_count_exponent_cached"] < 1.0
    assert 1.0 < glue["kv_cache_total_count_exponent_cached"] < glue["kv_cache_total_count_exponent_uncached"] < 3.0


def test_decoding_moves_about_a_byte_per_flop(glue):
    assert 0.5 < glue["kv_cache_decode_intensity_b1"] < 2.0


def test_engine_gives_the_uncached_loops_tokens(glue):
    assert glue["kv_cache_engine_matches_uncached"] is True


# -- the two timing models --------------------------------------------------------------------------------------------
# Smoke scale: contexts 16…512; the tiny model (V 256, d 64, L 2, 4 heads, 2 KV heads, float32) and the large model's
# CPU stand-in (V 512, d 256, L 4, 8 heads, 2 KV heads, float32). Timings are checked for shape and consistency, never
# against thresholds.
TIMED = {"kv_cache_": {"V": 256, "d": 64, "L": 2, "H": 4, "H_kv": 2},
         "kv_cache_large_": {"V": 512, "d": 256, "L": 4, "H": 8, "H_kv": 2}}


def n_params(V, d, L, H, H_kv, I=None):
    """Weights of the lab's untied decoder: per layer q, k, v, o, gate/up/down and two norms; final norm, embedding, head."""
    D, I = d // H, I or 4 * d
    return L * (d * (H + 2 * H_kv) * D + H * D * d + 3 * d * I + 2 * d) + d + 2 * V * d


def positive_finite(values):
    return all(isinstance(x, float) and math.isfinite(x) and x > 0 for x in values)


def test_both_timing_models_are_timed_three_ways_at_every_context(glue):
    contexts = glue["kv_cache_latency_contexts"]
    assert contexts == [16, 32, 64, 128, 256, 512]
    for prefix in TIMED:
        uncached, eager, cached = glue[prefix + "latency_ms"]
        assert len(uncached) == len(eager) == len(cached) == len(contexts)
        assert positive_finite(uncached + eager + cached)
        assert glue[prefix + "latency_speedup_longest"] == pytest.approx(uncached[-1] / cached[-1], rel=1e-12)
        assert glue[prefix + "latency_cache_only_speedup_longest"] == pytest.approx(uncached[-1] / eager[-1], rel=1e-12)
        if not glue["kv_cache_timing_graphs"]:  # on a CPU the engine's step is the eager one, measured once
            assert eager == cached


def test_large_timing_model_has_the_stated_shape_and_far_more_parameters(glue):
    tiny, large = glue["kv_cache_timing_params"]
    assert tiny == n_params(**TIMED["kv_cache_"]) == 155_968
    assert large == n_params(**TIMED["kv_cache_large_"]) == 4_065_536
    assert large > 25 * tiny
    # The large model's counted exponents sit between dense work alone and attention alone, as the tiny model's do.
    assert 1.0 < glue["kv_cache_large_latency_count_exponent_uncached"] < 2.0
    assert 0.0 < glue["kv_cache_large_latency_count_exponent_cached"] < 1.0
    assert 1.0 < glue["kv_cache_large_total_count_exponent_cached"] < glue["kv_cache_large_total_count_exponent_uncached"] < 3.0


def test_totals_split_into_the_caches_share_and_the_graphs(glue):
    for prefix in TIMED:
        lengths = glue[prefix + "total_lengths"]
        assert len(lengths) >= 3 and lengths == [32 * 2**i for i in range(len(lengths))] and lengths[-1] <= 256
        uncached, eager, cached = glue[prefix + "totals_s"]
        assert len(uncached) == len(eager) == len(cached) == len(lengths)
        assert positive_finite(uncached + eager + cached)
        cache, graph, ratio = (glue[prefix + name] for name in ("total_cache_share", "total_graph_share", "total_ratio"))
        for i in range(len(lengths)):
            assert cache[i] == pytest.approx(uncached[i] / eager[i], rel=1e-12)
            assert graph[i] == pytest.approx(eager[i] / cached[i], rel=1e-12)
            assert ratio[i] == pytest.approx(uncached[i] / cached[i], rel=1e-12)
            assert cache[i] * graph[i] == pytest.approx(ratio[i], rel=1e-12)
        if not glue["kv_cache_timing_graphs"]:  # no graph on a CPU: its share is exactly 1
            assert graph == [1.0] * len(lengths) and eager == cached
        assert math.isfinite(glue[prefix + "total_predicted_exponent_uncached"])


def test_hardware_rates_are_the_counted_work_over_the_measured_time(glue):
    for prefix, s in TIMED.items():
        D, b = s["d"] // s["H"], 4  # float32 on the CPU
        weights_read = n_params(**s) - s["V"] * s["d"] + s["d"]  # all but the embedding table; one embedding row
        kv = (16 + 1) * 2 * s["L"] * s["H_kv"] * D * b  # t = 16: the cache read, and the new token written
        assert glue[prefix + "cached_step_bytes"] == weights_read * b + kv
        cached_ms = glue[prefix + "latency_ms"][2][0]
        assert glue[prefix + "cached_step_bytes_per_s"] == pytest.approx(glue[prefix + "cached_step_bytes"] / (cached_ms / 1e3))
        assert glue[prefix + "uncached_flops_per_s"] > 0
        if not glue["kv_cache_timing_graphs"]:  # no datasheet fractions claimed for a CPU
            assert prefix + "bandwidth_fraction" not in glue and prefix + "peak_fraction" not in glue


def test_batch_step_times_are_measured_for_both_models(glue):
    for prefix in TIMED:
        assert len(glue[prefix + "step_ms_by_batch"]) == 4 and positive_finite(glue[prefix + "step_ms_by_batch"])
        assert math.isfinite(glue[prefix + "step_time_exponent_batch"])


# -- the exercises' solutions -----------------------------------------------------------------------------------------
def test_exercise_solutions_attention_overtakes_dense_work_just_past_the_closed_form(glue):
    widths, by_search, by_formula = glue["kv_cache_ex_attention_crossover"]
    shapes = [{"d": d, "H": d // 64, "H_kv": d // 256, "I": 4 * d, "V": 512, "L": 16} for d in widths]
    shapes.append({"d": 4096, "H": 32, "H_kv": 32, "I": 11008, "V": 32000, "L": 32})  # Llama-2-7B's shape
    for s, t, f in zip(shapes, by_search, by_formula, strict=True):
        exact = Fraction(s["d"]) * (1 + Fraction(s["H_kv"], s["H"])) + Fraction(3 * s["I"], 2) + Fraction(s["V"], 2 * s["L"])
        assert f == pytest.approx(float(exact), rel=1e-12)
        assert t == math.floor(exact) + 1  # the first context whose attention FLOPs exceed (strictly) the dense ones
    assert by_search[widths.index(4096)] == 29_713 and by_search[-1] == 25_205


def test_exercise_solutions_cache_outweighs_weights_past_params_over_kv_bytes(glue):
    kv_heads, params, token_bytes, even = glue["kv_cache_ex_cache_vs_weights"]
    assert kv_heads == [16, 4, 1]
    for h, n, b, e in zip(kv_heads, params, token_bytes, even, strict=True):
        assert n == n_params(V=512, d=2048, L=16, H=16, H_kv=h)
        assert b == 2 * 16 * h * 128 * 2  # keys and values, 16 layers, head dim 128, bf16
        assert e == pytest.approx(2 * n / b, rel=1e-12)
    assert params[1] == 975_243_264 and 8 * 8192 > even[1]  # the GQA model's 8 × 8,192-token cache outweighs it


def test_exercise_solutions_batch_reaches_the_ridge_only_at_short_contexts(glue):
    contexts, batches, limits, attention = glue["kv_cache_ex_ridge_batch"]
    L, d, H, H_kv, I, V, b = 16, 2048, 16, 4, 8192, 512, 2
    D, ridge = d // H, 989e12 / 3.35e12
    W = (L * (d * (H + 2 * H_kv) * D + H * D * d + 3 * d * I + 2 * d) + d + V * d) * b  # weights, no embedding rows
    for t, B, lim, a in zip(contexts, batches, limits, attention, strict=True):
        F = L * 2 * d * ((H + 2 * H_kv) * D + H * D + 3 * I) + 2 * d * V + 4 * L * H * D * t  # one row's FLOPs
        K = (t + 1) * 2 * L * H_kv * D * b + d * b  # one row's cache read and write, and its embedding row
        assert lim == pytest.approx(F / K, rel=1e-12)
        assert B == (math.ceil(ridge * W / (F - ridge * K)) if F > ridge * K else None)
        assert a == pytest.approx(H * t / (H_kv * (t + 1)), rel=1e-12) and a < H / H_kv
    assert batches[0] is not None and batches[-1] is None


def test_exercise_solutions_a_shared_prompt_saves_g_minus_one_prompt_copies(glue):
    groups, saving, limit = glue["kv_cache_ex_prefix_saving"]
    P, n = 256, 64
    for G, s in zip(groups, saving, strict=True):
        assert s == pytest.approx((G - 1) * P / (G * (P + n)), rel=1e-12)
    assert limit == pytest.approx(P / (P + n)) and saving == sorted(saving) and saving[-1] < limit
    assert glue["kv_cache_ex_prompt_copies_identical"] is True
