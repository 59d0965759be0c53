"""halluc_lab.foundations.lexical and .edits: precision/recall/F1, edit distance, PMI, TF-IDF, BM25 and RRF (004 §2.1, §3)."""

import math
from collections import deque
from functools import cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from halluc_lab.foundations.edits import Edit, apply_edits, edit_distance, edit_script, edit_table
from halluc_lab.foundations.lexical import (
    bm25_scores,
    bm25_top_k,
    cooccurrence_counts,
    document_frequency,
    idf_bm25,
    idf_plain,
    idf_okapi,
    idf_robertson,
    idf_smooth,
    pmi,
    ppmi,
    precision_recall_f1,
    precision_recall_f1_sets,
    reciprocal_rank_fusion,
    term_counts,
    tf_augmented,
    tf_boolean,
    tf_log1p,
    tf_raw,
    tf_relative,
    tf_sublinear,
    tfidf,
    top_k,
)

# ---------------------------------------------------------------- precision, recall, F1


def test_precision_recall_f1_from_counts_and_f1_is_the_harmonic_mean():
    prf = precision_recall_f1(3, 1, 2)
    assert (prf.precision, prf.recall) == (0.75, 0.6)
    # 004 §2.1 promises "the following equation" for F1 and prints none: the harmonic mean.
    assert prf.f1 == pytest.approx(2 * 0.75 * 0.6 / (0.75 + 0.6))


def test_sets_give_the_same_numbers_as_counts():
    prf = precision_recall_f1_sets({"a", "b", "c", "x"}, {"a", "b", "c", "y", "z"})
    assert prf == precision_recall_f1(3, 1, 2)


def test_zero_denominators_give_zero_division_never_nan():
    assert precision_recall_f1(0, 0, 0) == precision_recall_f1(0, 0, 0, zero_division=0.0)
    assert precision_recall_f1(0, 0, 0).f1 == 0.0
    assert precision_recall_f1(0, 0, 3, zero_division=1.0).precision == 1.0


@pytest.mark.parametrize("tp,fp,fn", [(-1, 0, 0), (1, 2.5, 0), (True, 0, 0)])
def test_negative_or_non_integer_counts_are_rejected(tp, fp, fn):
    with pytest.raises(ValueError, match="non-negative integer"):
        precision_recall_f1(tp, fp, fn)


# ---------------------------------------------------------------- edit distance

DICTIONARY = ["cat", "car", "cart", "care", "cards", "cast"]


def test_004_spelling_example_stated_distances_are_the_insert_delete_only_distances():
    # 004 §3.1 states carr→cat 3, car 1, cart 2: exactly the insert/delete-only distances.
    indel = {w: edit_distance("carr", w, substitution=False) for w in DICTIONARY}
    assert indel == {"cat": 3, "car": 1, "cart": 2, "care": 2, "cards": 3, "cast": 4}
    assert min(indel, key=indel.get) == "car"  # 004's conclusion holds for this distance


def test_004_spelling_example_levenshtein_ties_car_with_cart_and_care():
    # With substitution (Levenshtein) the numbers differ: cat 2 (not 3), cart 1 (not 2),
    # and "car" no longer wins alone. Errata for 004 §3.1.
    lev = {w: edit_distance("carr", w) for w in DICTIONARY}
    assert lev == {"cat": 2, "car": 1, "cart": 1, "care": 1, "cards": 2, "cast": 2}
    assert sorted(w for w in lev if lev[w] == 1) == ["car", "care", "cart"]


def test_004_spelling_explanations_are_swapped_between_car_and_cart():
    # "car: 1 (replace second r with t)" -- that substitution produces cart; car is one deletion.
    assert [e.op for e in edit_script("carr", "car") if e.op != "keep"] == ["delete"]
    assert [e for e in edit_script("carr", "cart") if e.op != "keep"] == [Edit("substitute", "r", "t")]
    # "cart: 2 (insert t and delete second r)" is the insert/delete-only script.
    assert sorted(e.op for e in edit_script("carr", "cart", substitution=False) if e.op != "keep") == \
        ["delete", "insert"]


