"""Chapter 9 (notebooks/09_preference.ipynb) at scale=smoke: the exact checks on small discrete examples, and
DPO, RSFT, a reward model and PPO on the lab's models, measured on fixed sets of distinct held-out prompts."""

import math

import pytest

from tests.notebooks.harness import preregistered
from tests.notebooks.test_verdicts import old_verdicts

NOTEBOOK = "09_preference"
pytestmark = pytest.mark.notebook


def test_bradley_terry_and_the_kl_regularised_optimum_hold_exactly(glue):
    assert glue["pref_toy_bt_max_gap"] < 1e-6  # p_i / (p_i + p_j) = σ(r_i − r_j) with p = e^r
    assert glue["pref_toy_perturb_gap"] < 1e-6  # no perturbation of π* scores higher on the objective
    assert glue["pref_toy_ascent_gap"] < 1e-4  # gradient ascent on tabular logits lands on π*
    assert glue["pref_toy_C"] == pytest.approx(glue["pref_toy_value"], abs=1e-6)  # C(x) = β log Z = the optimum


def test_where_beta_sits_the_documents_disagree_and_the_loss_is_rafailovs(glue):
    assert glue["pref_toy_R_spread"] < 1e-6  # R − β log(π*/π_ref) is one constant over the completions
    assert glue["pref_toy_R_spread_001"] > 1.0  # with 001's β⁻¹ it is not
    probabilities = (glue["pref_toy_p_bt_001"], glue["pref_toy_p_remark_001"], glue["pref_toy_p_loss"])
    assert len({round(p, 4) for p in probabilities}) == 3  # 001's step, its Remark and its loss: three answers


def test_dpo_reaches_the_kl_optimum_and_best_of_n_does_not(glue):
    assert glue["pref_toy_dpo_kl_exact"] < 1e-6  # the expected DPO loss is minimised at π*
    assert glue["pref_toy_dpo_kl"] < 0.01  # and 100,000 sampled pairs come close
    assert glue["pref_toy_dpo_rm_gap"] < 1e-6  # its implicit reward is the Bradley–Terry fit of the same pairs
    soft, bon = glue["pref_toy_soft_tv"], glue["pref_toy_bon_tv"]
    assert soft[-1] < 0.01 and soft[-1] < soft[0]  # the soft rule tends to π_ref·exp(R/β)/Z
    assert bon[-1] == pytest.approx(glue["pref_toy_bon_limit_tv"], abs=1e-3) and bon[-1] > 0.1  # best-of-N does not
    assert glue["pref_toy_ppo_tv"] < 0.02


def test_the_listing_of_004_learns_nothing_from_coin_flips_and_something_from_a_signal(glue):
    low, high = glue["pref_toy_listing_heldout_accuracy"][1:]
    assert low <= 0.5 <= high  # its preferences are coin flips
    assert glue["pref_toy_signal_heldout_accuracy"][1] > 0.9
    assert abs(glue["pref_toy_listing_tie_share"] - 0.5) < 0.05  # y1 = y2 about half the time


def test_evaluation_sets_hold_distinct_prompts(glue):
    assert glue["pref_seeds"] == [0]  # the CPU trains one seed; the code path is that of three
    for task in ("kb_walk", "arithmetic"):
        assert glue[f"pref_{task}_n_eval"] == glue[f"pref_{task}_eval_distinct"] >= 50


def _compared(glue):
    return [k.removesuffix("_verdict") for k in glue if k.startswith("pref_") and "_vs_SFT_" in k
            and k.endswith("_verdict")]


def test_intervals_contain_their_estimates_and_verdicts_follow_them(glue):
    intervals = [v for k, v in glue.items() if k.startswith(("pref_kb_walk_", "pref_arithmetic_"))
                 and isinstance(v, list) and len(v) == 3 and "_vs_" not in k and "first_last" not in k]
    assert len(intervals) > 50
    for est, low, high in intervals:
        assert low <= est <= high
    compared = _compared(glue)
    assert len(compared) == 5 * 5 + 4 * 4  # kb_walk: five methods, five scores; arithmetic: four and four
    for key in compared:
        est, low, high = glue[key]
        assert low <= est <= high
        said = glue[key + "_verdict"]
        assert (" is lower than SFT in " in said) == (high < 0), key
        assert (" is higher than SFT in " in said) == (low > 0), key
        assert (" − SFT in " in said and "not resolved" in said) == (low <= 0 <= high), key
    exploratory = [k for k in compared if glue[k + "_verdict"].startswith("(exploratory) ")]
    assert len(compared) - len(exploratory) == 8  # the pre-registered contrasts against SFT


def test_the_over_optimisation_contrast_has_an_interval_over_seeds_and_a_verdict(glue):
    est, low, high = glue["pref_bon_fall"]
    assert low <= est <= high
    assert glue["pref_bon_fall_per_seed"] == pytest.approx([est])  # one seed on the CPU
    said = glue["pref_bon_fall_verdict"]
    assert said.startswith("best-of-16 ")
    assert ("is lower than best-of-4" in said) == (high < 0)
    assert ("not resolved" in said) == (low <= 0 <= high)


