"""Chapter 5 (positional encodings): what the smoke run of notebooks/05_positional.ipynb must show."""

import math

import pytest

NOTEBOOK = "05_positional"
pytestmark = pytest.mark.notebook

METHODS = ("none", "pi", "ntk", "yarn")
V = 64 + 16 + 16 * 16  # chain, key and value tokens (a value token names its key)
CHAIN_CHANCE = 64.0  # perplexity of a uniform guess over the chain's tokens; the data's best is 1.99


def test_claims_disagree_only_where_the_errata_say(glue):
    assert glue["positional_sinusoid_disagreements"] == 1  # exponent slip in PE(0, 1)
    assert glue["positional_rotation_disagreements"] == 1  # R(ωk) vs R(ωk)ᵀ for [sin, cos] pairs
    assert glue["positional_rope_disagreements"] == 0
    # "high i = high frequency", YaRN's blend reversed, 1/t "mitigates over-sharp attention", §7.6.3's summary
    assert glue["positional_extension_disagreements"] == 4
    assert glue["positional_disagreements"] == 6
    assert 0 <= glue["positional_experiment_disagreements"] <= 4  # follows the run: four rows


def test_long_context_model_learns_well_above_chance(glue):
    assert all(loss < math.log(V) - 0.5 for loss in glue["positional_lc_final_train_loss"])
    assert glue["positional_lc_none_2L_within"][0] < CHAIN_CHANCE / 2


def test_evaluation_pairs_are_what_the_text_says(glue):
    # every key of an evaluation sequence appears twice with one value, and only its second value is recalled
    assert glue["positional_lc_pairs_consistent"] is True
    # smoke: L = 32, 4 sequences per probe distance; distances L/4 … 7L that fit in 2L, 4L, 8L tokens
    assert glue["positional_lc_eval_sizes"] == [4 * 4, 6 * 4, 8 * 4]


def test_training_on_longer_sequences_lowers_perplexity_beyond_the_window(glue):
    assert glue["positional_lc_none_ft4_8L_beyond"][0] < glue["positional_lc_none_8L_beyond"][0]
    assert glue["positional_lc_none_ft4_4L_beyond"][0] < glue["positional_lc_none_4L_beyond"][0]


def _readings():
    for method in METHODS:
        for mult in (2, 4, 8):
            yield f"positional_lc_{method}_{mult}L"
        for factor in (4, 8):  # fine-tuned at 4L with s = 4 and with s = 8, read at 4L and 8L
            for mult in (4, 8):
                yield f"positional_lc_{method}_ft{factor}_{mult}L"


def test_every_method_and_length_is_reported_with_an_interval(glue):
    for name in _readings():
        for where in ("within", "beyond"):
            est, low, high = glue[f"{name}_{where}"]
            assert 1.0 < low <= est <= high < CHAIN_CHANCE * 4, (name, where, est, low, high)
        for where in ("near", "far"):
            est, low, high = glue[f"{name}_recall_{where}"]
            assert 0.0 <= low <= est <= high <= 1.0, (name, where, est, low, high)


def test_yarn_is_also_read_without_its_factor_on_the_scores(glue):
    for mult in (2, 4, 8):
        for where in ("near", "far"):
            est, low, high = glue[f"positional_lc_yarn_no_t_{mult}L_recall_{where}"]
            assert 0.0 <= low <= est <= high <= 1.0


def test_geometry_pi_squeezes_and_ntk_leaves_growing_unseen_arcs(glue):
    geo = lambda method, s: glue[f"positional_geometry_{method}_s{s}"]  # (fastest plane's factor, arc, planes)
    for s in (2, 4, 8):
        assert geo("pi", s)[0] == pytest.approx(1 / s)  # every plane divided by s, the fastest too
        assert geo("pi", s)[1] < 1e-5 and geo("pi", s)[2] == 0  # no angle beyond those of training
        assert geo("ntk", s)[0] == 1.0 and geo("none", s)[0] == 1.0  # the fastest plane kept
        assert 0 < geo("ntk", s)[1] < geo("none", s)[1]  # fewer unseen angles than no scaling, but some
    for method in ("none", "ntk"):
        arcs = [geo(method, s)[1] for s in (2, 4, 8)]
        assert arcs == sorted(arcs) and arcs[0] < arcs[-1]  # the unseen arc grows with s


# -- the exercises' solutions -----------------------------------------------------------------------------------------
def test_exercise_solutions_turning_planes_follow_the_closed_form(glue):
    (f1, c1), (f2, c2) = glue["positional_ex_turning_planes"]  # D = 128, L = 4096; b = 10⁴ and 5·10⁵
    assert (f1, f2) == (c1, c2)
    # k ≤ 64·log_b(4096/2π): ⌊45.03⌋ + 1 = 46 planes for b = 10⁴, ⌊31.7⌋ + 1 = 32 for b = 5·10⁵
    assert (c1, c2) == (46, 32)


def test_exercise_solutions_ntk_divides_the_middle_plane_by_root_s(glue):
    k, f31, f32 = glue["positional_ex_ntk_half"]
    assert k == 31.5
    assert f31 == pytest.approx(4 ** (-2 * 31 / 126), rel=1e-5) and f32 == pytest.approx(4 ** (-2 * 32 / 126), rel=1e-5)
    assert f32 < 0.5 < f31


def test_exercise_solutions_rope_model_ignores_a_shift_of_every_position(glue):
    shift_1000, shift_10000, sinusoid_move = glue["positional_ex_shift_invariance"]
    assert shift_1000 < 1e-5 and shift_10000 < 1e-5  # float32 angles: rounding only
    assert sinusoid_move > 1.0  # an added encoding moves the input itself
