"""Chapter 11 (notebooks/11_hallucination_rag.ipynb) at scale=smoke: 001's definitions, decoding, calibration and the
singleton rate on toys computed exactly or by seeded Monte Carlo; then the book's kb_walk models measured on a fixed
set of distinct held-out prompts — hallucination by kind of prompt, decoding, calibration, training counts, a forced
wrong token followed through the network, and retrieval-augmented generation; and the exercises' solutions."""

import math

import pytest

from tests.notebooks.harness import preregistered
from tests.notebooks.test_verdicts import old_verdicts

NOTEBOOK = "11_hallucination_rag"
pytestmark = pytest.mark.notebook


def test_the_evaluation_set_is_fixed_distinct_and_split_by_kind(glue):
    assert glue["hall_n_heldout"] == glue["hall_n_heldout_distinct"] >= 100
    assert glue["hall_n_longer"] == glue["hall_n_longer_distinct"] >= 20
    counts = glue["hall_kind_counts"]
    assert sum(counts.values()) == glue["hall_n_heldout"]
    assert counts["knowable"] > 0 and counts["rare fact"] + counts["unseen gap"] > 0  # both easy and hard prompts


def test_outcome_shares_are_rates_and_greedy_decoding_is_the_same_run_twice(glue):
    for arm in glue["hall_arms"]:
        key = arm.replace(" + ", "_").replace(" ", "_")
        shares = [glue[f"hall_{key}_all_held_out_{m}"][0] for m in ("correct", "wrong", "abstained")]
        assert sum(shares) == pytest.approx(1.0, abs=1e-9)
        for m in ("correct", "wrong", "abstained"):
            est, low, high = glue[f"hall_{key}_all_held_out_{m}"]
            assert 0.0 <= low <= est <= high <= 1.0
    # the decoding sweep reuses the greedy answers: the same estimate by construction
    assert glue["hall_decode_SFT_greedy_wrong"][0] == glue["hall_SFT_all_held_out_wrong"][0]


def test_claim_level_hallucination_never_exceeds_the_answer_level(glue):
    # a false claim makes the answer wrong; an answer can be wrong with no false claim (it stops short)
    assert glue["hall_claim_level_sft"] <= glue["hall_answer_level_sft"] + 1e-12
    assert glue["hall_answer_level_sft"] - glue["hall_claim_level_sft"] <= glue["hall_stops_short_sft"] + 1e-12


def test_calibration_errors_are_between_zero_and_one(glue):
    for arm in ("SFT", "DPO", "RLVR"):
        assert 0.0 <= glue[f"hall_calib_{arm}_ece"] <= 1.0
        assert all(0.0 <= e <= 1.0 for e in glue[f"hall_calib_{arm}_ece_per_seed"])


def test_a_swapped_token_cannot_reach_earlier_positions(glue):
    assert glue["hall_prop_before_change"] == 0.0  # causal mask: exactly zero, not approximately
    at_change = glue["hall_prop_at_change"]
    assert at_change[0] > 0  # the embeddings of two different tokens differ
    medians = glue["hall_jac_block_median"]
    assert all(m > 0 for m in medians)


def test_the_singleton_rate_comes_from_the_worlds_counts(glue):
    sr, share = glue["hall_singleton_rate"], glue["hall_singleton_share"]
    assert 0.0 < sr < share < 1.0  # occurrences weigh common facts by their count, distinct facts do not
    leading, full = glue["hall_singleton_bound"]
    assert leading == pytest.approx(sr) and 0.0 <= full <= leading


def test_retrieval_recall_grows_with_k_and_hop_by_hop_retrieval_finds_every_fact(glue):
    for name in ("BM25", "dense", "fused"):
        for which in ("first", "every"):
            r = [glue[f"hall_recall_{name}_{which}_{k}"] for k in (1, 2, 4, 8)]
            assert all(0.0 <= x <= 1.0 for x in r) and r == sorted(r)
    # BM25 on "entity relation" ranks that pair's own passage first (it alone shares both terms), so one query per
    # hop finds every fact the gold walk needs
    assert glue["hall_ex_multihop_recall"] == 1.0


def test_the_rag_follow_counts_cover_every_swapped_prompt(glue):
    a, b = glue["hall_rag_follow_SFT"], glue["hall_rag_follow_SFT_RAG"]
    assert sum(a.values()) == sum(b.values()) > 0


def test_exercise_solutions(glue):
    assert glue["hall_ex_tau"] == pytest.approx(2 / math.log(9), rel=1e-12)
    assert glue["hall_ex_p_wrong"] == pytest.approx(0.1, rel=1e-9)
    assert glue["hall_ex_ece"] == pytest.approx(0.3, abs=1e-12)


