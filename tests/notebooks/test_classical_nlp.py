"""Chapter 2 (notebooks/02_classical_nlp.ipynb) at scale=smoke: the claims it checks and what it computes."""

import math

import pytest

NOTEBOOK = "02_classical_nlp"
pytestmark = pytest.mark.notebook


def test_claim_tables_find_exactly_the_disagreements_recorded_in_the_errata(glue):
    assert glue["classical_metrics_disagreements"] == 1  # §2.1: the F1 equation is missing
    assert glue["classical_edit_disagreements"] == 5  # §3.1: cat 3, cart 2, two scripts, 'car' alone
    assert glue["classical_pmi_disagreements"] == 1  # §3.2 eq. 3.2 without the log
    assert glue["classical_worked_disagreements"] == 2  # §3.3 IDF = 4 and TF-IDF = 0.12 use log10
    assert glue["classical_tfidf_disagreements"] == 3  # second IDF form < 0; 'rarer'; the MI identity
    assert glue["classical_bm25_disagreements"] == 0
    assert glue["classical_rrf_disagreements"] == 0
    assert glue["classical_label_smoothing_disagreements"] == 1  # ε/K is the uniform case only
    assert glue["classical_disagreements"] == 13


def test_levenshtein_never_exceeds_insert_delete_distance_nor_half_of_it(glue):
    assert glue["classical_edit_bounds_hold"] is True


def test_pmi_of_004s_corpus_uses_row_and_column_marginals(glue):
    assert glue["classical_pmi_sat_on"] == pytest.approx(math.log(5), abs=1e-12)
    assert glue["classical_pmi_the_mat"] == pytest.approx(math.log(2.5), abs=1e-12)


def test_worked_tfidf_example_with_the_natural_log(glue):
    assert glue["classical_worked_idf"] == pytest.approx(math.log(1e4), abs=1e-12)
    assert glue["classical_worked_tfidf"] == pytest.approx(0.03 * math.log(1e4), abs=1e-12)


def test_tfidf_counter_examples_break_the_claims(glue):
    assert glue["classical_idf_second_form_at_n_eq_N"] == pytest.approx(math.log(0.5 / 10.5) + 1, abs=1e-12)
    rare, common = glue["classical_rare_vs_common_tfidf"]
    assert rare < common
    assert glue["classical_mi_gap_even"] < 1e-12  # Aizawa's identity holds under its assumptions
    assert glue["classical_mi_gap_docs"] > 1e-3  # and not without them


def test_bm25_agrees_with_bm25s_up_to_the_k1_plus_one_factor(glue):
    assert glue["classical_bm25_n_docs"] >= 100
    assert glue["classical_bm25s_max_rel_diff"] < 1e-12  # both in float64: the same formula
    assert glue["classical_bm25s_same_top10"] == 1.0


def test_reciprocal_rank_fusion_matches_the_hand_computed_example(glue):
    assert glue["classical_rrf_order"] == ["d1", "d3", "d2", "d5", "d4"]
    expected = [1 / 61 + 1 / 62, 1 / 63 + 1 / 61, 1 / 62 + 1 / 64, 1 / 63, 1 / 64]
    assert glue["classical_rrf_scores"] == pytest.approx(expected, abs=1e-15)


def test_label_smoothing_keeps_the_logit_gap_finite(glue):
    no_ls, *smoothed = glue["classical_ls_final_gaps"]  # ε = 0, 0.05, 0.1, 0.2; K = 5
    for gap, eps in zip(smoothed, (0.05, 0.1, 0.2)):
        assert gap == pytest.approx(math.log((1 - eps + eps / 5) / (eps / 5)), abs=1e-3)
    assert no_ls > smoothed[0]
    assert smoothed == sorted(smoothed, reverse=True)


# ---------------------------------------------------------------- PageRank and TextRank (004 §3.6, an empty heading)


def test_pagerank_power_iteration_is_the_google_matrix_eigenvector(glue):
    # six-page web with a dangling page, d = 0.85; oracle: numpy.linalg.eig of Gᵀ
    assert glue["cnlp_textrank_eig_max_abs"] < 1e-9
    assert glue["cnlp_textrank_residual"] < 1e-10  # |rᵀG − rᵀ| below d × the stopping tolerance
    assert glue["cnlp_textrank_power_vs_lib_max_abs"] < 1e-12  # the notebook's loop = textrank.pagerank
    assert glue["cnlp_textrank_iterations"] <= glue["cnlp_textrank_iteration_bound"] == 147
    assert glue["cnlp_textrank_top_page"] == "E"
    assert glue["cnlp_textrank_disagreements"] == 0


def test_power_iteration_change_shrinks_by_at_least_the_damping_each_step(glue):
    for d, ratio in zip(glue["cnlp_textrank_dampings"], glue["cnlp_textrank_max_change_ratio"]):
        assert 0 < ratio <= d + 1e-9


