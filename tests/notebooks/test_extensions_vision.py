"""Chapter 12's vision-language model in miniature (notebooks/12d_vision.ipynb) at scale=smoke: the
lab's decoder with an image at the embedding stage, checked exactly, and two captioners a habit
apart. Values that hold by construction are asserted, not outcomes that depend on how training
went."""

import pytest

from tests.notebooks.harness import interval, preregistered
from tests.notebooks.test_verdicts import old_verdicts

NOTEBOOK = "12d_vision"
pytestmark = pytest.mark.notebook


def test_every_claim_table_of_the_page_is_counted(glue):
    assert isinstance(glue["ext_vlm_disagreements"], int) and glue["ext_vlm_disagreements"] >= 0
    assert glue["ext_vlm_disagreements"] == glue["vlm_disagreements"]


def test_the_image_sets_are_fixed_distinct_and_the_counter_images_break_the_habit(glue):
    assert glue["vlm_n_typical"] == glue["vlm_n_counter"] == 120
    assert glue["vlm_counter_first_red"] == 0  # no counter image has a red first cell
    assert glue["vlm_training"]["steps"] > 0 and glue["vlm_training"]["images"] > 0


def test_a_vlm_is_the_text_model_plus_an_encoder_and_w_proj(glue):
    counts = glue["vlm_param_counts"]
    parts = counts["text decoder"] + counts["vision module"] + counts["W_proj, b_proj"]
    assert counts["VLM"] == parts
    # structural checks on the untrained model: exact at every scale
    assert glue["vlm_disagreements"] == 0


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
        # σ = 0.5 is the training noise
        assert rates[2] == pytest.approx(glue[f"vlm_usual_{key}"][0])
        steps = [p[0] for p in glue["vlm_curve"][arm]]
        assert steps == sorted(steps) and steps[0] == 0
        assert steps[-1] == glue["vlm_training"]["steps"]


def test_no_glued_verdict_says_no_difference_resolved(glue):
    assert not old_verdicts(glue)


# -- the pre-registered contrasts ----------------------------------------------------------------
# The page's contrast with the direction the chapter's opening page predicts.
PREREGISTERED_AT_SMOKE = {
    "habit − no habit captioner": "higher",
}


def test_the_preregistered_contrasts_are_glued_with_their_predictions(glue):
    preregistered(glue, PREREGISTERED_AT_SMOKE, seeds=len(glue["vlm_seeds"]),
                  same_as={"habit − no habit captioner": "vlm_usual_diff"})
