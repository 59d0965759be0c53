"""Chapter 12's safety (notebooks/12c_safety.ipynb) at scale=smoke: a forbidden kb_walk relation,
refused up front or taken back, free-running and under a prefilling attack, and what the fine-tunes
leave of the facts. Values that hold by construction are asserted, not outcomes that depend on how
training went."""

import pytest

from tests.notebooks.harness import interval, preregistered
from tests.notebooks.test_verdicts import old_verdicts

NOTEBOOK = "12c_safety"
pytestmark = pytest.mark.notebook


def test_every_claim_table_of_the_page_is_counted(glue):
    assert isinstance(glue["ext_safe_disagreements"], int) and glue["ext_safe_disagreements"] >= 0
    assert glue["ext_safe_disagreements"] == glue["safe_n_disagreements"]


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
    # an abstention on an allowed prompt is a false retraction
    assert r["abstained"] <= r["false retraction"] + 1e-12


def test_safety_differences_are_intervals(glue):
    names = [k for k in glue if k.startswith(("safe_diff_", "safe_attack_"))]
    assert len(names) == 3 * 6 + 3
    for name in names:
        interval(glue[name], -1.0, 1.0)
    assert glue["safe_n_claims"] == 10 and 0 <= glue["safe_n_disagreements"] <= 10


def test_no_glued_verdict_says_no_difference_resolved(glue):
    assert not old_verdicts(glue)


# -- the pre-registered contrasts ----------------------------------------------------------------
# The page's contrasts with the directions the chapter's opening page predicts.
PREREGISTERED_AT_SMOKE = {
    "refuse − the start": "lower",
    "take back − the start": "lower",
}


def test_the_preregistered_contrasts_are_glued_with_their_predictions(glue):
    preregistered(glue, PREREGISTERED_AT_SMOKE, seeds=len(glue["safe_seeds"]), same_as={
        "refuse − the start": "safe_diff_refuse_start_violation_free",
        "take back − the start": "safe_diff_take_back_start_violation_free"})
