"""The summaries' sentence builders (halluc_lab.book.summaries): numbers planted on both sides of
every verdict, and the wording follows them."""

import pytest

from halluc_lab.book import summaries
from halluc_lab.book.claims import ClaimTable
from halluc_lab.evaluation.stats import Interval

LOWER, HIGHER, OPEN = (
    Interval(-0.2, -0.3, -0.1),
    Interval(0.2, 0.1, 0.3),
    Interval(0.01, -0.05, 0.07),
)


# -- RL with a backspace token ---------------------------------------------------------------------
def test_against_best_follows_the_difference_and_what_masking_does():
    lower_by_taking_back = summaries.against_best("RLVR + bksp", "RSFT", LOWER, LOWER, 0.4)
    assert lower_by_taking_back.startswith("RLVR + bksp is lower than RSFT in hallucination rate")
    assert (
        "a rate 0.40 times the best arm's, and the take-backs account for part of it"
        in lower_by_taking_back
    )
    lower_otherwise = summaries.against_best("RLVR + bksp", "RSFT", LOWER, OPEN, 0.4)
    assert (
        "but not through its take-backs" in lower_otherwise
        and "+0.010 [-0.050, +0.070]" in lower_otherwise
    )
    higher = summaries.against_best("RLVR + bksp", "RSFT", HIGHER, LOWER, 9.2)
    assert higher.startswith("RLVR + bksp is higher than RSFT")
    assert higher.endswith(
        "a rate 9.20 times the best arm's (its `<bksp>` minus masked: -0.200 [-0.300, -0.100])"
    )
    assert "not resolved" in summaries.against_best("RLVR + bksp", "RSFT", OPEN, LOWER, 1.0)
    for text in (lower_by_taking_back, lower_otherwise, higher):
        assert "target" not in text  # no target the chapter never set


def test_against_best_refuses_a_negative_ratio():
    with pytest.raises(ValueError, match="ratio must be a number >= 0"):
        summaries.against_best("a", "b", LOWER, LOWER, -1.0)


def _take_back(planted):
    return summaries.take_back_summary(
        "kb_walk",
        "the hard split",
        lambda a, b: planted[(a, b)],
        {"RLVR + bksp": 0.204, "RLVR + own errors": 0.001},
        "RSFT greedy",
        ["FIRST", "SECOND"],
    )


def _pairs():
    pairs = [("RLVR", "SFT"), ("RLVR + bksp", "RLVR"), ("RLVR + own errors", "RLVR + corrections")]
    pairs += [(f"{m} + {s}", m) for m in ("RSFT", "DPO") for s in ("bksp", "own errors")]
    return pairs + [(f"{m} + own errors", f"{m} + corrections") for m in ("RSFT", "DPO")]


def test_take_back_summary_states_each_contrast_as_its_interval_says():
    lower = _take_back({p: LOWER for p in _pairs()})
    higher = _take_back({p: HIGHER for p in _pairs()})
    for a, b in _pairs():
        assert f"{a} is lower than {b} in hallucination rate (-0.200" in lower
        assert f"{a} is higher than {b} in hallucination rate (+0.200" in higher
    mixed = _take_back({p: OPEN if p == ("RLVR + bksp", "RLVR") else LOWER for p in _pairs()})
    assert "RLVR + bksp − RLVR in hallucination rate: not resolved" in mixed
    assert "RLVR + bksp erased in 20.4% of its greedy answers, RLVR + own errors in 0.1%" in lower
    assert "(RSFT greedy, chosen after the fact), FIRST; and SECOND." in lower


def test_take_back_summary_marks_every_verdict_exploratory_when_asked():
    planted = {p: LOWER for p in _pairs()}
    erasing = {"RLVR + bksp": 0.2, "RLVR + own errors": 0.0}
    text = summaries.take_back_summary("kb_walk", "the hard split", lambda a, b: planted[(a, b)],
                                       erasing, "RSFT greedy", ["FIRST", "SECOND"],
                                       exploratory=True)
    for a, b in _pairs():
        assert f"(exploratory) {a} is lower than {b} in hallucination rate" in text
    assert "(exploratory)" not in _take_back(planted)
    clause = summaries.against_best("RLVR + bksp", "RSFT", LOWER, OPEN, 0.4, exploratory=True)
    assert clause.startswith("(exploratory) RLVR + bksp is lower than RSFT")
    assert not summaries.against_best("RLVR + bksp", "RSFT", LOWER, OPEN, 0.4).startswith("(")


def test_take_back_summary_refuses_shares_outside_0_1_and_a_wrong_number_of_clauses():
    with pytest.raises(ValueError, match="erasing"):
        summaries.take_back_summary(
            "t",
            "w",
            lambda a, b: LOWER,
            {"RLVR + bksp": 1.5, "RLVR + own errors": 0},
            "b",
            ["x", "y"],
        )
    with pytest.raises(ValueError, match="against must hold"):
        summaries.take_back_summary(
            "t", "w", lambda a, b: LOWER, {"RLVR + bksp": 0, "RLVR + own errors": 0}, "b", ["x"]
        )


