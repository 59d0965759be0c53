"""Chapter 12 (notebooks/12_extensions.ipynb) at scale=smoke: continual learning on a grown kb_walk world (full
fine-tuning, a frozen backbone, LoRA through peft, replay) and eq. (12)'s gradient geometry; sycophancy on arithmetic
with RLHF to agreeable raters; a forbidden fact family and its retraction; a vision-language model in miniature;
in-context learning and chain of thought with 001's worked examples. Values that hold by construction are asserted,
not outcomes that depend on how training went."""

import pytest

from tests.notebooks.harness import interval
from tests.notebooks.test_verdicts import old_verdicts

NOTEBOOK = "12_extensions"
pytestmark = pytest.mark.notebook


def test_every_claim_table_of_the_chapter_is_counted(glue):
    assert isinstance(glue["ext_disagreements"], int) and glue["ext_disagreements"] >= 0


# -- continual learning -----------------------------------------------------------------------------------------
def test_continual_learning_grows_the_vocabulary_and_keeps_the_old_logits(glue):
    assert 1 <= glue["cl_n_eval"]["new"] <= 120 and 1 <= glue["cl_n_eval"]["old"] <= 120
    assert glue["cl_n_new_tokens"] > 0 and glue["cl_old_vocab_kept"] is True


def test_lora_parameter_counts_agree_three_ways(glue):
    assert glue["cl_lora_counts_agree"] is True
    for row in glue["cl_lora_counts"]:
        assert row["by_hand"] == row["library"] and row["peft"] == row["expected"]


def test_continual_learning_rates_are_shares_and_kl_is_non_negative(glue):
    assert len(glue["cl_arms"]) >= 4
    for arm, m in glue["cl_summary"].items():
        for what in ("new", "old", "old_wrong"):
            assert 0.0 <= m[what] <= 1.0
        assert m["old"] + m["old_wrong"] <= 1.0 + 1e-12 and m["kl"] >= 0.0
    assert set(glue["cl_old_wrong_minus_before"]) == set(glue["cl_arms"])
    for triple in glue["cl_old_wrong_minus_before"].values():
        interval(triple, -1.0, 1.0)
    for arm in glue["cl_lora_minus_full"].values():
        interval(arm["new"], -1.0, 1.0), interval(arm["old"], -1.0, 1.0)
    assert glue["cl_anchor_minus_full"] and all(k.split()[0] in ("new", "old") for k in glue["cl_anchor_minus_full"])
    for triple in glue["cl_anchor_minus_full"].values():
        interval(triple, -1.0, 1.0)
    assert sum("anchor" in arm for arm in glue["cl_arms"]) * 2 == len(glue["cl_anchor_minus_full"])


def test_the_gradient_geometry_is_a_share_and_cosines(glue):
    for g in glue["cl_geometry"].values():
        assert 0.0 <= g["share"] <= 1.0 + 1e-9 and 0.0 <= g["share_trainable"] <= 1.0 + 1e-9
        assert g["P_trainable"] < g["P"] and g["eta"] > 0
        assert len(g["cos"]) == len(g["predicted"]) == len(g["measured"]) == g["k"]
        for c, c_t in zip(g["cos"].values(), g["cos_trainable"].values()):
            assert -1.0 <= c <= 1.0 and -1.0 <= c_t <= 1.0
            assert g["share"] >= c * c - 1e-9  # the span holds each old gradient: its share bounds each cos²
            assert g["share_trainable"] >= c_t * c_t - 1e-9


# -- sycophancy -------------------------------------------------------------------------------------------
SYC_ARMS = ("pre_trained", "sft", "rlhf", "rlhf_agreeable", "rlvr")


def test_sycophancy_is_measured_on_a_fixed_set_of_distinct_held_out_sums(glue):
    assert glue["syc_n_eval"] == glue["syc_n_eval_distinct"] >= 100


@pytest.mark.parametrize("arm", SYC_ARMS)
def test_sycophancy_rates_are_shares_and_right_and_agreeing_exclude_each_other(arm, glue):
    g = glue[f"syc_{arm}"]
    for what in ("plain", "stated", "agree"):
        est, low, high = g[what]
        assert 0.0 <= low <= est <= high <= 1.0
    # a wrong statement is never the sum: an answer cannot both be right and repeat it
    assert g["stated"][0] + g["agree"][0] <= 1.0 + 1e-12
    assert 0 <= g["flips"] <= g["right"]
    if g["right"]:
        est, low, high = g["flip"]
        assert 0.0 <= low <= est <= high <= 1.0 and est == pytest.approx(g["flips"] / g["right"])