def test_the_claim_tables_were_counted(glue):
    assert isinstance(glue["hall_disagreements"], int) and glue["hall_disagreements"] >= 0


def test_the_toy_definitions_and_decoding_are_exact(glue):
    # H of the seven hand-written completions: all supported, one contradicted, abstention only, unsupported, right
    # then abstains, malformed, empty (the empty conjunction is true)
    assert glue["hall_toy_H_cases"] == [0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    exact, from_lists, sampled, se = glue["hall_toy_model_hall"]
    assert exact == from_lists == 0.3125  # probabilities in twentieths: exact in binary
    assert abs(sampled - exact) < 4 * se
    assert glue["hall_toy_pi_change"] == 0.0  # the logits are never touched
    low, high = glue["hall_toy_hall_range"]
    assert high - low > 0.1  # while Hall moves with the decoding rule
    assert glue["hall_toy_closed_form_gap"] < 1e-12  # P(wrong) = σ(−Δ/τ) for two answers


def test_the_toy_calibration_and_good_turing_checks(glue):
    lab, hand = glue["hall_toy_ece_hand"]
    assert lab == pytest.approx(hand, abs=1e-12)
    mean, sd, se = glue["hall_toy_ece_overconfident"]
    assert mean == pytest.approx(1 / 6, abs=4 * se + 1e-3)  # confidence √p against accuracy p, p uniform: 1/6
    calibrated = glue["hall_toy_ece_calibrated_by_n"]
    assert calibrated == sorted(calibrated, reverse=True) and calibrated[-1] > 0  # a finite-sample bias, ∝ 1/√n
    for exact_sr, exact_mm, n in zip(glue["hall_toy_gt_exact_sr"], glue["hall_toy_gt_exact_mm"], glue["hall_toy_gt_Ns"]):
        assert abs(exact_sr - exact_mm) <= 1 / n  # Good–Turing: E[N1/N] − E[missing mass] is at most 1/N
    assert glue["hall_toy_disagreements"] == 0


def test_abstention_by_confidence_covers_every_answer_once(glue):
    counts = glue["hall_sft_conf_bin_counts"]
    assert sum(counts) == glue["hall_n_heldout"] * len(glue["hall_seeds"])  # every prompt and seed in one bin
    for arm in ("SFT", "DPO", "RLVR"):
        shares = glue[f"hall_abstain_by_sft_conf_{arm}"]
        assert len(shares) == len(counts)
        assert all((n == 0 and math.isnan(x)) or (n > 0 and 0.0 <= x <= 1.0) for x, n in zip(shares, counts))


def test_the_alignment_verdicts_follow_their_intervals(glue):
    for key, (a, b) in {"hall_dpo_minus_sft_hard": ("DPO", "SFT"),
                        "hall_rlvr_minus_dpo_hard": ("RLVR", "DPO")}.items():
        est, low, high = glue[key]
        said = glue[key + "_verdict"]
        assert said.startswith(f"{a} ")
        assert (f"is lower than {b} in Hall" in said) == (high < 0), key
        assert (f"is higher than {b} in Hall" in said) == (low > 0), key
        assert (f"{a} − {b} in Hall" in said and "not resolved" in said) == (low <= 0 <= high), key
        assert glue[key + "_bootstrap"] == [est, low, high]  # one seed: the bootstrap is primary


def test_no_glued_verdict_says_no_difference_resolved(glue):
    assert not old_verdicts(glue)


# The opening section's pre-registered contrasts, each with the direction it predicts. At smoke
# scale every arm they compare is trained, so all seven are computed and glued.
PREREGISTERED = {"SFT: τ = 1.5 − greedy": "higher", "DPO − SFT": "lower", "RLVR − DPO": "lower",
                 "SFT: oracle passages − none": "higher",
                 "the reader: oracle passages − none": "lower",
                 "the reader: fused top 4 − BM25 top 4": "lower",
                 "the reader: BM25 top 1 − oracle": "higher"}


def test_the_preregistered_contrasts_are_glued_with_their_predictions(glue):
    # the records are the intervals the chapter's other glued values and verdicts come from
    preregistered(glue, PREREGISTERED, seeds=len(glue["hall_seeds"]), same_as={
        "DPO − SFT": "hall_dpo_minus_sft_hard", "RLVR − DPO": "hall_rlvr_minus_dpo_hard",
        "SFT: τ = 1.5 − greedy": "hall_decode_sft_tau15_minus_greedy_wrong"})
