"""Chapter 7 (notebooks/07_pretraining.ipynb) at scale=smoke: the claims it checks and what its models learn."""

import pytest

NOTEBOOK = "07_pretraining"
pytestmark = pytest.mark.notebook


def test_claim_tables_find_exactly_the_recorded_disagreements(glue):
    assert glue["pretraining_block_disagreements"] == 2  # Listing 7's comments and 001's prose say post-LN
    assert glue["pretraining_objective_disagreements"] == 1  # Listing 1's mean is (9) / N, not (9)
    assert glue["pretraining_disagreements"] == 4  # + GPT-4's 3e23 FLOPs against 25,000 A100 × 100 days


def test_causal_jacobian_is_exactly_triangular(glue):
    assert glue["pretraining_jacobian_upper_max"] == 0.0


def test_pretraining_lowers_the_loss_of_every_task(glue):
    for task in ("kb_walk", "arithmetic"):
        assert glue[f"pretraining_{task}_final_loss"] < 0.7 * glue[f"pretraining_{task}_first_loss"]


def test_kb_walk_loss_settles_just_above_the_data_entropy(glue):
    floor = glue["pretraining_kb_walk_entropy_floor"]
    assert floor - 0.05 < glue["pretraining_kb_walk_final_loss"] < floor + 0.3


def test_common_facts_are_recalled_and_rare_ones_much_less(glue):
    assert glue["pretraining_kb_recall_common"] > 0.9 > 20 * glue["pretraining_kb_chance"]
    assert glue["pretraining_kb_recall_rare"] < glue["pretraining_kb_recall_common"] - 0.5


def test_arithmetic_model_predicts_heldout_answer_digits_above_chance(glue):
    assert glue["pretraining_arithmetic_digit_accuracy"] > 0.15  # chance: 0.10


def test_recorded_learning_rates_follow_the_schedule(glue):
    assert glue["pretraining_lr_matches_schedule"] is True