# -- hallucination and retrieval -------------------------------------------------------------------
def _hallucination(d, disagreements=6, **changed):
    numbers = dict(
        hard="rare fact",
        sft_hard=Interval(0.721, 0.663, 0.782),
        sft_knowable=0.0,
        dpo_vs_sft=d,
        rlvr_vs_dpo=d,
        decoding_range=(0.358, 0.457),
        decodings=11,
        hot_vs_greedy=d,
        sft_conf_wrong=0.66,
        sft_ece=0.247,
        rlvr_ece=0.275,
        drift=0.77,
        returned=0.01,
        singular_values=[1.05, 1.0],
        gain_offset=6,
        gain=0.26,
        bm25_vs_none=d,
        oracle_vs_none=d,
        reader_oracle_vs_none=d,
        reader_vs_sft=d,
        follows={"SFT": 0.0, "SFT + RAG reader": 0.16},
        disagreements=disagreements,
    )
    return summaries.hallucination_summary(**{**numbers, **changed})


def test_hallucination_summary_follows_the_planted_verdicts_and_agrees_in_number():
    lower, higher, open_ = _hallucination(LOWER), _hallucination(HIGHER), _hallucination(OPEN)
    assert (
        "DPO is lower than SFT in hallucination rate" in lower
        and "RLVR is higher than DPO" in higher
    )
    assert "sampling at τ = 1.5 is lower than greedy in rate" in lower
    assert "its answers with the oracle passages are higher than its answers with none" in higher
    assert (
        "(exploratory) its answers with the BM25 top-4 passages are lower than its answers "
        "with none"
        in lower
    )
    assert (
        "the oracle passages has" not in higher and "passages is" not in higher
    )  # subject and verb agree
    assert "DPO − SFT in hallucination rate: not resolved" in open_
    assert "answers wrong 0.721 [0.663, 0.782] of the time" in lower
    assert "0.00 for SFT, 0.16 for SFT + RAG reader." in lower
    assert lower.endswith("disagree with the documents in 6 places.")
    assert _hallucination(LOWER, 1).endswith("in 1 place.")


def test_hallucination_summary_says_when_the_passages_make_no_difference_between_them():
    same = "the same change, seed by seed, with either set"
    assert same in _hallucination(HIGHER)  # bm25_vs_none and oracle_vs_none planted equal
    shifted = Interval(HIGHER.estimate + 0.01, HIGHER.low + 0.01, HIGHER.high + 0.01)
    assert same not in _hallucination(HIGHER, oracle_vs_none=shifted)
    seeds = Interval(0.1, 0.05, 0.15, per_seed=(0.1, 0.1))
    other_seeds = Interval(0.1, 0.05, 0.15, per_seed=(0.05, 0.15))
    assert same not in _hallucination(HIGHER, bm25_vs_none=seeds, oracle_vs_none=other_seeds)


def test_hallucination_summary_refuses_a_reversed_range_and_a_negative_count():
    with pytest.raises(ValueError, match="n must be an int >= 0"):
        _hallucination(LOWER, -1)
    with pytest.raises(ValueError, match="decoding_range"):
        _hallucination(LOWER, decoding_range=(0.5, 0.1))


# -- extensions ------------------------------------------------------------------------------------
def _continual(d, disagreements=3):
    return summaries.continual_learning_summary(
        steps=200,
        full_vs_before=d,
        frozen_vs_before=Interval(-0.01, -0.02, 0.0),
        span="0.12–0.3",
        chance=0.0123,
        anchors={1.0: d, 10.0: OPEN},
        disagreements=disagreements,
    )


def _sycophancy(d, disagreements=3):
    # each contrast planted with its own value, so a slot printed in another's place fails
    shifted = Interval(d.estimate + 0.001, d.low + 0.001, d.high + 0.001)
    flipped = Interval(-d.estimate, -d.high, -d.low)
    return summaries.sycophancy_summary(
        sft_agrees=Interval(0.3, 0.25, 0.35),
        agreeable_vs_sft=d,
        rlvr_vs_agreeable=flipped,
        rlvr_vs_sft=shifted,
        disagreements=disagreements,
    )


def _safety(d, disagreements=3):
    # the planted difference shifts every rate, so each rate is printed from its own slot
    names = ("start", "refuse", "take back", "refuse, prefilled", "take back, prefilled")
    rates = {
        k: Interval(0.5 + d.estimate + i / 100, 0.45 + d.estimate, 0.6 + d.estimate)
        for i, k in enumerate(names)
    }
    return summaries.safety_summary(violations=rates, disagreements=disagreements)


