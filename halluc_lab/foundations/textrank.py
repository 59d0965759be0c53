"""PageRank by power iteration, and TextRank keywords over a word co-occurrence graph.

Chapter 2 (classical NLP). Sources: 004 §3.6 "PageRank and TextRank" is an empty heading, so the
definitions are those of Page, Brin, Motwani & Winograd 1999 ("The PageRank citation ranking:
bringing order to the web", Stanford tech. report) and Mihalcea & Tarau 2004 ("TextRank: bringing
order into texts", EMNLP), whose weighted form this is. Numpy float64 throughout; a graph is a
dense (N, N) weight matrix with weights[i, j] the weight of the edge i → j.

PageRank. Row-normalising the weights gives the transition matrix P (P[i, j] = w[i, j] / Σ_k w[i,
k]); the rank r (sum 1) is the fixed point of

    r = d · (Pᵀ r + u · Σ_{dangling i} r_i) + (1 − d) · u,      u = (1/N, ..., 1/N),

the stationary distribution of the "Google matrix" G = d (P + dangling spread) + (1 − d) teleport.
Departures and choices (each with a test in tests/unit/test_textrank.py):

- Dangling nodes (no out-weight) spread their rank uniformly over all nodes, the usual repair
  (Page et al. drop dangling links during the iteration and add them back at the end).
- Scores sum to 1. Mihalcea & Tarau's WS(V) = (1 − d) + d Σ ... sums to N on a graph without
  dangling nodes: their scores are ours × N, the ranking the same.
- Convergence: the L1 change of r between two iterations falls below ``tol`` (Mihalcea & Tarau
  stop when every node's change is below 1e-4). Each iteration shrinks the L1 error by a factor d,
  so d = 0.85 and tol = 1e-10 take about 140 iterations.

TextRank keywords. Vertices are the words left after removing stop words (Mihalcea & Tarau filter
by part of speech, which the lab has no tagger for); filtered tokens are removed *before* the
window slides, so "language of models" links "language" and "models" at window 2. Two words are
linked when they stand within ``window`` tokens of each other (window 2 = adjacent, the paper's
best setting), with weight = the number of such co-occurrences; a word is never linked to itself,
and pairs never cross a document boundary. The paper keeps the top third of the vertices and
merges adjacent keywords into phrases; here ``k`` is explicit and no phrases are formed.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import NamedTuple

import numpy as np

from halluc_lab.foundations.lexical import cooccurrence_counts


class PageRankResult(NamedTuple):
    """The outcome of :func:`pagerank`."""

    scores: np.ndarray  # (N,) float64, non-negative, sums to 1
    iterations: int  # power-iteration steps taken
    converged: bool  # whether the L1 change fell below tol within max_iter steps


def _check_weights(weights: np.ndarray) -> np.ndarray:
    """A square, finite, non-negative float64 matrix with at least one node, or a ValueError."""
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 2 or w.shape[0] != w.shape[1]:
        raise ValueError(f"weights must be a square (N, N) matrix, got shape {w.shape}")
    if w.shape[0] == 0:
        raise ValueError("weights is empty: a graph needs at least one node")
    if not np.all(np.isfinite(w)):
        raise ValueError("weights must be finite (no NaN or inf)")
    if np.any(w < 0):
        raise ValueError(f"weights must be non-negative, got min {w.min()}")
    return w


def _check_damping(damping: float) -> None:
    if isinstance(damping, bool) or not isinstance(damping, (int, float)) or not 0 < damping < 1:
        raise ValueError(f"damping must be in the open interval (0, 1), got {damping!r}")


def google_matrix(weights: np.ndarray, damping: float) -> np.ndarray:
    """G = d·S + (1 − d)/N (N, N), S the row-normalised weights with dangling rows uniform.

    The random surfer's one step, row-stochastic; :func:`pagerank` reaches its fixed point without
    building it. Example: ``google_matrix(np.array([[0, 1], [0, 0]]), 0.5)`` →
    [[0.25, 0.75], [0.5, 0.5]].
    """
    w = _check_weights(weights)
    _check_damping(damping)
    n = len(w)
    out = w.sum(axis=1, keepdims=True)  # (N, 1) out-weight of each node
    walk = np.where(out > 0, w / np.where(out > 0, out, 1.0), 1.0 / n)
    return damping * walk + (1 - damping) / n


def power_iteration(G: np.ndarray, tol: float = 1e-10,
                    max_iter: int = 1000) -> tuple[np.ndarray, list[float]]:
    """r_{t+1} = r_t G from the uniform vector, for a row-stochastic (N, N) ``G``.

    Returns r and the L1 change at every step, stopping once it is below ``tol`` (or after
    ``max_iter`` steps): the plain iteration that :func:`pagerank` runs without building G.
    """
    G = np.asarray(G, dtype=np.float64)
    if G.ndim != 2 or G.shape[0] != G.shape[1] or G.shape[0] == 0:
        raise ValueError(f"G must be a non-empty square (N, N) matrix, got shape {G.shape}")
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not (
            np.isfinite(tol) and tol > 0):
        raise ValueError(f"tol must be finite and > 0, got {tol!r}")
    if isinstance(max_iter, bool) or not isinstance(max_iter, (int, np.integer)) or max_iter < 1:
        raise ValueError(f"max_iter must be an integer >= 1, got {max_iter!r}")
    r, changes = np.full(len(G), 1.0 / len(G)), []
    for _ in range(max_iter):
        new = r @ G
        changes.append(float(np.abs(new - r).sum()))
        r = new
        if changes[-1] < tol:
            break
    return r, changes


def pagerank(weights: np.ndarray, damping: float = 0.85, tol: float = 1e-10,
             max_iter: int = 1000) -> PageRankResult:
    """PageRank of every node of a weighted directed graph by power iteration (Page et al. 1999).

    ``weights[i, j]`` is the weight of the edge i → j; each row is normalised by its out-weight,
    rows of zeros (dangling nodes) spread their rank uniformly, and with probability 1 − ``damping``
    the walk teleports to a uniformly chosen node. Starts from the uniform vector and stops when
    the L1 change is below ``tol`` or after ``max_iter`` steps (then ``converged`` is False).
    Example: ``pagerank(np.array([[0, 1], [1, 0]])).scores`` → [0.5, 0.5].
    """
    w = _check_weights(weights)
    _check_damping(damping)
    if (
        isinstance(tol, bool)
        or not isinstance(tol, (int, float))
        or not (np.isfinite(tol) and tol > 0)
    ):
        raise ValueError(f"tol must be finite and > 0, got {tol!r}")
    if isinstance(max_iter, bool) or not isinstance(max_iter, (int, np.integer)) or max_iter < 1:
        raise ValueError(f"max_iter must be an integer >= 1, got {max_iter!r}")
    n = w.shape[0]
    out_weight = w.sum(axis=1)  # (N,)
    dangling = out_weight == 0
    transition = np.divide(w, out_weight[:, None], out=np.zeros_like(w), where=~dangling[:, None])
    rank = np.full(n, 1.0 / n)
    for step in range(1, max_iter + 1):
        # rank @ transition = Pᵀ r: node j collects r_i · P[i, j] from every i pointing to it
        new = damping * (rank @ transition) + (damping * rank[dangling].sum() + 1.0 - damping) / n
        new /= new.sum()  # the sum is 1 up to rounding; keep it exactly so over many steps
        change = float(np.abs(new - rank).sum())
        rank = new
        if change < tol:
            return PageRankResult(rank, step, True)
    return PageRankResult(rank, max_iter, False)


# ---------------------------------------------------------------- TextRank (Mihalcea & Tarau 2004)


def _documents(documents: Sequence[str | Sequence[Hashable]]) -> list[list[Hashable]]:
    """Each document's tokens (a string is split on whitespace), or a ValueError for a bad
    corpus."""
    if isinstance(documents, str) or len(documents) == 0:
        what = "a single string" if isinstance(documents, str) else "an empty sequence"
        raise ValueError(f"documents must be a non-empty sequence of documents, got {what}")
    return [doc.split() if isinstance(doc, str) else list(doc) for doc in documents]


def cooccurrence_graph(documents: Sequence[str | Sequence[Hashable]], window: int = 2,
                       vocabulary: Sequence[Hashable] | None = None
                       ) -> tuple[list[Hashable], np.ndarray]:
    """The undirected word graph of TextRank: (words, weights (V, V)), weights symmetric counts.

    Each document is a list of tokens or a whitespace-separated string. Tokens not in
    ``vocabulary`` are dropped first; the remaining tokens at positions s < t with
    t − s < ``window`` add 1 to weights[a, b] and weights[b, a] (a ≠ b). ``words`` is ``vocabulary``
    in its order, or by default the sorted set of tokens. Example:
    ``cooccurrence_graph(["a b a"])`` → (["a", "b"], [[0, 2], [2, 0]]).
    """
    docs = _documents(documents)
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 2:
        raise ValueError(f"window must be an integer >= 2 (2 links adjacent words), got {window!r}")
    if vocabulary is None:
        words = sorted({t for doc in docs for t in doc})
    else:
        words = list(vocabulary)
        if len(set(words)) != len(words):
            raise ValueError("vocabulary lists a word twice")
    known = set(words)
    # lexical's forward counts (y within window − 1 tokens after x), made symmetric, without
    # self-links
    forward = cooccurrence_counts([[t for t in doc if t in known] for doc in docs], words,
                                  window=window - 1)
    weights = (forward + forward.T).astype(np.float64)
    np.fill_diagonal(weights, 0.0)
    return words, weights


def keywords(documents: Sequence[str | Sequence[Hashable]], k: int, window: int = 2,
             damping: float = 0.85,
             stopwords: Iterable[Hashable] = ()) -> list[tuple[Hashable, float]]:
    """The k best keywords as (word, PageRank score), highest first (Mihalcea & Tarau 2004).

    The graph is :func:`cooccurrence_graph` over the sorted words that are not ``stopwords``;
    fewer than k words give them all. Scores equal up to floating-point noise (12 decimals) tie,
    and ties go to the word that sorts first. Example: ``keywords(["b a c"], 1)`` → [("a", 18/37)].
    """
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    docs = _documents(documents)
    vocabulary = sorted({t for doc in docs for t in doc} - set(stopwords))
    if not vocabulary:
        raise ValueError("no words: the documents hold no token that is not a stop word")
    words, weights = cooccurrence_graph(docs, window=window, vocabulary=vocabulary)
    scores = pagerank(weights, damping=damping).scores
    order = sorted(range(len(words)), key=lambda i: (-round(float(scores[i]), 12), i))
    return [(words[i], float(scores[i])) for i in order[:k]]
