"""Chapter 1 (autoregressive language models): what the smoke run of notebooks/01_autoregressive.ipynb must show."""

import pytest

NOTEBOOK = "01_autoregressive"
pytestmark = pytest.mark.notebook

GRADIENTS = ("dz", "delta", "J", "s", "r", "W_ho", "b_o", "W_xh", "W_hh", "b_h")  # 003 (i)–(vii)


def test_claims_disagree_only_where_the_errata_say(glue):
    assert glue["autoregressive_branching_disagreements"] == 0
    assert glue["autoregressive_bigram_disagreements"] == 3  # 004: MLE denominator, "≈", eq. (2.1)
    assert glue["autoregressive_ce_disagreements"] == 0
    assert glue["autoregressive_bptt_disagreements"] == 0
    assert glue["autoregressive_sequence_probability_disagreements"] == 2  # 002: no P(x_1), float32 underflow
    assert glue["autoregressive_compute_loss_disagreements"] == 1  # 002: compute_loss reads an undefined vocab_size
    assert glue["autoregressive_disagreements"] == 6


def test_every_hand_derived_bptt_gradient_matches_autograd_in_float64(glue):
    errors = {name: glue[f"autoregressive_grad_err_{name}"] for name in GRADIENTS}
    assert all(err < 1e-8 for err in errors.values()), errors
    assert glue["autoregressive_grad_err_max"] == max(errors.values())


def test_chain_rule_one_pass_equals_the_per_prefix_loop(glue):
    assert glue["autoregressive_chain_rule_max_diff"] < 1e-4  # float32 log P(sentence), about -20


def test_cross_entropy_is_entropy_plus_kl_and_kl_ranks_the_models(glue):
    assert glue["autoregressive_ce_identity_err"] < 1e-10
    assert 0 < glue["autoregressive_kl_rnn"] < glue["autoregressive_kl_bigram"]


def test_rnn_trained_with_hand_gradients_learns_what_a_bigram_cannot(glue):
    assert glue["autoregressive_rnn_loss_last"] < glue["autoregressive_rnn_loss_first"] - 0.5
    source, rnn, bigram = (glue[f"autoregressive_heldout_ppl_{m}"] for m in ("source", "rnn", "bigram"))
    assert source < rnn < bigram  # nothing beats the true source; the RNN sees two symbols back
    assert rnn < 0.5 * glue["autoregressive_uniform_ppl"]  # far above chance


def test_mle_bigram_fails_on_unseen_bigrams_and_smoothing_fixes_it(glue):
    assert glue["autoregressive_mle_heldout_ppl_is_inf"] is True
    assert glue["autoregressive_add_k_best"] > 0
    assert glue["autoregressive_add_k_frames"] == 8 * 7  # k values × contexts


def test_impossible_transitions_teacher_forced_and_free_running(glue):
    assert glue["autoregressive_tf_error_source"] == 0.0
    assert glue["autoregressive_fr_error_source"] == 0.0
    for mode in ("tf", "fr"):
        assert 0 < glue[f"autoregressive_{mode}_error_rnn"] < 0.5 * glue[f"autoregressive_{mode}_error_bigram"]


def test_the_modes_are_compared_at_matched_positions_with_intervals(glue):
    assert glue["autoregressive_matched_diff_source"] == [0.0, 0.0, 0.0]  # the source never errs in either mode
    for name in ("rnn", "bigram"):
        est, low, high = glue[f"autoregressive_matched_diff_{name}"]
        assert -1.0 <= low <= est <= high <= 1.0
        positions, above, below = glue[f"autoregressive_matched_positions_{name}"]
        assert 1 <= positions <= 30 and above + below <= positions


# -- the exercises' solutions -----------------------------------------------------------------------------------------
def test_exercise_solutions_the_chain_rule_holds_in_both_orders(glue):
    assert max(glue["autoregressive_ex_chain_rule_error"]) < 1e-12


def test_exercise_solutions_smoothing_is_scanned_and_the_best_k_is_the_lowest_perplexity(glue):
    sm = glue["autoregressive_ex_smoothing"]
    assert len(sm["k"]) == len(sm["perplexity"]) and all(1.0 < p < 11.0 for p in sm["perplexity"])
    assert sm["best"] == sm["k"][sm["perplexity"].index(min(sm["perplexity"]))]
    assert sm["unseen"] >= 0 and sm["fewest"] >= 0 and (sm["unseen"] == 0 or sm["fewest"] == 0)