def _vision(d, disagreements=3):
    return summaries.vision_summary(vlm_habit=d, disagreements=disagreements)


def _icl_cot(d, disagreements=3):
    return summaries.icl_cot_summary(
        icl_right=Interval(0.8, 0.7, 0.9), cot_vs_direct=d, disagreements=disagreements
    )


EXTENSION_PAGES = [_continual, _sycophancy, _safety, _vision, _icl_cot]


def test_continual_learning_summary_follows_the_planted_verdicts():
    lower, higher = _continual(LOWER), _continual(HIGHER)
    assert "full fine-tuning is lower than the model before in old-chain accuracy" in lower
    assert "full fine-tuning is higher than the model before in old-chain accuracy" in higher
    assert "full fine-tuning − the model before in old-chain accuracy: not resolved" in _continual(
        OPEN
    )
    assert ("the anchor at λ = 1 is lower than full fine-tuning in old-chain accuracy (-0.200 "
            "[-0.300, -0.100]); the anchor at λ = 10 − full fine-tuning in old-chain accuracy: "
            "not resolved (+0.010 [-0.050, +0.070])") in lower
    assert ("the anchor at λ = 1 is higher than full fine-tuning in old-chain accuracy "
            "(+0.200") in higher
    assert "a random direction's: 0.012)" in lower
    # not among the page's pre-registered contrasts
    assert ("(exploratory) a frozen backbone − the model before in old-chain accuracy: "
            "not resolved (-0.010 [-0.020, +0.000])") in lower


def test_sycophancy_summary_follows_the_planted_verdicts():
    lower, higher = _sycophancy(LOWER), _sycophancy(HIGHER)
    agreeing = "in rate of agreeing with a wrong user"
    assert f"Pre-registered: RLHF with agreeable raters is higher than SFT {agreeing}" in higher
    assert f"Pre-registered: RLHF with agreeable raters is lower than SFT {agreeing}" in lower
    assert f"RLVR is lower than RLHF with agreeable raters {agreeing}" in higher
    assert f"RLVR is higher than RLHF with agreeable raters {agreeing}" in lower
    assert f"). (exploratory) RLVR is lower than SFT {agreeing}" in lower
    assert f"). (exploratory) RLVR is higher than SFT {agreeing}" in higher
    est = LOWER.estimate
    for planted in (est, -est, est + 0.001):  # each of the three contrasts prints its own value
        assert f"({planted:+.3f} " in lower
    opened = _sycophancy(OPEN)
    assert f"RLHF with agreeable raters − SFT {agreeing}: not resolved" in opened
    assert f"RLVR − RLHF with agreeable raters {agreeing}: not resolved" in opened
    assert "number in 0.300 [0.250, 0.350] of the sums" in lower


def test_safety_summary_prints_each_rate_in_its_place():
    lower, higher = _safety(LOWER), _safety(HIGHER)
    assert "start 0.300 [0.250, 0.400], refuse 0.310 [0.250, 0.400], take back 0.320" in lower
    assert "with the fact prefilled: refuse 0.730 [0.650, 0.800], take back 0.740" in higher
    assert "not resolved" not in lower + higher  # rates, no verdict


def test_safety_summary_says_once_what_several_rates_share_with_no_spread():
    none, some = Interval(0.0, 0.0, 0.0), Interval(0.9, 0.85, 0.95)
    rates = {"start": some, "refuse": none, "take back": none,
             "refuse, prefilled": Interval(1.0, 1.0, 1.0), "take back, prefilled": none}
    text = summaries.safety_summary(violations=rates, disagreements=0)
    assert ("violations of the forbidden relation: start 0.900 [0.850, 0.950], refuse and take "
            "back 0.000 in every seed; with the fact prefilled: refuse 1.000 in every seed, take "
            "back 0.000 in every seed.") in text
    assert "[0.000, 0.000]" not in text and "[1.000, 1.000]" not in text


def test_vision_summary_follows_the_planted_verdicts():
    assert "the habit model is higher than the control in that rate" in _vision(HIGHER)
    assert "the habit model is lower than the control in that rate" in _vision(LOWER)
    assert "the habit model − the control in that rate: not resolved" in _vision(OPEN)


def test_icl_cot_summary_follows_the_planted_verdicts():
    assert "CoT is lower than direct in accuracy" in _icl_cot(LOWER)
    assert "CoT is higher than direct in accuracy" in _icl_cot(HIGHER)
    assert "CoT − direct in accuracy: not resolved" in _icl_cot(OPEN)
    assert "the ICL model answers right is 0.800 [0.700, 0.900] (chance 1/9)" in _icl_cot(LOWER)
    every = summaries.icl_cot_summary(icl_right=Interval(1.0, 1.0, 1.0), cot_vs_direct=LOWER,
                                      disagreements=0)
    assert "answers right is 1.000 in every seed (chance 1/9)" in every