# The pre-registered contrasts (all computed at smoke): label -> (the glue of its own interval, the
# prediction at the top of the chapter).
PREREGISTERED = {
    "kb_walk: RLHF − SFT, hallucination rate": ("pref_kb_walk_PPO_reward_model_vs_SFT_wrong", "lower"),
    "kb_walk: RLVR − SFT, hallucination rate": ("pref_kb_walk_PPO_verifier_vs_SFT_wrong", "lower"),
    "kb_walk: RLVR − RLHF, hallucination rate": ("pref_rlvr_vs_rlhf_wrong", "higher"),
    "kb_walk: RLHF − SFT, proxy reward": ("pref_kb_walk_PPO_reward_model_vs_SFT_proxy_reward", "higher"),
    "kb_walk: RLHF − SFT, gold reward": ("pref_kb_walk_PPO_reward_model_vs_SFT_gold_reward", "not resolved"),
    "kb_walk: RLVR − SFT, gold reward": ("pref_kb_walk_PPO_verifier_vs_SFT_gold_reward", "higher"),
    "kb_walk: DPO − SFT, gold reward": ("pref_kb_walk_DPO_vs_SFT_gold_reward", "higher"),
    "kb_walk: RSFT − SFT, gold reward": ("pref_kb_walk_RSFT_vs_SFT_gold_reward", "higher"),
    "arithmetic: RLVR − SFT, gold reward": ("pref_arithmetic_PPO_verifier_vs_SFT_gold_reward", "higher"),
    "kb_walk: best-of-N_max − best-of-√N_max, gold reward of the proxy's pick": ("pref_bon_fall", "lower"),
}


def test_the_preregistered_contrasts_are_glued_with_their_predictions(glue):
    # every one, in the order of the chapter's table; one seed on the CPU: the bootstrap
    records = preregistered(glue, {label: p for label, (_, p) in PREREGISTERED.items()}, seeds=1,
                            same_as={label: key for label, (key, _) in PREREGISTERED.items()})
    for label, r in records.items():
        assert r["method"] == "bootstrap", label
    for key, _ in PREREGISTERED.values():  # none of them is marked exploratory
        said = glue.get(key + "_verdict")
        assert said is not None and not said.startswith("(exploratory)"), key


def test_the_reference_policy_is_zero_nats_from_itself(glue):
    for task in ("kb_walk", "arithmetic"):
        assert glue[f"pref_{task}_SFT_KL"] == [0.0, 0.0, 0.0]


def test_the_smoke_models_move_in_the_right_direction(glue):
    for task in ("kb_walk", "arithmetic"):
        first, last = glue[f"pref_{task}_dpo_loss_first_last"]
        assert first == pytest.approx(math.log(2), abs=1e-3)  # step 1: π = π_ref
        assert last < first  # the preferred answers gain on the rejected ones
    assert glue["pref_rm_train_accuracy"] > 0.6  # the reward model fits the pairs it saw
    # PPO raises the reward it is given: the reward model's score of its held-out answers, against the SFT model's
    assert glue["pref_kb_walk_PPO_reward_model_vs_SFT_proxy_reward"][0] > 0


def test_the_beta_flip_grid_holds_shares_of_answers(glue):
    for row in glue["pref_beta_flip_shares"]:
        for shares in row:
            assert sum(shares) == pytest.approx(1.0, abs=1e-5) and min(shares) >= 0


def test_every_disagreement_is_counted(glue):
    assert glue["pref_disagreements"] == glue["pref_toy_disagreements"] + glue["pref_hallucination_disagreements"]


# -- the exercises' solutions -----------------------------------------------------------------------------------------
def test_exercise_solutions_the_quadratic_gives_the_beta_of_half_correct(glue):
    half = glue["pref_ex_half_correct_beta"]
    assert half["p_correct"] == pytest.approx(0.5, abs=1e-12)
    assert half["bisection"] == pytest.approx(half["closed"], rel=1e-9)


def test_exercise_solutions_the_optimal_values_slope_is_minus_the_kl(glue):
    for beta, (finite_difference, minus_kl) in glue["pref_ex_value_derivative"].items():
        assert minus_kl < 0, beta
        assert finite_difference == pytest.approx(minus_kl, rel=1e-6), beta


def test_exercise_solutions_the_dpo_gradient_formula_matches_autograd(glue):
    grads = glue["pref_ex_dpo_gradient"]
    for policy, (_, gap) in grads.items():
        assert gap < 1e-12, policy
    assert grads["π_ref"][0] == pytest.approx(0.5, abs=1e-12)
    assert grads["π*"][0] < 0.5  # π* ranks Canberra. over Sydney.: the pair weighs less


def test_exercise_solutions_noisy_labels_leave_a_gap_of_log_odds(glue):
    for flip, (fitted, closed) in glue["pref_ex_noisy_gap"].items():
        assert fitted == pytest.approx(closed, abs=1e-6), flip
        assert closed > 0


def test_no_glued_verdict_says_no_difference_resolved(glue):
    assert not old_verdicts(glue)