def test_edit_table_matches_the_textbook_kitten_sitting_table():
    table = edit_table("kitten", "sitting")
    assert table.shape == (7, 8)
    assert table[-1, -1] == 3
    assert table[0].tolist() == list(range(8)) and table[:, 0].tolist() == list(range(7))


def test_edit_distance_works_on_token_sequences():
    assert edit_distance(["the", "cat", "sat"], ["the", "dog", "sat", "down"]) == 2


def _neighbours(s: str, alphabet: str, max_len: int):
    for i in range(len(s)):
        yield s[:i] + s[i + 1:]  # delete
        for c in alphabet:
            yield s[:i] + c + s[i + 1:]  # substitute
    if len(s) < max_len:
        for i in range(len(s) + 1):
            for c in alphabet:
                yield s[:i] + c + s[i:]  # insert


@cache
def _bfs(source: str, substitution: bool) -> dict[str, int]:
    """Shortest number of single edits from source to every string of length <= 5 over 'abc'."""
    dist, queue = {source: 0}, deque([source])
    while queue:
        s = queue.popleft()
        for t in _neighbours(s, "abc", 5):
            if not substitution and len(t) == len(s):
                continue  # a substitution: not allowed in the insert/delete-only distance
            if t not in dist:
                dist[t] = dist[s] + 1
                queue.append(t)
    return dist


short = st.text(alphabet="abc", max_size=4)


@settings(max_examples=200, deadline=None)
@given(short, short, st.booleans())
def test_edit_distance_equals_breadth_first_search_over_single_edits(a, b, substitution):
    assert edit_distance(a, b, substitution=substitution) == _bfs(a, substitution)[b]


@settings(max_examples=200, deadline=None)
@given(short, short, short, st.booleans())
def test_edit_distance_is_a_metric_with_the_triangle_inequality(a, b, c, substitution):
    def d(x, y):
        return edit_distance(x, y, substitution=substitution)

    assert d(a, c) <= d(a, b) + d(b, c)
    assert d(a, b) == d(b, a)
    assert (d(a, b) == 0) == (a == b)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="abc", max_size=7), st.text(alphabet="abc", max_size=7), st.booleans())
def test_edit_script_turns_a_into_b_with_as_many_edits_as_the_distance(a, b, substitution):
    script = edit_script(a, b, substitution=substitution)
    assert "".join(apply_edits(a, script)) == b
    assert sum(e.op != "keep" for e in script) == edit_distance(a, b, substitution=substitution)
    assert substitution or all(e.op != "substitute" for e in script)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="abc", max_size=7), st.text(alphabet="abc", max_size=7))
def test_levenshtein_is_at_most_the_indel_distance_and_at_least_half_of_it(a, b):
    lev, indel = edit_distance(a, b), edit_distance(a, b, substitution=False)
    assert lev <= indel <= 2 * lev
    assert (indel - len(a) - len(b)) % 2 == 0  # indel = |a| + |b| − 2·LCS


def test_apply_edits_rejects_a_script_for_another_string():
    with pytest.raises(ValueError, match="does not match"):
        apply_edits("dog", edit_script("cat", "cart"))


# ---------------------------------------------------------------- PMI

PMI_VOCAB = ["the", "cat", "dog", "sat", "on", "mat"]
TABLE_004 = np.array([[0, 1, 1, 0, 0, 2],  # 004 §3.2's forward co-occurrence matrix
                      [0, 0, 0, 1, 0, 0],
                      [0, 0, 0, 1, 0, 0],
                      [0, 0, 0, 0, 2, 0],
                      [2, 0, 0, 0, 0, 0],
                      [0, 0, 0, 0, 0, 0]])


def _sentences():
    return [s.lower().split() for s in ("The cat sat on the mat", "The dog sat on the mat")]