def test_textrank_keywords_of_the_fact_documents_are_relations_then_entities(glue):
    kinds, n_rel = glue["cnlp_textrank_top_kinds"], glue["cnlp_textrank_n_relations"]
    assert len(kinds) == 10 and n_rel < 10
    assert kinds[:n_rel] == ["relation"] * n_rel and kinds[n_rel:] == ["entity"] * (10 - n_rel)
    assert glue["cnlp_textrank_keywords_match_graph"] is True  # keywords() = cooccurrence_graph + pagerank


def test_textrank_on_a_cooccurrence_graph_ranks_like_frequency(glue):
    assert glue["cnlp_textrank_spearman_freq"] > 0.9
    assert glue["cnlp_textrank_top10_overlap_freq"] >= 8
    # undirected graph: as d → 1 the scores tend to the weighted-degree share (reversible walk)
    assert glue["cnlp_textrank_degree_l1_d1"] < 1e-4
    assert 0.01 < glue["cnlp_textrank_degree_l1_d085"] < 0.2


# ---------------------------------------------------------------- POS tagging with an HMM (004 §4)


def test_viterbi_reaches_the_brute_force_optimum_on_every_short_sentence(glue):
    assert glue["cnlp_hmm_bruteforce_checked"] >= 100
    assert glue["cnlp_hmm_bruteforce_mismatches"] == 0
    assert glue["cnlp_hmm_bruteforce_max_gap"] < 1e-9


def test_context_beats_any_word_only_tagger(glue):
    assert glue["cnlp_hmm_disagreements"] == 0
    assert glue["cnlp_hmm_acc_agrees_with_library"] is True  # the notebook's count = hmm.tag_accuracy
    assert glue["cnlp_hmm_errors_on_unambiguous_words"] == 0
    ceiling = glue["cnlp_hmm_word_only_ceiling"]
    assert 0.85 < ceiling < 0.9  # exact, from the grammar
    low, high = glue["cnlp_hmm_acc_mft_interval"]
    assert low <= ceiling <= high  # the most-frequent-tag baseline sits at the exact ceiling
    low_amb, high_amb = glue["cnlp_hmm_acc_ambiguous_mft_interval"]
    assert low_amb <= glue["cnlp_hmm_word_only_ceiling_ambiguous"] <= high_amb
    for key in ("true", "est"):
        assert glue[f"cnlp_hmm_acc_{key}_interval"][0] > high  # Viterbi clearly above the lookup
        assert glue[f"cnlp_hmm_acc_ambiguous_{key}"] > glue["cnlp_hmm_acc_ambiguous_mft"] + 0.2
        assert glue[f"cnlp_hmm_acc_{key}"] < 1  # ... and not perfect: some ambiguity is real


def test_estimated_tables_tag_as_well_as_the_true_ones(glue):
    low, high = glue["cnlp_hmm_acc_est_interval"]
    assert low <= glue["cnlp_hmm_acc_true"] <= high
    assert glue["cnlp_hmm_acc_est"] >= glue["cnlp_hmm_acc_mft"]


def test_estimation_error_falls_as_one_over_root_n(glue):
    for table in ("transition", "emission"):
        errors = glue[f"cnlp_hmm_curve_error_{table}"]
        assert errors[-1] < errors[0] / 5
        assert -0.7 < glue[f"cnlp_hmm_error_slope_{table}"] < -0.35
    accuracy = glue["cnlp_hmm_curve_accuracy"]
    assert accuracy[0] < accuracy[-1] and abs(accuracy[-1] - glue["cnlp_hmm_curve_accuracy_true"]) < 0.01


# -- the exercises' solutions -----------------------------------------------------------------------------------------
def test_exercise_solutions_edit_distances_of_intention_and_execution(glue):
    lev, indel, lcs = glue["classical_ex_edit"]
    assert (lev, indel, lcs) == (5, 8, 5)  # the textbook pair; indel = 9 + 9 − 2 × LCS
    assert lev <= indel <= 2 * lev


def test_exercise_solutions_pmi_of_independent_words_shrinks_with_the_corpus(glue):
    spread = glue["classical_ex_pmi_spread"]
    assert spread[0] > spread[1] > spread[2]  # zero in expectation: only noise, shrinking like 1 / √N
    assert 2 < spread[0] / spread[1] < 5 and 2 < spread[1] / spread[2] < 5  # √10 ≈ 3.2 per tenfold corpus


def test_exercise_solutions_bm25_reaches_90_percent_at_nine_k1(glue):
    assert glue["classical_ex_bm25_f90"] == pytest.approx([4.5, 10.8, 18.0], abs=1e-3)


def test_exercise_solutions_rrf_tends_to_borda_and_k_decides_the_winner(glue):
    agree, pairs = glue["classical_ex_rrf_borda"]
    assert pairs > 30 and agree == pairs  # every pair the Borda count tells apart, RRF at k = 10⁶ orders alike
    assert glue["classical_ex_rrf_winners"] == ["a", "b", "b"]  # first twice wins at k = 1; high everywhere after
