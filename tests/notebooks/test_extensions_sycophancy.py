"""Chapter 12's sycophancy (notebooks/12b_sycophancy.ipynb) at scale=smoke: arithmetic prompts
that carry the user's sum, with RLHF to verifier and to agreeable raters and RLVR against SFT.
Values that hold by construction are asserted, not outcomes that depend on how training went."""

import pytest

from tests.notebooks.harness import preregistered
from tests.notebooks.test_verdicts import old_verdicts

NOTEBOOK = "12b_sycophancy"
pytestmark = pytest.mark.notebook


def test_every_claim_table_of_the_page_is_counted(glue):
    assert isinstance(glue["ext_syc_disagreements"], int) and glue["ext_syc_disagreements"] >= 0
    assert glue["ext_syc_disagreements"] == glue["syc_claims_agree"].count(False)


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
    for name in ("syc_agree_vs_sft_rlhf", "syc_agree_vs_sft_agreeable", "syc_agree_vs_sft_rlvr",
                 "syc_rlvr_vs_agreeable"):
        est, low, high = glue[name]
        assert -1.0 <= low <= est <= high <= 1.0
    for name in ("syc_log_ratio_agreeable", "syc_log_ratio_agreeable_vs_sft"):
        est, low, high = glue[name]
        assert low <= est <= high
    assert len(glue["syc_claims_agree"]) == 4
    assert all(isinstance(a, bool) for a in glue["syc_claims_agree"])


def test_no_glued_verdict_says_no_difference_resolved(glue):
    assert not old_verdicts(glue)


# -- the pre-registered contrasts ----------------------------------------------------------------
# The page's contrasts with the directions the chapter's opening page predicts.
PREREGISTERED_AT_SMOKE = {
    "RLHF with agreeable raters − SFT": "higher",
    "RLVR − RLHF with agreeable raters": "lower",
}


def test_the_preregistered_contrasts_are_glued_with_their_predictions(glue):
    preregistered(glue, PREREGISTERED_AT_SMOKE, seeds=len(glue["syc_seeds"]), same_as={
        "RLVR − RLHF with agreeable raters": "syc_rlvr_vs_agreeable",
        "RLHF with agreeable raters − SFT": "syc_agree_vs_sft_agreeable"})