def test_004_cooccurrence_table_is_recomputed_from_its_corpus():
    assert cooccurrence_counts(_sentences(), PMI_VOCAB).tolist() == TABLE_004.tolist()


def test_pmi_of_the_004_table_uses_row_and_column_marginals():
    p = pmi(TABLE_004)
    # 10 forward pairs; "the" starts 4 of them, "cat" ends 1, ("the", "cat") is 1 pair.
    assert p[0, 1] == pytest.approx(math.log((1 / 10) / ((4 / 10) * (1 / 10))))
    assert p[3, 4] == pytest.approx(math.log((2 / 10) / ((2 / 10) * (2 / 10))))
    assert p[5, 0] == -math.inf  # "mat" never starts a pair: −inf, not NaN
    assert not np.isnan(p).any()


def test_004_eq_3_2_needs_the_log_pmi_is_log_of_p_y_given_x_over_p_y():
    p_xy, p_x, p_y = 1 / 10, 4 / 10, 1 / 10  # ("the", "cat")
    assert pmi(TABLE_004)[0, 1] == pytest.approx(math.log((p_xy / p_x) / p_y))
    assert pmi(TABLE_004)[0, 1] != pytest.approx((p_xy / p_x) / p_y)  # 004 eq. 3.2 as printed


def test_004_word_frequency_marginals_change_pmi_and_do_not_vanish_for_independent_words():
    # 004 §3.2: "P(x) is the probability of the occurrence of word x in the corpus" (12 words),
    # while p(x, y) counts the 10 forward pairs; the table's own marginals are its row and
    # column sums.
    words = np.array([sum(s.count(w) for s in _sentences()) for w in PMI_VOCAB])  # the: 4, ...
    p_word = words / words.sum()
    with np.errstate(divide="ignore"):
        by_words = np.log((TABLE_004 / TABLE_004.sum()) / np.outer(p_word, p_word))
    sat, on, the = PMI_VOCAB.index("sat"), PMI_VOCAB.index("on"), PMI_VOCAB.index("the")
    assert pmi(TABLE_004)[sat, on] == pytest.approx(math.log(5)) == pmi(TABLE_004)[on, the]
    assert by_words[sat, on] == pytest.approx(math.log(7.2))
    assert by_words[on, the] == pytest.approx(math.log(3.6))
    assert (round(math.log(7.2), 3), round(math.log(3.6), 3)) == (1.974, 1.281)
    # Independent words: pair counts the product of the table's row and column sums.
    independent = np.outer(TABLE_004.sum(1), TABLE_004.sum(0)) / TABLE_004.sum()
    seen = independent > 0
    assert np.abs(pmi(independent)[seen]).max() < 1e-12
    with np.errstate(divide="ignore"):
        by_words = np.log((independent / independent.sum()) / np.outer(p_word, p_word))
    assert np.abs(by_words[seen]).max() == pytest.approx(0.365, abs=5e-4)


def test_ppmi_is_pmi_clipped_at_zero_and_finite():
    assert np.array_equal(ppmi(TABLE_004), np.maximum(pmi(TABLE_004), 0))
    assert np.isfinite(ppmi(TABLE_004)).all() and ppmi(TABLE_004).min() == 0


def test_pmi_smoothing_makes_every_cell_finite_and_alpha_one_is_plain():
    assert np.isfinite(pmi(TABLE_004, add_k=1.0)).all()
    assert np.array_equal(pmi(TABLE_004, context_alpha=1.0), pmi(TABLE_004))
    # α < 1 raises the probability of rare contexts, lowering their PMI (Levy et al. 2015).
    assert pmi(TABLE_004, context_alpha=0.75)[0, 1] < pmi(TABLE_004)[0, 1]


@pytest.mark.parametrize("counts,kwargs,match", [
    (np.array([[1, -1], [0, 1]]), {}, "non-negative"),
    (np.array([1, 2, 3]), {}, "2-D"),
    (np.zeros((2, 2)), {}, "sum to zero"),
    (TABLE_004, {"add_k": -1.0}, "add_k"),
    (TABLE_004, {"context_alpha": 0.0}, "context_alpha"),
])
def test_pmi_rejects_bad_counts_and_settings(counts, kwargs, match):
    with pytest.raises(ValueError, match=match):
        pmi(counts, **kwargs)


