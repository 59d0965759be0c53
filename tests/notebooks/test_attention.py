"""Chapter 4 (attention): what the smoke run of notebooks/04_attention.ipynb must show."""

import math

import pytest

NOTEBOOK = "04_attention"
pytestmark = pytest.mark.notebook


def test_worked_examples_disagree_only_where_the_errata_say(glue):
    assert glue["attention_worked_disagreements"] == 3  # 004 §5.1: α_t1, α_t3, c_t[2]
    assert glue["attention_toy_disagreements"] == 1  # 001 App. A: the example omits eq. (14)'s 1/√d_h
    assert glue["attention_listing_disagreements"] == 1  # 002: the causal-mask usage leaves out 1/√d_k
    assert glue["attention_multihead_disagreements"] == 2  # 004 §5.1.1: Q, K, V "n × d_model"; §5.1.3: √d_k for √d'_k
    assert glue["attention_scale_disagreements"] == 2  # "head size" for √(head size); "bigger τ: sharper"
    assert glue["attention_equivariance_disagreements"] == 1  # "invariant" for equivariant
    assert glue["attention_kv_disagreements"] == 0
    assert glue["attention_bilinear_disagreements"] == 2  # 001 Remark 3: the masked triangle; W_O's side
    assert glue["attention_encdec_disagreements"] == 2  # 004 §8.1.2: `tgt +=` on the caller's tensor; no target mask
    assert glue["attention_disagreements"] == 14


def test_causal_mask_stops_later_tokens_changing_earlier_outputs(glue):
    assert glue["attention_causal_leak"] == 0.0
    assert glue["attention_bidirectional_leak"] > 1e-3


def test_scaling_keeps_score_variance_near_one_and_softmax_gradients_alive(glue):
    assert 0.8 < glue["attention_score_var_scaled_1024"] < 1.25
    assert 800 < glue["attention_score_var_unscaled_1024"] < 1300
    assert glue["attention_jacobian_ratio_1024"] > 3


def test_identical_tokens_are_told_apart_only_with_positions(glue):
    assert glue["attention_dogs_identical_without_positions"] is True
    assert glue["attention_dogs_identical_with_rope"] is False


def test_kv_memory_and_explorer(glue):
    assert glue["attention_kv_mha_over_mqa"] == 32.0
    assert glue["attention_heatmap_frames"] >= 4  # layers × heads of the trained model


def test_heatmap_weights_come_from_the_lab_model(glue):
    assert glue["attention_twin_logit_gap"] < 1e-4  # its Hugging Face twin gives the same logits


def test_a_head_is_a_bilinear_form_of_rank_at_most_d_h_and_the_column_mask_must_be_the_lower_triangle(glue):
    assert glue["attention_bilinear_ranks"] == [4, 4, 4, 4]
    assert glue["attention_bilinear_leak"]["lower"] == 0.0
    assert glue["attention_bilinear_leak"]["upper"] > 1e-3


def test_004s_decoder_leaks_the_future_and_cross_attention_is_pytorchs(glue):
    assert glue["attention_encdec_leak"] > 1e-6
    assert glue["attention_encdec_cross_gap"] < 1e-12


def test_exercise_solutions_attention(glue):
    margin, weight = glue["attention_ex_margin"]
    assert margin == pytest.approx(math.log(0.99 * 7 / 0.01)) and weight == pytest.approx(0.99, abs=1e-12)
    sym, asym = glue["attention_ex_asymmetry"]
    assert sym < 1e-12 and asym > 1e-3
    assert glue["attention_ex_rank_of_sums"] == [4, 8, 12, 16]


def test_a_trained_head_is_far_from_an_even_spread(glue):
    # the most specialised head of the arithmetic model (a random-init head is close to 1)
    assert glue["attention_head_pattern_over_even"] > 1.5
    assert glue["attention_head_pattern_problems"] == 32  # distinct held-out problems at smoke scale