def test_sycophancy_differences_are_intervals_and_the_claims_are_judged(glue):
    for name in ("syc_agree_vs_sft_rlhf", "syc_agree_vs_sft_agreeable", "syc_agree_vs_sft_rlvr", "syc_rlvr_vs_agreeable"):
        est, low, high = glue[name]
        assert -1.0 <= low <= est <= high <= 1.0
    for name in ("syc_log_ratio_agreeable", "syc_log_ratio_agreeable_vs_sft"):
        est, low, high = glue[name]
        assert low <= est <= high
    assert len(glue["syc_claims_agree"]) == 4 and all(isinstance(a, bool) for a in glue["syc_claims_agree"])


# -- safety -------------------------------------------------------------------------------------------------------
SAFE_ARMS = ("start", "refuse", "take_back")


def test_the_safety_evaluation_sets_are_fixed_and_the_fine_tunes_matched(glue):
    assert 1 <= glue["safe_n_forbidden"] <= 120 and 1 <= glue["safe_n_allowed"] <= 120
    assert glue["safe_steps"] > 0 and glue["safe_n_recall_facts"]["forbidden"] > 0


@pytest.mark.parametrize("arm", SAFE_ARMS)
def test_safety_rates_add_up(arm, glue):
    r = glue[f"safe_{arm}_rates"]
    assert all(0.0 <= v <= 1.0 for v in r.values())
    # a free-running answer that wrote a forbidden fact either took it back or still states it
    assert r["wrote, free"] == pytest.approx(r["retracted, free"] + r["violation, free"])
    assert r["correct"] + r["wrong"] + r["abstained"] == pytest.approx(1.0)
    assert r["abstained"] <= r["false retraction"] + 1e-12  # an abstention on an allowed prompt is a false retraction


def test_safety_differences_are_intervals(glue):
    names = [k for k in glue if k.startswith(("safe_diff_", "safe_attack_"))]
    assert len(names) == 3 * 6 + 3
    for name in names:
        interval(glue[name], -1.0, 1.0)
    assert glue["safe_n_claims"] == 10 and 0 <= glue["safe_n_disagreements"] <= 10


# -- a vision-language model in miniature ---------------------------------------------------------------------------
def test_the_image_sets_are_fixed_distinct_and_the_counter_images_break_the_habit(glue):
    assert glue["vlm_n_typical"] == glue["vlm_n_counter"] == 120
    assert glue["vlm_counter_first_red"] == 0  # no counter image has a red first cell
    assert glue["vlm_training"]["steps"] > 0 and glue["vlm_training"]["images"] > 0


def test_a_vlm_is_the_text_model_plus_an_encoder_and_w_proj(glue):
    counts = glue["vlm_param_counts"]
    assert counts["VLM"] == counts["text decoder"] + counts["vision module"] + counts["W_proj, b_proj"]
    assert glue["vlm_disagreements"] == 0  # structural checks on the untrained model: exact at every scale


@pytest.mark.parametrize("arm", ["habit", "no_habit"])
def test_caption_scores_are_shares_and_a_whole_caption_is_harder_than_a_cell(arm, glue):
    for images in ("typical", "counter"):
        cells = interval(glue[f"vlm_cells_{images}_{arm}"], 0.0, 1.0)
        caption = interval(glue[f"vlm_caption_{images}_{arm}"], 0.0, 1.0)
        assert caption <= cells + 1e-12  # a caption is right only when all its cells are
    interval(glue[f"vlm_usual_{arm}"], 0.0, 1.0)


def test_the_usual_colour_rates_and_their_difference(glue):
    habit, control = glue["vlm_usual_habit"][0], glue["vlm_usual_no_habit"][0]
    assert interval(glue["vlm_usual_diff"], -1.0, 1.0) == pytest.approx(habit - control, abs=1e-12)
    interval(glue["vlm_usual_diff_noisiest"], -1.0, 1.0)
    assert glue["vlm_test_noise"] == [0.0, 0.25, 0.5, 0.75, 1.0]
    for arm, key in (("habit", "habit"), ("no habit", "no_habit")):
        rates = glue["vlm_usual_by_noise"][arm]
        assert len(rates) == 5 and all(0.0 <= r <= 1.0 for r in rates)
        assert rates[2] == pytest.approx(glue[f"vlm_usual_{key}"][0])  # σ = 0.5 is the training noise
        steps = [p[0] for p in glue["vlm_curve"][arm]]
        assert steps == sorted(steps) and steps[0] == 0 and steps[-1] == glue["vlm_training"]["steps"]


# -- in-context learning and chain of thought ----------------------------------------------------------------------
def test_001s_worked_examples_recomputed(glue):
    w = glue["cot_worked_values"]
    assert w["square_at_7"] == pytest.approx(49, abs=1e-9) and w["alt_at_7"] == 89
    assert w["steps"] == [30, 12, 42, 42] and w["scratchpad_answer"] == 42
    assert w["slope"] == pytest.approx(2, abs=1e-9) and w["intercept"] == pytest.approx(1, abs=1e-9)
    assert w["f_at_10"] == pytest.approx(21, abs=1e-9) and w["alt_f_at_10"] == 357
    assert glue["cot_worked_disagreements"] == 0


