"""Chapter 12's in-context learning and chain of thought (notebooks/12e_icl_cot.ipynb) at
scale=smoke: 001's worked examples, a rule read from the demonstrations, sums answered directly or
with a scratchpad, a changed working, and the answers' distributions against the CoT marginal.
Values that hold by construction are asserted, not outcomes that depend on how training went."""

import pytest

from tests.notebooks.harness import interval, preregistered
from tests.notebooks.test_verdicts import old_verdicts

NOTEBOOK = "12e_icl_cot"
pytestmark = pytest.mark.notebook


def test_every_claim_table_of_the_page_is_counted(glue):
    count = glue["ext_icl_cot_disagreements"]
    assert isinstance(count, int) and count >= 0
    assert count == glue["cot_worked_disagreements"] + glue["cot_model_disagreements"]


def test_001s_worked_examples_recomputed(glue):
    w = glue["cot_worked_values"]
    assert w["square_at_7"] == pytest.approx(49, abs=1e-9) and w["alt_at_7"] == 89
    assert w["steps"] == [30, 12, 42, 42] and w["scratchpad_answer"] == 42
    assert w["slope"] == pytest.approx(2, abs=1e-9) and w["intercept"] == pytest.approx(1, abs=1e-9)
    assert w["f_at_10"] == pytest.approx(21, abs=1e-9) and w["alt_f_at_10"] == 357
    assert glue["cot_worked_disagreements"] == 0


def test_the_icl_example_in_the_tasks_form(glue):
    assert glue["icl_shots"] == [0, 1, 2, 3, 4] and glue["icl_chance"] == pytest.approx(1 / 9)
    assert glue["icl_form_prompts"][0] == "7 >"
    assert glue["icl_form_prompts"][-1] == "2 > 4 ; 3 > 5 ; 5 > 7 ; 1 > 3 ; 7 >"
    # no demonstration: the rule is unknown
    assert glue["icl_form_gold"] == ["<abstain>", "9", "9", "9", "9"]


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
    for d_, c_, diff in zip(glue["cot_direct_accuracy"], glue["cot_cot_accuracy"],
                            glue["cot_minus_direct"]):
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
    assert set(rates) == {f"{p}: {w}" for p in ("changed working", "gold working")
                          for w in ("follows", "true sum")}
    for triple in rates.values():
        interval(triple, 0.0, 1.0)
    # a changed working spells a sum that is not the true one; the gold working spells the true sum
    changed = rates["changed working: follows"][0] + rates["changed working: true sum"][0]
    assert changed <= 1.0 + 1e-12
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


# -- the exercises' solutions ----------------------------------------------------------------------
def test_exercise_solutions_a_blind_rule_is_right_one_time_in_nine(glue):
    chance = glue["icl_ex_chance"]
    assert chance["blind"] == pytest.approx(1 / 9, rel=1e-12)
    assert glue["icl_chance"] == pytest.approx(1 / 9, rel=1e-12)
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


# -- the pre-registered contrasts ----------------------------------------------------------------
# The page's contrast with the direction the chapter's opening page predicts.
PREREGISTERED_AT_SMOKE = {
    "CoT − direct": "higher",
}


def test_the_preregistered_contrasts_are_glued_with_their_predictions(glue):
    preregistered(glue, PREREGISTERED_AT_SMOKE, seeds=len(glue["cot_seeds"]),
                  same_as={"CoT − direct": "cot_minus_direct_all"})