# ---------------------------------------------------------------- TF and IDF


def test_004_worked_tfidf_example_uses_log10_while_it_says_log_e():
    # 004 §3.3.1: 'cat' 3 times in 100 words, in 1,000 of 10,000,000 documents; "log_e ... = 4".
    tf = 3 / 100
    df, n = np.array([1_000]), 10_000_000
    assert tf == pytest.approx(0.03)
    assert idf_plain(df, n)[0] == pytest.approx(9.2103, abs=1e-4)  # log_e, as 004 says
    assert math.log10(n / df[0]) == pytest.approx(4.0)  # the 4 that 004 prints
    assert tf * idf_plain(df, n)[0] == pytest.approx(0.2763, abs=1e-4)  # not 0.12


def test_004_bm25_idf_with_plus_one_outside_the_log_goes_negative():
    n, df = 10, 10
    as_printed = math.log((n - df + 0.5) / (df + 0.5)) + 1  # 004 §3.3, +1 outside the log
    assert as_printed == pytest.approx(-2.0445, abs=1e-4) and as_printed < 0
    assert idf_bm25(np.array([df]), n)[0] > 0  # Lucene: log(1 + ratio) is always positive
    assert idf_robertson(np.array([6]), n)[0] < 0  # the bare ratio's log: negative past N/2


def test_idf_variants_on_a_small_corpus():
    df, n = np.array([1, 2, 4]), 4
    assert idf_plain(df, n) == pytest.approx(np.log([4, 2, 1]))
    assert idf_smooth(df, n) == pytest.approx(np.log(5 / np.array([2, 3, 5])) + 1)  # scikit-learn
    assert idf_bm25(df, n) == pytest.approx(np.log(1 + np.array([3.5 / 1.5, 2.5 / 2.5, 0.5 / 4.5])))
    assert idf_smooth(np.array([0]), n)[0] == pytest.approx(math.log(5) + 1)  # defined at df 0


def test_tf_variants_on_one_document():
    counts = np.array([[3, 1, 0]])
    assert tf_raw(counts).tolist() == [[3, 1, 0]]
    assert tf_boolean(counts).tolist() == [[1, 1, 0]]
    assert tf_relative(counts) == pytest.approx(np.array([[0.75, 0.25, 0]]))
    assert tf_log1p(counts) == pytest.approx(np.log([[4, 2, 1]]))
    assert tf_sublinear(counts) == pytest.approx(np.array([[1 + math.log(3), 1, 0]]))
    assert tf_augmented(counts) == pytest.approx(np.array([[1.0, 0.5 + 0.5 / 3, 0.5]]))


def test_tfidf_of_a_small_corpus_by_hand():
    docs = [["the", "cat", "sat"], ["the", "dog"], ["the", "cat", "cat"]]
    counts, vocab = term_counts(docs)
    assert vocab == ["cat", "dog", "sat", "the"]
    assert document_frequency(counts).tolist() == [2, 1, 1, 3]
    w = tfidf(counts)
    assert w[:, vocab.index("the")] == pytest.approx(np.zeros(3))  # in every document: idf 0
    assert w[2, vocab.index("cat")] == pytest.approx(2 / 3 * math.log(3 / 2))
    assert w[1, vocab.index("dog")] == pytest.approx(1 / 2 * math.log(3))
    assert tfidf(counts, tf=tf_raw, idf=idf_smooth)[2, 0] == pytest.approx(2 * (math.log(4 / 3) + 1))


