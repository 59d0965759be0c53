"""Chapter 6 (the KV cache): what the smoke run of notebooks/06_kv_cache.ipynb must show."""

import pytest

NOTEBOOK = "06_kv_cache"
pytestmark = pytest.mark.notebook


def test_claims_disagree_only_where_the_errata_say(glue):
    assert glue["kv_cache_worked_disagreements"] == 1  # 004 §6.2.1: the cached step computes q_3, not q_4
    assert glue["kv_cache_cost_disagreements"] == 2  # 001: "O(t²) total" and "quadratic to linear" total
    assert glue["kv_cache_memory_disagreements"] == 1  # 001: "fixed-length representation"
    assert glue["kv_cache_disagreements"] == 4


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
