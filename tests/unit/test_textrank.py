"""halluc_lab.foundations.textrank: PageRank by power iteration and TextRank keywords (004 §3.6, an empty heading)."""

import math

import numpy as np
import pytest

from halluc_lab.foundations.textrank import (PageRankResult, cooccurrence_graph, google_matrix,
                                             keywords, pagerank, power_iteration)

# ---------------------------------------------------------------- PageRank


def _random_graph(seed: int, n: int, density: float = 0.3, n_dangling: int = 0) -> np.ndarray:
    """Random non-negative weights (N, N) with about ``density`` of the edges and some empty rows."""
    rng = np.random.default_rng(seed)
    w = rng.uniform(0.1, 5.0, size=(n, n)) * (rng.random((n, n)) < density)
    w[rng.choice(n, size=n_dangling, replace=False)] = 0.0  # dangling: no out-edges at all
    return w


def _stationary(weights: np.ndarray, damping: float) -> np.ndarray:
    """The oracle: the eigenvector for eigenvalue 1 of the Google matrix, built independently.

    G[i, j] = d · (w[i, j] / out_i, or 1/N when i is dangling) + (1 − d) / N is row-stochastic;
    its stationary distribution π solves πG = π, i.e. Gᵀπ = π, the leading eigenvector.
    """
    n = len(weights)
    out = weights.sum(axis=1, keepdims=True)
    walk = np.where(out > 0, weights / np.where(out > 0, out, 1.0), 1.0 / n)
    google = damping * walk + (1 - damping) / n
    assert np.allclose(google.sum(axis=1), 1.0)
    values, vectors = np.linalg.eig(google.T)
    leading = vectors[:, np.argmax(values.real)].real
    return leading / leading.sum()


@pytest.mark.parametrize("seed, n, n_dangling", [(0, 1, 0), (1, 1, 1), (2, 2, 1), (3, 5, 0), (4, 5, 2),
                                                  (5, 12, 3), (6, 30, 0), (7, 30, 10), (8, 40, 39)])
@pytest.mark.parametrize("damping", [0.5, 0.85, 0.95])
def test_pagerank_is_the_stationary_distribution_of_the_google_matrix(seed, n, n_dangling, damping):
    w = _random_graph(seed, n, n_dangling=n_dangling)
    result = pagerank(w, damping=damping)
    assert isinstance(result, PageRankResult) and result.converged
    assert result.scores.shape == (n,) and np.all(result.scores >= 0)
    assert result.scores.sum() == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_allclose(result.scores, _stationary(w, damping), atol=1e-9)


def test_iterations_follow_the_contraction_rate_and_max_iter_reports_no_convergence():
    w = _random_graph(11, 20, n_dangling=4)
    # each step shrinks the L1 error by d; the first change is at most 2, so d^t · 2 < tol bounds t
    bound = math.ceil(math.log(1e-10 / 2) / math.log(0.85)) + 1
    assert pagerank(w).iterations <= bound
    stopped = pagerank(w, max_iter=1)
    assert (stopped.iterations, stopped.converged) == (1, False)
    assert stopped.scores.sum() == pytest.approx(1.0)


def _cycle(n: int) -> np.ndarray:
    return np.roll(np.eye(n), 1, axis=1) + np.roll(np.eye(n), -1, axis=1)


CUBE = np.array([[(i ^ j).bit_count() == 1 for j in range(8)] for i in range(8)], dtype=float)  # 3-regular


@pytest.mark.parametrize("weights", [_cycle(6), 3.0 * (np.ones((5, 5)) - np.eye(5)), CUBE],
                         ids=["cycle", "complete", "cube"])
@pytest.mark.parametrize("damping", [0.3, 0.85, 0.99])
def test_a_symmetric_regular_graph_gives_uniform_scores(weights, damping):
    # every node has the same weighted degree, so the uniform vector is already stationary
    scores = pagerank(weights, damping=damping).scores
    np.testing.assert_allclose(scores, np.full(len(weights), 1 / len(weights)), atol=1e-12)


def test_small_damping_tends_to_the_teleport_only_limit():
    # r − u = d (walk(r) − u), and both are distributions, so ‖r − u‖₁ ≤ 2d: uniform as d → 0
    w = _random_graph(21, 15, n_dangling=3)
    uniform = np.full(15, 1 / 15)
    errors = [np.abs(pagerank(w, damping=d).scores - uniform).sum() for d in (0.5, 1e-2, 1e-4, 1e-8)]
    assert all(e <= 2 * d for e, d in zip(errors, (0.5, 1e-2, 1e-4, 1e-8)))
    assert errors == sorted(errors, reverse=True) and errors[-1] < 1e-7


