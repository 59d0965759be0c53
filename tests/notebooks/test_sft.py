"""Chapter 8 (notebooks/08_sft.ipynb) at scale=smoke: the claims it checks and what fine-tuning does."""

import pytest

NOTEBOOK = "08_sft"
pytestmark = pytest.mark.notebook


def test_only_the_learning_rate_claim_disagrees(glue):
    assert glue["sft_lr_disagreements"] == 1  # 000 §5.7's 1e-5…1e-6 is far too small for these models
    assert glue["sft_disagreements"] == 1
    assert glue["sft_lr_loss_at_1e-5"] > glue["sft_lr_loss_at_best"] + 0.5


def test_sft_models_answer_heldout_prompts_well_above_chance(glue):
    assert glue["sft_kb_walk_clean_em_greedy"] > 0.3  # chance: about (1/24)^hops
    assert glue["sft_arithmetic_clean_em_greedy"] > 0.1  # chance: about 0.01


def test_greedy_exact_match_is_the_teacher_forced_all_correct_rate(glue):
    assert glue["sft_greedy_vs_teacher_forced_gap"] <= 0.02


def test_accuracy_falls_with_answer_length(glue):
    for task in ("kb_walk", "arithmetic"):
        em = glue[f"sft_{task}_em_by_length"]
        assert em[0] > em[-1]
        assert 0 < glue[f"sft_{task}_eps_fit"] < 1 and 0 < glue[f"sft_{task}_eps_tf"] < 1


def test_kb_walk_answers_chains_it_can_know_far_better_than_the_others(glue):
    known, other = glue["sft_kb_walk_em_greedy_knowable_by_length"], glue["sft_kb_walk_em_greedy_other_by_length"]
    share = glue["sft_kb_walk_knowable_by_length"]
    assert all(0 < s < 1 for s in share)  # held-out chains of every length include both kinds
    assert all(k > o + 0.3 for k, o in zip(known, other))


def test_free_running_mistakes_stay_within_the_quadratic_bound(glue):
    assert glue["sft_regret_within_bound"] is True
    for task in ("kb_walk", "arithmetic"):
        cost = glue[f"sft_{task}_mistakes_by_length"]
        assert cost[-1] > cost[0]


def test_only_the_backspace_model_recovers_from_a_forced_error(glue):
    assert glue["sft_kb_walk_clean_recovery"] == 0.0 == glue["sft_arithmetic_clean_recovery"]
    assert glue["sft_kb_walk_scheduled_recovery"] == 0.0
    assert glue["sft_kb_walk_backspace_recovery"] > 0.0


def test_completion_only_loss_falls_with_sft(glue):
    for task in ("kb_walk", "arithmetic"):
        assert glue[f"sft_{task}_sft_completion_loss"] < 0.5 * glue[f"sft_{task}_pre_completion_loss"]
