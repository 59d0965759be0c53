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


def test_hand_rmsnorm_and_swiglu_match_the_models_modules(glue):
    assert glue["pretraining_rms_torch_residual"] < 1e-10  # the formula against F.rms_norm, float64
    assert glue["pretraining_swiglu_residual"] < 1e-10  # W_down(SiLU(W_gate x) ⊙ W_up x) against model.MLP
    # model.RMSNorm normalises in float32 whatever the input dtype (as HF's LlamaRMSNorm): float32 rounding
    assert glue["pretraining_rms_module_residual"] < 1e-6


def test_every_task_has_a_positive_entropy_floor(glue):
    for task in ("kb_walk", "arithmetic", "path_star"):
        assert 0 < glue[f"pretraining_{task}_entropy_floor"] < 3  # nats per token; log V would be the ceiling


def test_floor_formulas_agree_with_the_task_generators(glue):
    assert glue["pretraining_floor_checks_pass"] is True  # incl. path_star's document count on tiny graphs
    for task in ("kb_walk", "arithmetic"):
        mc, se = glue[f"pretraining_{task}_floor_mc"], glue[f"pretraining_{task}_floor_mc_se"]
        assert 0 < se < 0.01
        assert abs(mc - glue[f"pretraining_{task}_entropy_floor"]) <= 4 * se
    assert glue["pretraining_path_star_floor_mc"] == pytest.approx(glue["pretraining_path_star_entropy_floor"])


def test_no_model_beats_its_entropy_floor_on_fresh_documents(glue):
    for task in ("kb_walk", "arithmetic"):
        floor, loss = glue[f"pretraining_{task}_entropy_floor"], glue[f"pretraining_{task}_fresh_loss"]
        assert loss >= floor - 0.01  # Proposition 2, up to the sampling noise of the fresh documents
        assert glue[f"pretraining_{task}_floor_gap"] >= -0.01
        assert abs(glue[f"pretraining_{task}_floor_gap"] - (loss - floor)) < 0.02  # the paired gap is loss − floor
        assert glue[f"pretraining_{task}_floor_gap_low"] <= glue[f"pretraining_{task}_floor_gap"]


def test_the_gap_to_the_floor_is_small_for_kb_walk_and_resolved_for_arithmetic(glue):
    assert glue["pretraining_kb_walk_floor_gap"] < 0.3  # it has memorised the common facts
    assert glue["pretraining_arithmetic_floor_gap_low"] > 0  # a 2 × 64 model after one pass does not add exactly


def test_fine_tuning_recipes_start_from_the_models_trained_here(glue):
    rooted = glue["pretraining_rooted_recipes"]
    for task in ("kb_walk", "arithmetic"):
        assert f"{task}-sft-clean" in rooted
    assert "kb_walk-pretrain:" in glue["run_recipes"] and "arithmetic-pretrain:" in glue["run_recipes"]


# -- the exercises' solutions -----------------------------------------------------------------------------------------
def test_exercise_solutions_the_parameter_formula_counts_every_weight(glue):
    params = glue["pretraining_ex_params"]
    assert set(params) >= {"kb_walk", "arithmetic"}
    for name, (by_formula, in_tables, counted) in params.items():
        assert by_formula == counted, name
        assert 0 < in_tables < by_formula


def test_exercise_solutions_tokens_per_parameter_are_tokens_over_parameters(glue):
    ratios, params = glue["pretraining_ex_tokens_per_param"], glue["pretraining_ex_params"]
    for name, (tokens, ratio) in ratios.items():
        assert ratio == pytest.approx(tokens / params[name][2], rel=1e-12)


def test_exercise_solutions_half_the_peak_rate_falls_at_the_middle_of_the_decay(glue):
    for name, (step, warmup, total) in glue["pretraining_ex_half_rate"].items():
        middle = warmup + (total - warmup) / 2
        assert middle <= step < middle + 1, name  # the first whole step at or past the cosine's zero
    assert glue["pretraining_ex_half_rate"]["TrainConfig(1000, 1.0, 100)"][0] == 550