@pytest.mark.parametrize("call,match", [
    (lambda: term_counts([]), "empty"),
    (lambda: idf_plain(np.array([0, 1]), 2), "df >= 1"),
    (lambda: idf_bm25(np.array([3]), 2), r"\[0, n_docs=2\]"),
    (lambda: idf_bm25(np.array([1]), 0), "n_docs"),
    (lambda: tf_augmented(np.array([[1, 0], [0, 0]])), "empty"),
    (lambda: tf_relative(np.array([[1, -2]])), "non-negative"),
])
def test_tf_idf_reject_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ---------------------------------------------------------------- BM25


def _zipf_corpus(n_docs=200, n_vocab=60, seed=0):
    """Documents of 5..29 tokens from a seeded Zipfian vocabulary: some terms in > half the docs."""
    rng = np.random.default_rng(seed)
    vocab = [f"w{i}" for i in range(n_vocab)]
    p = 1 / np.arange(1, n_vocab + 1)
    return [list(rng.choice(vocab, size=rng.integers(5, 30), p=p / p.sum())) for _ in range(n_docs)]


QUERY = ["w0", "w3", "w11", "w29", "w47"]
PARAMS = [(1.5, 0.75), (1.2, 0.3), (2.0, 1.0), (0.9, 0.0)]  # (k1, b)


def _queries(n=20, n_vocab=60, seed=1):
    """Seeded queries of 3..5 distinct terms drawn uniformly from the vocabulary (rare and common
    alike), plus QUERY, a repeated term (counts twice), one rare term (many exact ties) and a
    term absent from the corpus (adds nothing)."""
    rng = np.random.default_rng(seed)
    vocab = [f"w{i}" for i in range(n_vocab)]
    drawn = [list(rng.choice(vocab, size=rng.integers(3, 6), replace=False)) for _ in range(n)]
    return [*drawn, QUERY, ["w5", "w5", "w7"], ["w40"], ["w2", "not-in-corpus", "w19"]]


def _tol(ours, rtol):
    """An absolute tolerance: ``rtol`` of the largest score (zero scores compare exactly to it)."""
    return rtol * max(float(np.abs(ours).max()), 1e-300)


def _assert_same_ranking(ours, theirs, rtol):
    """Both score vectors order all documents the same way, ties explicit: walking the documents
    in our order (equal scores by lower index), two neighbours tied in ours (within ``rtol`` of the
    top score) are tied in theirs, and a step down in ours is a step down in theirs. Returns the
    number of tied neighbours, so a test can show that its corpus has ties to check."""
    ours, theirs = np.asarray(ours, dtype=np.float64), np.asarray(theirs, dtype=np.float64)
    order = np.argsort(-ours, kind="stable")
    a, b = ours[order], theirs[order]
    tied_ours = (a[:-1] - a[1:]) <= _tol(ours, rtol)
    tied_theirs = np.abs(b[:-1] - b[1:]) <= _tol(theirs, rtol)
    assert np.array_equal(tied_ours, tied_theirs), f"ties differ at ranks {np.flatnonzero(tied_ours != tied_theirs)}"
    assert np.all(b[:-1][~tied_ours] > b[1:][~tied_ours]), "a step down in ours is not one in theirs"
    return int(tied_ours.sum())


def _assert_same_top_k(ours, k, their_ids, their_scores, rtol, scale=1.0):
    """A peer's top k (ids, scores best first) is ours (:func:`top_k`, ties to the lower index) up
    to the order of tied documents: k distinct documents, our score at every rank, and wherever the
    two lists name different documents, theirs has the same score in ours as ours (a tie). Returns
    the number of ranks where the lists differ only by such a tie."""
    mine = top_k(ours, k)
    ids = [int(i) for i in their_ids]
    assert len(ids) == len(set(ids)) == len(mine)
    np.testing.assert_allclose(np.asarray(their_scores, dtype=np.float64) * scale, [s for _, s in mine],
                               rtol=rtol, atol=_tol(ours, rtol))
    swapped = 0
    for rank, (theirs, (my_id, my_score)) in enumerate(zip(ids, mine)):
        if theirs != my_id:
            assert abs(ours[theirs] - my_score) <= _tol(ours, rtol), f"rank {rank}: {theirs} vs {my_id}, not tied"
            swapped += 1
    return swapped