@pytest.mark.parametrize("directed", [False, True])
def test_the_hub_of_a_star_ranks_first_and_the_leaves_tie(directed):
    w = np.zeros((6, 6))
    w[1:, 0] = 1.0  # every leaf points to the hub
    if not directed:
        w[0, 1:] = 1.0  # ... and back (in the directed star the hub is dangling)
    scores = pagerank(w).scores
    assert np.argmax(scores) == 0
    np.testing.assert_allclose(scores[1:], scores[1], rtol=1e-12)
    if not directed:  # undirected star, closed form: r_hub = (1 − d)/N + d · 5 r_leaf, r_leaf = (1 − r_hub)/5
        assert scores[0] == pytest.approx((0.15 / 6 + 0.85) / (1 + 0.85))


def test_scaling_a_nodes_out_weights_changes_nothing():
    # each row is normalised by its out-weight: only the proportions of a node's edges matter
    w = _random_graph(31, 10, density=0.6, n_dangling=2)
    scaled = w * np.arange(1, 11)[:, None]
    np.testing.assert_allclose(pagerank(scaled).scores, pagerank(w).scores, atol=1e-12)


@pytest.mark.parametrize("weights, kwargs, message", [
    (np.ones((2, 3)), {}, "square"),
    (np.ones(4), {}, "square"),
    (np.ones((2, 2, 2)), {}, "square"),
    (np.zeros((0, 0)), {}, "empty"),
    (np.array([[0.0, -1.0], [1.0, 0.0]]), {}, "non-negative"),
    (np.array([[0.0, np.nan], [1.0, 0.0]]), {}, "finite"),
    (np.array([[0.0, np.inf], [1.0, 0.0]]), {}, "finite"),
    (np.ones((2, 2)), {"damping": 0.0}, "damping"),
    (np.ones((2, 2)), {"damping": 1.0}, "damping"),
    (np.ones((2, 2)), {"damping": -0.2}, "damping"),
    (np.ones((2, 2)), {"damping": float("nan")}, "damping"),
    (np.ones((2, 2)), {"tol": 0.0}, "tol"),
    (np.ones((2, 2)), {"max_iter": 0}, "max_iter"),
])
def test_pagerank_rejects_bad_input(weights, kwargs, message):
    with pytest.raises(ValueError, match=message):
        pagerank(weights, **kwargs)


@pytest.mark.parametrize("seed, n, n_dangling", [(0, 1, 0), (4, 5, 2), (7, 30, 10)])
@pytest.mark.parametrize("damping", [0.5, 0.85])
def test_power_iteration_on_the_google_matrix_reaches_pagerank_contracting_by_d(seed, n, n_dangling,
                                                                                damping):
    w = _random_graph(seed, n, n_dangling=n_dangling)
    G = google_matrix(w, damping)
    np.testing.assert_allclose(G.sum(axis=1), 1.0, atol=1e-12)  # row-stochastic
    assert G.min() >= (1 - damping) / n - 1e-15  # every entry gets the teleport
    r, changes = power_iteration(G)
    assert changes[-1] < 1e-10 <= min(changes[:-1], default=1.0)  # stops at the first below tol
    assert all(b <= damping * a + 1e-15 for a, b in zip(changes, changes[1:]))
    np.testing.assert_allclose(r, pagerank(w, damping=damping).scores, atol=1e-9)
    np.testing.assert_allclose(r, _stationary(w, damping), atol=1e-9)


def test_google_matrix_spreads_a_dangling_row_uniformly():
    G = google_matrix(np.array([[0.0, 1.0], [0.0, 0.0]]), 0.5)
    np.testing.assert_allclose(G, [[0.25, 0.75], [0.5, 0.5]])


