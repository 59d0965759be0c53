"""halluc_lab.book.claims: agreement within tolerance, deterministic rendering, clear errors."""

import pytest

from halluc_lab.book.claims import ClaimTable


def test_numeric_claim_agrees_within_absolute_tolerance():
    t = ClaimTable("doc §1")
    assert t.check("x", stated=0.66, computed=0.659, tol=0.005)
    assert not t.check("y", stated=0.66, computed=0.70, tol=0.005)
    assert t.n_disagreements == 1 and t.disagreements[0].quantity == "y"


def test_relative_tolerance_scales_with_the_stated_value():
    t = ClaimTable("doc §1")
    assert t.check("big", stated=1000.0, computed=1004.0, rel=0.005)
    assert not t.check("big2", stated=1000.0, computed=1006.0, rel=0.005)


def test_nan_never_agrees():
    t = ClaimTable("doc")
    assert not t.check("nan", stated=1.0, computed=float("nan"), tol=10.0)


def test_rendering_is_deterministic_and_rounded():
    t = ClaimTable("doc §2", digits=3)
    t.check("p", stated=0.5, computed=0.123456789, tol=1.0)
    t.check("phrase", stated="O(n²)", computed="O(n²)", agrees=True)
    text = repr(t)
    assert "0.123" in text and "0.1234" not in text and "2 of 2 agree" in text
    assert text == repr(t) and "<table" in t._repr_html_()


def test_numeric_claim_without_tolerance_is_an_error():
    with pytest.raises(ValueError, match="tol"):
        ClaimTable("doc").check("x", stated=1.0, computed=1.0)


def test_tolerance_on_words_is_a_type_error():
    with pytest.raises(TypeError, match="numeric"):
        ClaimTable("doc").check("x", stated="fast", computed=1.0, tol=0.1)


def test_negative_tolerance_is_rejected():
    with pytest.raises(ValueError, match="tol"):
        ClaimTable("doc").check("x", stated=1.0, computed=1.0, tol=-1)


def test_backticked_spans_render_as_code_in_the_html_table():
    t = ClaimTable("004 §7 — `nn.Transformer` & <masks>")
    t.check("`tgt +=` adds the encoding", stated="adds", computed="adds", agrees=True,
            note="the answer after `:` is read")
    page = t._repr_html_()
    assert "`" not in page
    assert "<code>tgt +=</code>" in page and "<code>:</code>" in page
    assert "<code>nn.Transformer</code> &amp; &lt;masks&gt;" in page  # the rest still escaped


def test_a_sign_claim_agrees_only_where_the_interval_lies_on_the_stated_side():
    from halluc_lab.evaluation.stats import Interval

    below, above = Interval(-0.2, -0.3, -0.1), Interval(0.2, 0.1, 0.3)
    across = Interval(0.0, -0.1, 0.1)
    expected = {"< 0": (True, False, False), "> 0": (False, True, False),
                "≠ 0": (True, True, False)}
    for stated, agrees in expected.items():
        t = ClaimTable("signs")
        got = tuple(t.check_sign(f"Δ {i}", d, stated=stated, note="n")
                    for i, d in enumerate((below, above, across)))
        assert got == agrees and t.n_disagreements == agrees.count(False)
    t = ClaimTable("computed")
    t.check_sign("Δ", below, stated="< 0", note="why")
    assert t.claims[0].computed == "-0.200 [-0.300, -0.100]" and t.claims[0].note == "why"


def test_a_sign_claim_refuses_a_statement_that_is_not_a_sign():
    from halluc_lab.evaluation.stats import Interval

    with pytest.raises(ValueError, match="stated must be one of"):
        ClaimTable("t").check_sign("Δ", Interval(0.1, 0.0, 0.2), stated="≪")