def test_bm25_matches_the_004_formula_by_hand():
    corpus = [["a", "b", "a"], ["b", "c"], ["c"]]
    k1, b = 1.2, 0.75
    avgdl = 2.0
    idf_a = math.log(1 + (3 - 1 + 0.5) / 1.5)
    expected = idf_a * 2 * (k1 + 1) / (2 + k1 * (1 - b + b * 3 / avgdl))
    assert bm25_scores(["a"], corpus, k1=k1, b=b) == pytest.approx([expected, 0, 0])


def test_bm25_with_plain_idf_is_bm25s_atire_exactly_scores_and_rankings():
    # The lab keeps 004's (k1 + 1) numerator, as bm25s "atire" does; atire's idf is log(N / df),
    # the lab's idf_plain. Same variant, same k1 and b: the same scores, bit for bit in float64.
    bm25s = pytest.importorskip("bm25s")
    corpus = _zipf_corpus()
    ties = 0
    for k1, b in PARAMS:
        for dtype, rtol in (("float64", 1e-12), ("float32", 1e-6)):  # bm25s's default is float32
            index = bm25s.BM25(method="atire", k1=k1, b=b, dtype=dtype)
            index.index(corpus, show_progress=False)
            for query in _queries():
                ours = bm25_scores(query, corpus, k1=k1, b=b, idf=idf_plain)
                theirs = index.get_scores(query)
                np.testing.assert_allclose(theirs, ours, rtol=rtol, atol=_tol(ours, rtol))
                ties += _assert_same_ranking(ours, theirs, rtol)
                ids, scores = index.retrieve([query], k=20, show_progress=False)
                _assert_same_top_k(ours, 20, ids[0], scores[0], rtol)
            if dtype == "float64":
                assert np.array_equal(index.get_scores(QUERY), bm25_scores(QUERY, corpus, k1=k1, b=b, idf=idf_plain))
    assert ties > 0  # the corpus has exactly tied documents, so the tie handling is exercised


def test_bm25_equals_bm25s_lucene_up_to_the_k1_plus_one_factor_it_drops():
    # The lab's default idf is Lucene's (idf_bm25); bm25s "lucene" uses it too but drops the
    # (k1 + 1) numerator: its scores are ours / (k1 + 1), a constant per (k1, b), so rankings agree.
    bm25s = pytest.importorskip("bm25s")
    corpus = _zipf_corpus()
    swapped = 0
    for k1, b in PARAMS:
        for dtype, rtol in (("float64", 1e-12), ("float32", 1e-6)):
            index = bm25s.BM25(method="lucene", k1=k1, b=b, dtype=dtype)
            index.index(corpus, show_progress=False)
            for query in _queries():
                ours = bm25_scores(query, corpus, k1=k1, b=b)
                theirs = index.get_scores(query)
                np.testing.assert_allclose(ours / (k1 + 1), theirs, rtol=rtol, atol=_tol(theirs, rtol))
                _assert_same_ranking(ours, theirs, rtol)
                ids, scores = index.retrieve([query], k=10, show_progress=False)
                mine = bm25_top_k(query, corpus, 10, k1=k1, b=b)
                assert mine == top_k(ours, 10)
                swapped += _assert_same_top_k(ours, 10, ids[0], scores[0], rtol, scale=k1 + 1)
    assert swapped > 0  # bm25s orders some tied documents differently from top_k: only ties may differ


def test_bm25_equals_bm25s_robertson_with_negative_idf_clipped_to_zero():
    bm25s = pytest.importorskip("bm25s")
    corpus = _zipf_corpus()

    def clipped(df, n):  # bm25s "robertson": log(max(ratio, 1))
        return np.maximum(idf_robertson(df, n), 0.0)

    for k1, b in PARAMS:
        index = bm25s.BM25(method="robertson", k1=k1, b=b, dtype="float64")
        index.index(corpus, show_progress=False)
        for query in _queries():
            ours = bm25_scores(query, corpus, k1=k1, b=b, idf=clipped)
            theirs = index.get_scores(query)
            np.testing.assert_allclose(ours / (k1 + 1), theirs, rtol=1e-12, atol=_tol(theirs, 1e-12))
            _assert_same_ranking(ours, theirs, 1e-12)