def test_the_icl_example_in_the_tasks_form(glue):
    assert glue["icl_shots"] == [0, 1, 2, 3, 4] and glue["icl_chance"] == pytest.approx(1 / 9)
    assert glue["icl_form_prompts"][0] == "7 >" and glue["icl_form_prompts"][-1] == "2 > 4 ; 3 > 5 ; 5 > 7 ; 1 > 3 ; 7 >"
    assert glue["icl_form_gold"] == ["<abstain>", "9", "9", "9", "9"]  # no demonstration: the rule is unknown


def test_icl_accuracy_by_shots_is_measured_on_distinct_held_out_prompts(glue):
    n = glue["icl_n_prompts"]
    assert len(n) == 5 and 1 <= n[0] <= 10 and all(1 <= k <= 120 for k in n[1:])
    for name in ("icl_correct_by_shots", "icl_abstained_by_shots", "icl_p_gold_by_shots"):
        assert len(glue[name]) == 5
        for triple in glue[name]:
            interval(triple, 0.0, 1.0)
    interval(glue["icl_fewshot_accuracy"], 0.0, 1.0)


def test_chain_of_thought_against_direct_answers_by_digits(glue):
    digits, n = glue["cot_digits"], glue["cot_n_prompts"]
    assert len(digits) == len(n) and all(1 <= k <= 120 for k in n)
    for d_, c_, diff in zip(glue["cot_direct_accuracy"], glue["cot_cot_accuracy"], glue["cot_minus_direct"]):
        interval(d_, 0.0, 1.0), interval(c_, 0.0, 1.0), interval(diff, -1.0, 1.0)
        assert diff[0] == pytest.approx(c_[0] - d_[0])
    interval(glue["cot_minus_direct_all"], -1.0, 1.0)
    for k, kinds in glue["cot_kinds"].items():  # every answer of every seed is one kind
        total, prompts = sum(kinds), n[digits.index(int(k))]
        assert total >= prompts and total % prompts == 0
    assert all(0.0 <= f <= 1.0 for f in glue["cot_answer_follows_working"])


def test_a_changed_working_is_followed_or_summed_never_both(glue):
    assert 1 <= glue["cot_corrupt_n"] <= 500
    rates = glue["cot_corrupt"]
    assert set(rates) == {f"{p}: {w}" for p in ("changed working", "gold working") for w in ("follows", "true sum")}
    for triple in rates.values():
        interval(triple, 0.0, 1.0)
    # a changed working spells a sum that is not the true one; the gold working spells the true sum
    assert rates["changed working: follows"][0] + rates["changed working: true sum"][0] <= 1.0 + 1e-12
    assert rates["gold working: follows"] == rates["gold working: true sum"]


def test_the_marginal_comparison_is_a_distance_above_a_noise_floor(glue):
    assert glue["cot_marginal_sizes"][1:] in ([16, 48], [200, 256])
    for triple in glue["cot_marginal_p_gold"].values():
        interval(triple, 0.0, 1.0)
    tv = glue["cot_marginal_tv"]
    assert all(0.0 <= v <= 1.0 for v in tv.values())
    for arm, triple in glue["cot_marginal_tv_excess"].items():
        assert interval(triple) == pytest.approx(tv[arm] - tv["CoT marginal"])
    assert 0 <= glue["cot_model_disagreements"] <= 5


# -- the exercises' solutions -----------------------------------------------------------------------------------------
def test_exercise_solutions_the_lora_break_even_rank_agrees_with_the_library(glue):
    rank = glue["cl_ex_lora_break_even"]
    assert rank["formula"] == rank["library"] >= 1


def test_exercise_solutions_a_blind_rule_is_right_one_time_in_nine(glue):
    chance = glue["icl_ex_chance"]
    assert chance["blind"] == pytest.approx(1 / 9, rel=1e-12) and glue["icl_chance"] == pytest.approx(1 / 9, rel=1e-12)
    assert chance["checked"] == 9 * 10 * 9 and chance["wrong"] == 0


def test_exercise_solutions_a_cubic_term_moves_the_answer_anywhere(glue):
    for target, (c, miss, at_7) in glue["cot_ex_any_answer"].items():
        assert miss < 1e-9 and at_7 == pytest.approx(float(target), abs=1e-9), target
        assert c == pytest.approx((float(target) - 49) / 40, rel=1e-12)


def test_exercise_solutions_the_gold_working_keeps_its_invariant(glue):
    pad = glue["cot_ex_scratchpad"]
    assert pad["sums"] == sum(glue["cot_n_prompts"]) and pad["columns"] >= pad["sums"]
    assert pad["broken"] == 0


def test_no_glued_verdict_says_no_difference_resolved(glue):
    assert not old_verdicts(glue)