@pytest.mark.parametrize("call, message", [
    (lambda: google_matrix(np.ones((2, 3)), 0.85), "square"),
    (lambda: google_matrix(np.array([[0.0, -1.0], [1.0, 0.0]]), 0.85), "non-negative"),
    (lambda: google_matrix(np.ones((2, 2)), 1.0), "damping"),
    (lambda: power_iteration(np.ones((2, 3))), "square"),
    (lambda: power_iteration(np.zeros((0, 0))), "square"),
    (lambda: power_iteration(np.eye(2), tol=0.0), "tol"),
    (lambda: power_iteration(np.eye(2), max_iter=0), "max_iter"),
])
def test_google_matrix_and_power_iteration_reject_bad_input(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# ---------------------------------------------------------------- co-occurrence graph


def test_cooccurrence_counts_pairs_within_the_window_symmetrically():
    words, w = cooccurrence_graph([["a", "b", "c", "a"]], window=3)
    assert words == ["a", "b", "c"]
    # pairs at distance 1 or 2: a-b, a-c, b-c, b-a, c-a
    np.testing.assert_array_equal(w, [[0, 2, 2], [2, 0, 1], [2, 1, 0]])
    assert np.array_equal(w, w.T)


def test_strings_are_split_documents_are_separate_and_words_never_link_to_themselves():
    words, w = cooccurrence_graph(["x y", "z x x"])
    words_list, w_list = cooccurrence_graph([["x", "y"], ["z", "x", "x"]])
    assert words == words_list and np.array_equal(w, w_list)
    assert words == ["x", "y", "z"]
    # y and z never share a document; "x x" adds no self-loop
    np.testing.assert_array_equal(w, [[0, 1, 1], [1, 0, 0], [1, 0, 0]])


def test_words_outside_the_vocabulary_are_removed_before_the_window_slides():
    words, w = cooccurrence_graph(["language of models"], vocabulary=["models", "language"])
    assert words == ["models", "language"]  # the vocabulary's order
    np.testing.assert_array_equal(w, [[0, 1], [1, 0]])  # linked across the dropped "of"


@pytest.mark.parametrize("documents, kwargs, message", [
    ("a single string", {}, "single string"),
    ([], {}, "empty"),
    (["a b"], {"window": 1}, "window"),
    (["a b"], {"window": 2.0}, "window"),
    (["a b"], {"vocabulary": ["a", "a"]}, "twice"),
])
def test_cooccurrence_graph_rejects_bad_input(documents, kwargs, message):
    with pytest.raises(ValueError, match=message):
        cooccurrence_graph(documents, **kwargs)


# ---------------------------------------------------------------- keywords

CORPUS = [
    "the model predicts the next token",
    "a language model learns from text",
    "the model hallucinates facts",
    "text without facts",
]
STOPWORDS = {"the", "a", "from", "without", "next"}


def test_keywords_of_a_tiny_corpus():
    # Without stop words the graph is: model–predicts–token, language–model–learns–text–facts,
    # model–hallucinates–facts. "model" co-occurs with four words, every other word with at most
    # two. On an undirected graph the walk without teleport visits a word in proportion to its
    # weighted degree (its number of co-occurrences); teleport pulls toward uniform but does not
    # lift a degree-2 word over a degree-4 one, and "token"/"language" (degree 1) come last.
    # Degree is not all: "token" beats "language" because its one neighbour, "predicts", splits
    # its rank two ways, while "model" splits its larger rank four ways.
    top = keywords(CORPUS, k=1, stopwords=STOPWORDS)
    assert [word for word, _ in top] == ["model"]
    ranked = keywords(CORPUS, k=20, stopwords=STOPWORDS)
    assert [w for w, _ in ranked] == ["model", "predicts", "facts", "text", "hallucinates", "learns",
                                      "token", "language"]
    # swapping text↔facts and learns↔hallucinates maps the graph onto itself: exact ties, word order
    scores = dict(ranked)
    assert scores["facts"] == pytest.approx(scores["text"], rel=1e-12)
    assert scores["hallucinates"] == pytest.approx(scores["learns"], rel=1e-12)
    assert sum(s for _, s in ranked) == pytest.approx(1.0)
    assert [s for _, s in ranked] == sorted((s for _, s in ranked), reverse=True)


def test_keywords_match_pagerank_on_the_graph_and_ties_go_to_word_order():
    assert keywords(["b a c"], 1) == [("a", pytest.approx(18 / 37))]  # the hub of a 3-star, closed form
    # "x" and "y" are symmetric, so their scores tie and the word that sorts first comes first
    assert [w for w, _ in keywords(["y x"], 2)] == ["x", "y"]
    assert [w for w, _ in keywords(["c a b", "b a c"], 3)] == ["a", "b", "c"]
    assert len(keywords(["one two"], k=10)) == 2  # fewer words than k: all of them


@pytest.mark.parametrize("documents, kwargs, message", [
    (["a b"], {"k": 0}, "k must be"),
    (["a b"], {"k": True}, "k must be"),
    ("a b", {"k": 1}, "single string"),
    (["the of", ""], {"k": 1, "stopwords": {"the", "of"}}, "stop word"),
    ([], {"k": 1}, "empty"),
    (["a b"], {"k": 1, "damping": 1.0}, "damping"),
])
def test_keywords_rejects_bad_input(documents, kwargs, message):
    with pytest.raises(ValueError, match=message):
        keywords(documents, **kwargs)