def test_bm25_equals_rank_bm25_okapi_with_its_epsilon_floor_and_differs_without():
    rank_bm25 = pytest.importorskip("rank_bm25")
    corpus = _zipf_corpus()
    for k1, b in PARAMS:
        okapi = rank_bm25.BM25Okapi(corpus, k1=k1, b=b, epsilon=0.25)
        for query in _queries():
            ours = bm25_scores(query, corpus, k1=k1, b=b, idf=idf_okapi)
            theirs = okapi.get_scores(query)
            np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=_tol(ours, 1e-12))
            _assert_same_ranking(ours, theirs, 1e-12)
    okapi = rank_bm25.BM25Okapi(corpus, k1=1.5, b=0.75, epsilon=0.25)
    theirs = okapi.get_scores(QUERY)
    # w0 is in more than half the documents: the plain Robertson idf is negative there, and
    # rank-bm25's floor (documented difference) changes both scores and ranking.
    assert document_frequency(term_counts(corpus)[0])[0] > 100
    plain = bm25_scores(QUERY, corpus, idf=idf_robertson)
    assert not np.allclose(plain, theirs)
    # On terms in at most half the documents the two formulas coincide exactly.
    rare = ["w11", "w29", "w47"]
    np.testing.assert_allclose(bm25_scores(rare, corpus, idf=idf_robertson), okapi.get_scores(rare),
                               rtol=1e-12)


def test_bm25_b_zero_ignores_length_and_k1_zero_is_idf_of_present_terms():
    corpus = [["a"], ["a", "x", "y", "z"], ["x"]]
    assert bm25_scores(["a"], corpus, b=0.0)[0] == pytest.approx(bm25_scores(["a"], corpus, b=0.0)[1])
    idf_a = idf_bm25(np.array([2]), 3)[0]
    assert bm25_scores(["a"], corpus, k1=0.0) == pytest.approx([idf_a, idf_a, 0])


def test_bm25_gives_an_empty_document_zero_not_nan_even_with_b_one():
    scores = bm25_scores(["a"], [["a", "b"], []], b=1.0)
    assert scores[1] == 0 and np.isfinite(scores).all()


def test_bm25_unknown_or_empty_query_scores_zero():
    corpus = [["a", "b"], ["c"]]
    assert bm25_scores(["zzz"], corpus).tolist() == [0, 0]
    assert bm25_scores([], corpus).tolist() == [0, 0]


def test_top_k_breaks_ties_by_lower_index_and_caps_at_the_corpus_size():
    assert top_k(np.array([1.0, 3.0, 3.0, 0.5]), 3) == [(1, 3.0), (2, 3.0), (0, 1.0)]
    assert len(top_k(np.array([1.0, 2.0]), 10)) == 2


@pytest.mark.parametrize("kwargs,match", [
    ({"k1": -0.1}, "k1"), ({"k1": math.inf}, "k1"), ({"b": 1.5}, r"b must be in \[0, 1\]"),
    ({"b": -0.01}, r"b must be in \[0, 1\]"),
])
def test_bm25_rejects_k1_and_b_out_of_range(kwargs, match):
    with pytest.raises(ValueError, match=match):
        bm25_scores(["a"], [["a"]], **kwargs)


def test_bm25_rejects_an_empty_corpus_and_one_without_tokens_and_k_below_one():
    with pytest.raises(ValueError, match="empty"):
        bm25_scores(["a"], [])
    with pytest.raises(ValueError, match="no tokens"):
        bm25_scores(["a"], [[], []])
    with pytest.raises(ValueError, match="k must be an integer >= 1"):
        bm25_top_k(["a"], [["a"]], 0)