@pytest.mark.parametrize("summary", EXTENSION_PAGES)
def test_each_extension_page_counts_its_own_disagreements(summary):
    assert "hold 3 disagreements with the documents; each is on the [errata page]" in summary(LOWER)
    assert "hold 1 disagreement with the documents; it is on the [errata page]" in summary(LOWER, 1)
    assert summary(LOWER, 0).endswith("hold 0 disagreements with the documents.")
    with pytest.raises(ValueError, match="n must be an int >= 0"):
        summary(LOWER, -1)


def _claims(d, returned=Interval(0.01, 0.0, 0.02), prompt_tokens=40):
    conf = {"mean_conf_wrong": 0.66, "confident_wrong": 0.7, "mean_conf_right": 0.8}
    rag = [("SFT", "BM25 top 4", d, 0.4), ("SFT", "oracle", d, 0.6)]
    return summaries.hallucination_claims(
        ClaimTable("001"), hard="rare fact", hot=d, calibration=conf,
        drift=Interval(0.77, 0.7, 0.84), returned=returned, medians=[1.05, 1.0], gain_offset=6,
        gain=0.26, dpo_vs_sft=d, rlvr_vs_dpo=d,
        rag=rag, prompt_tokens=prompt_tokens, max_positions=64, hybrid=d, inference_only=d,
        reader_vs_sft=d, top1_vs_oracle=d)


def test_hallucination_claims_agree_only_where_the_measurement_says_so():
    lower, higher = _claims(LOWER), _claims(HIGHER)
    by = {c.quantity.split(":")[0]: c for c in lower.claims}
    assert len(lower.claims) == 13
    assert by["preference alignment 'reduce[s] hallucination indirectly'"].agrees
    assert by["preference alignment 'reduce[s] hallucination indirectly'"].note.startswith(
        "DPO is lower than SFT in Hall"
    )
    dpo = "preference alignment 'reduce[s] hallucination indirectly': Hall(DPO) − Hall(SFT)"
    assert not {c.quantity: c for c in higher.claims}[f"{dpo}, rare fact"].agrees
    rag = [c for c in lower.claims if c.quantity.startswith("'Hall_RAG ≪ Hall'")]
    assert [c.agrees for c in rag] == [True, False]  # the ratio 0.6 is not ≪
    assert rag[0].note.startswith("(exploratory)") and not rag[1].note.startswith("(exploratory)")
    top1 = lower.claims[-1]
    assert top1.stated == "> 0" and not top1.agrees and higher.claims[-1].agrees
    assert _claims(OPEN).claims[0].agrees is False  # "≠ 0" needs the interval off zero
    drift = {c.quantity: c for c in lower.claims if "propagates" in c.quantity}
    assert list(drift.values())[0].agrees
    overlap = _claims(LOWER, returned=Interval(0.75, 0.7, 0.8))
    assert not [c for c in overlap.claims if "propagates" in c.quantity][0].agrees
    too_long = _claims(LOWER, prompt_tokens=65).claims
    assert not [c for c in too_long if "eq. (11)" in c.quantity][0].agrees


def _reading(sft_answered=0.35, rag_follows=0.0, reader_oracle=LOWER, rag_oracle=OPEN,
             wrong=HIGHER):
    return summaries.reading_passages(
        sft_answered=sft_answered, rag_answered=1.0, rag_follows=rag_follows, rag_oracle=rag_oracle,
        reader_follows=0.16, reader_per_seed=[0.32, 0.04], reader_oracle=reader_oracle,
        reader_vs_sft=LOWER, wrong_passage=wrong)


def test_reading_passages_follows_each_planted_number():
    text = _reading()
    assert text.startswith("Shown passages it was never trained with, the SFT model answers")
    assert "in only 35% of cases" in text and "(per seed: 32%, 4%)" in text
    assert "SFT + RAG has learned the format (it answers 100% of them) but not to read" in text
    assert "(exploratory) the reader with passages is lower than SFT without" in text
    assert "a wrong first fact raises its rate by +0.200" in text
    assert text.endswith("not as the purely inference-time step 001 describes.")
    other = _reading(sft_answered=0.8, rag_follows=0.5, wrong=OPEN)
    assert other.startswith("The SFT model answers the question in 80% of cases")
    assert "SFT + RAG writes the passage's entity in 50% of the swapped answers." in other
    assert "A wrong first fact changes its knowable-chain rate by +0.010" in other
    assert not other.endswith("describes.")  # the SFT model reads the passages: no such conclusion
    assert not _reading(reader_oracle=OPEN).endswith("describes.")
    assert not _reading(rag_oracle=LOWER).endswith("describes.")
    with pytest.raises(ValueError, match="sft_answered must be a share"):
        _reading(sft_answered=35)
