"""Chapter 5 (positional encodings): what the smoke run of notebooks/05_positional.ipynb must show."""

import pytest

NOTEBOOK = "05_positional"
pytestmark = pytest.mark.notebook


def test_claims_disagree_only_where_the_errata_say(glue):
    assert glue["positional_sinusoid_disagreements"] == 1  # exponent slip in PE(0, 1)
    assert glue["positional_rotation_disagreements"] == 1  # R(ωk) vs R(ωk)ᵀ for [sin, cos] pairs
    assert glue["positional_rope_disagreements"] == 0
    assert glue["positional_extension_disagreements"] == 3  # "high i = high frequency", YaRN reversed, §7.6.3
    assert glue["positional_disagreements"] == 5