# ---------------------------------------------------------------- reciprocal rank fusion


def test_rrf_matches_hand_computed_scores_and_breaks_exact_ties_by_first_appearance():
    fused = reciprocal_rank_fusion([["a", "b", "c"], ["b", "c", "a"], ["c", "a", "d"]])
    # a: ranks 1, 3, 2; c: ranks 3, 2, 1 -> the same sum exactly; b: 2, 1; d: 3.
    assert [item for item, _ in fused] == ["a", "c", "b", "d"]
    scores = dict(fused)
    assert scores["a"] == scores["c"] == pytest.approx(1 / 61 + 1 / 62 + 1 / 63)
    assert scores["b"] == pytest.approx(1 / 62 + 1 / 61)
    assert scores["d"] == pytest.approx(1 / 63)


def test_rrf_with_one_ranking_keeps_its_order_and_small_k_favours_the_top():
    assert [d for d, _ in reciprocal_rank_fusion([["x", "y", "z"]])] == ["x", "y", "z"]
    # one first place vs two fourth places: k = 60 prefers the consensus, k = 1 the winner.
    rankings = [["p", "a", "b", "q"], ["c", "d", "e", "q"]]
    assert reciprocal_rank_fusion(rankings)[0][0] == "q"
    assert reciprocal_rank_fusion(rankings, k=1)[0][0] == "p"


@pytest.mark.parametrize("rankings,k,match", [
    ([["a"]], 0, "k must be"), ([["a"]], -5, "k must be"), ([], 60, "empty"),
    ([["a", "a"]], 60, "twice"),
])
def test_rrf_rejects_bad_input(rankings, k, match):
    with pytest.raises(ValueError, match=match):
        reciprocal_rank_fusion(rankings, k=k)


# -- a str where a sequence of tokens is expected is read letter by letter: refused by name --------
CORPUS = [["a", "b"], ["b", "c"]]


@pytest.mark.parametrize("call,name", [
    (lambda: bm25_scores("ab", CORPUS), "query"),
    (lambda: bm25_scores(None, CORPUS), "query"),
    (lambda: bm25_scores(["a"], "abc"), "corpus"),
    (lambda: bm25_scores(["a"], ["a b", "b c"]), r"docs\[0\]"),
    (lambda: term_counts("abc"), "docs"),
    (lambda: cooccurrence_counts(["ab"], ["a", "b"]), r"sentences\[0\]"),
    (lambda: reciprocal_rank_fusion(["ab", "ba"]), r"rankings\[0\]"),
    (lambda: precision_recall_f1_sets("ab", "bc"), "predicted"),
])
def test_a_string_where_tokens_are_expected_is_refused_by_name(call, name):
    with pytest.raises(TypeError, match=f"^{name} must be a sequence of"):
        call()


@pytest.mark.parametrize("call,match", [
    (lambda: top_k(np.array([1.0, np.nan, 2.0]), 2), "scores must be a 1-D array without NaN"),
    (lambda: idf_okapi(np.array([1, 2]), 3, epsilon=math.nan), "epsilon must be a finite number"),
    (lambda: pmi([[1, 0], [0, 1]], add_k=None), "add_k must be finite"),
    (lambda: pmi([[1, 0], [0, 1]], context_alpha="1"), r"context_alpha must be in \(0, 1\]"),
])
def test_nan_and_non_numbers_are_refused_by_name(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_numpy_integers_are_accepted_where_python_ints_are():
    assert reciprocal_rank_fusion([["a"]], k=np.int64(60)) == reciprocal_rank_fusion([["a"]], k=60)
    sents, vocab = [["a", "b"]], ["a", "b"]
    want = cooccurrence_counts(sents, vocab)
    assert (cooccurrence_counts(sents, vocab, window=np.int64(1)) == want).all()
    assert type(precision_recall_f1(np.int64(3), 1, 2).precision) is float
