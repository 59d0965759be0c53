"""Chapter 5 (positional encodings): what the smoke run of notebooks/05_positional.ipynb must show."""

import math

import pytest

NOTEBOOK = "05_positional"
pytestmark = pytest.mark.notebook


def test_claims_disagree_only_where_the_errata_say(glue):
    assert glue["positional_sinusoid_disagreements"] == 1  # exponent slip in PE(0, 1)
    assert glue["positional_rotation_disagreements"] == 1  # R(ωk) vs R(ωk)ᵀ for [sin, cos] pairs
    assert glue["positional_rope_disagreements"] == 0
    assert glue["positional_extension_disagreements"] == 3  # "high i = high frequency", YaRN reversed, §7.6.3
    assert glue["positional_disagreements"] == 5


METHODS = ("none", "pi", "ntk", "yarn")


def test_long_context_model_learns_well_above_chance(glue):
    chance = 64.0  # V: perplexity of a uniform guess; the data's best is 1.99
    assert glue["positional_lc_final_train_loss"] < math.log(chance) - 0.5
    assert glue["positional_lc_ppl_in_window"] < chance / 2


def test_training_on_longer_sequences_lowers_perplexity_beyond_the_window(glue):
    assert glue["positional_lc_none_ft4_8L_beyond"] < glue["positional_lc_none_8L_beyond"]
    assert glue["positional_lc_none_ft4_4L_beyond"] < glue["positional_lc_none_4L_beyond"]


def test_long_context_experiment_reports_every_method_and_length(glue):
    for method in METHODS:
        for mult in (2, 4, 8):
            for where in ("beyond", "within"):
                value = glue[f"positional_lc_{method}_{mult}L_{where}"]
                assert 1.0 < value < 64.0 * 4, (method, mult, where, value)
        for factor in (4, 8):  # fine-tuned at 4L with s = 4 and with s = 8, read at 4L and 8L
            for mult in (4, 8):
                for where in ("beyond", "within"):
                    value = glue[f"positional_lc_{method}_ft{factor}_{mult}L_{where}"]
                    assert 1.0 < value < 64.0 * 4, (method, factor, mult, where, value)

