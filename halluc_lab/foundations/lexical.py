"""Classical NLP: precision/recall/F1, edit distance, PMI, TF-IDF, BM25, reciprocal rank fusion.

Edit distance and its edit script are :mod:`halluc_lab.foundations.edits`', re-exported here so that
chapter 2 reads its toolkit from one module.

Chapter 2 (classical NLP). Sources: 004 §2.1 (precision, recall, F1), §3.1 (edit distance),
§3.2 (PMI), §3.3 (TF, IDF, TF-IDF), §3.4 (BM25), §3.5 (RRF, Cormack, Clarke & Büttcher 2009).
§3.7 (label smoothing) is ``losses.causal_lm_loss(label_smoothing=)``; §3.6 is an empty heading.
Reference implementations in numpy float64, natural logs; count matrices are (D, V) documents ×
vocabulary or (V, V) first × second word. Variants are functions passed as callables
(``tfidf(counts, tf=tf_sublinear, idf=idf_smooth)``), never string switches.

Departures from 004, and what it leaves open (each with a test in tests/unit/test_lexical.py):

- §2.1 announces "the following equation" for F1 and prints none: F1 = 2PR/(P + R), computed as
  2TP/(2TP + FP + FN), the same number whenever P + R > 0. A zero denominator gives
  ``zero_division`` (0 by default, as scikit-learn), never NaN.
- §3.2 eq. 3.2 drops the logarithm: PMI = log p(x|y)/p(x) = log p(y|x)/p(y). The marginals are
  unnamed: here p(x) is the row sum (x as the first word of a forward pair) and p(y) the column
  sum (y as the second word), both over the total count of pairs. A pair never seen has PMI
  −inf (its true value) and PPMI 0.
- §3.3's worked example says "log_e" and then log(10,000,000 / 1,000) = 4: 4 is log10. With
  log_e the IDF is 9.21 and TF-IDF 0.276, not 0.12.
- §3.3's second IDF, "log (N − n + 0.5)/(n + 0.5) + 1", read as printed (+1 outside the log) is
  negative for common terms (N = n = 10: −2.04), against its own claim that IDF ≥ 0. The form
  libraries use is Lucene's log(1 + (N − n + 0.5)/(n + 0.5)) (``idf_bm25``), always > 0.
- §3.3's smoothing "numerator 1 + N, denominator 1 + df" is ``idf_smooth`` as scikit-learn
  writes it: ln((1 + N)/(1 + df)) + 1. Its log-scaled tf is log(1 + f) (``tf_log1p``); the
  sublinear 1 + log f of Manning et al. is ``tf_sublinear``.
- §3.4 leaves IDF(q) open; ``bm25_scores`` defaults to Lucene's ``idf_bm25`` and keeps 004's
  (k1 + 1) factor, which bm25s drops: its scores are ours / (k1 + 1), rankings identical.
  rank-bm25's BM25Okapi uses ``idf_robertson`` but replaces negative idfs by 0.25 × the mean idf.
- §3.5: r(d) is the 1-based rank; a document missing from a ranking adds nothing for it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from numbers import Real

import numpy as np

# re-exported: chapter 2 reads its toolkit from this module
from halluc_lab.foundations.edits import Edit, apply_edits, edit_distance  # noqa: F401
from halluc_lab.foundations.edits import edit_script, edit_table  # noqa: F401

# ---------------------------------------------------------------- precision, recall, F1 (§2.1)


@dataclass(frozen=True)
class PRF:
    """Precision, recall and F1 of one prediction."""

    precision: float  # TP / (TP + FP): of what was predicted, the share that was relevant
    recall: float  # TP / (TP + FN): of what was relevant, the share that was found
    f1: float  # harmonic mean 2PR / (P + R)


def _check_count(name: str, value: int) -> None:
    """A ValueError unless ``value`` is a non-negative integer."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")


def _check_tokens(name: str, tokens: object, what: str = "tokens") -> None:
    """TypeError unless ``tokens`` is a sequence of items: a str would be read letter by letter."""
    if isinstance(tokens, (str, bytes)) or not isinstance(tokens, Iterable):
        kind = type(tokens).__name__
        got = "a str, read letter by letter" if isinstance(tokens, (str, bytes)) else kind
        raise TypeError(f"{name} must be a sequence of {what}, got {got}")


def precision_recall_f1(tp: int, fp: int, fn: int, *, zero_division: float = 0.0) -> PRF:
    """Precision, recall and F1 from counts; a 0/0 gives ``zero_division``.

    Example: ``precision_recall_f1(3, 1, 2)`` → PRF(0.75, 0.6, 0.667).
    """
    for name, value in (("tp", tp), ("fp", fp), ("fn", fn)):
        _check_count(name, value)

    def ratio(num: int, den: int) -> float:
        return float(num / den) if den else float(zero_division)
    return PRF(ratio(tp, tp + fp), ratio(tp, tp + fn), ratio(2 * tp, 2 * tp + fp + fn))


def precision_recall_f1_sets(predicted: Iterable[Hashable], relevant: Iterable[Hashable], *,
                             zero_division: float = 0.0) -> PRF:
    """Precision, recall and F1 of a predicted set against the relevant set."""
    _check_tokens("predicted", predicted, "items")
    _check_tokens("relevant", relevant, "items")
    pred, rel = set(predicted), set(relevant)
    return precision_recall_f1(len(pred & rel), len(pred - rel), len(rel - pred),
                               zero_division=zero_division)


# ---------------------------------------------------------------- PMI (§3.2)


def cooccurrence_counts(sentences: Sequence[Sequence[Hashable]], vocab: Sequence[Hashable], *,
                        window: int = 1) -> np.ndarray:
    """Forward co-occurrence counts (V, V): C[x, y] = times y follows x within ``window`` tokens.

    Pairs never cross a sentence boundary (004's table counts "mat" → "the" zero times).
    """
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
        raise ValueError(f"window must be an integer >= 1, got {window!r}")
    _check_tokens("sentences", sentences, "sentences")
    for i, sentence in enumerate(sentences):
        _check_tokens(f"sentences[{i}]", sentence)
    index = {w: i for i, w in enumerate(vocab)}
    counts = np.zeros((len(vocab), len(vocab)), dtype=np.int64)
    for sentence in sentences:
        missing = [w for w in sentence if w not in index]
        if missing:
            raise ValueError(f"tokens not in vocab: {missing[:5]}")
        for t, x in enumerate(sentence):
            for y in sentence[t + 1:t + 1 + window]:
                counts[index[x], index[y]] += 1
    return counts


def _check_counts(counts: np.ndarray, ndim: int, name: str = "counts") -> np.ndarray:
    """A finite, non-negative float64 array of ``ndim`` dimensions, or a ValueError."""
    arr = np.asarray(counts, dtype=np.float64)
    if arr.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError(f"{name} must be finite and non-negative")
    return arr


def pmi(counts: np.ndarray, *, add_k: float = 0.0, context_alpha: float = 1.0) -> np.ndarray:
    """PMI[x, y] = log p(x, y) / (p(x) p(y)) from a joint count matrix (X, Y), natural log.

    p(x, y) = C[x, y] / ΣC; p(x) = row sum / ΣC; p(y) = column sum / ΣC. Smoothing: ``add_k``
    adds k to every cell first (Laplace); ``context_alpha`` < 1 raises the column counts to α
    and renormalises (Levy, Goldberg & Dagan 2015 use 0.75). Never-seen pairs give −inf.
    Example: ``pmi([[1, 0], [0, 1]])`` → [[log 2, −inf], [−inf, log 2]].
    """
    c = _check_counts(counts, 2)
    real = lambda x: isinstance(x, Real) and not isinstance(x, bool)
    if not (real(add_k) and math.isfinite(add_k) and add_k >= 0):
        raise ValueError(f"add_k must be finite and >= 0, got {add_k!r}")
    if not (real(context_alpha) and 0 < context_alpha <= 1):
        raise ValueError(f"context_alpha must be in (0, 1], got {context_alpha!r}")
    c = c + add_k
    total = c.sum()
    if total <= 0:
        raise ValueError("counts sum to zero: no pairs to estimate probabilities from")
    p_xy = c / total
    p_x = c.sum(axis=1, keepdims=True) / total  # (X, 1)
    cols = c.sum(axis=0, keepdims=True) ** context_alpha
    p_y = cols / cols.sum()  # (1, Y)
    out = np.full(c.shape, -np.inf)
    seen = p_xy > 0  # implies p_x > 0 and p_y > 0: no 0/0
    out[seen] = np.log(p_xy[seen]) - np.log((p_x * p_y)[seen])
    return out


def ppmi(counts: np.ndarray, *, add_k: float = 0.0, context_alpha: float = 1.0) -> np.ndarray:
    """Positive PMI: max(PMI, 0), so never-seen pairs are 0 rather than −inf."""
    return np.maximum(pmi(counts, add_k=add_k, context_alpha=context_alpha), 0.0)


# ---------------------------------------------------------------- TF, IDF, TF-IDF (§3.3)


def term_counts(docs: Sequence[Sequence[Hashable]]) -> tuple[np.ndarray, list[Hashable]]:
    """Counts f[d, t] (D, V) of each term in each document, and the sorted vocabulary."""
    _check_tokens("docs", docs, "documents")
    for i, doc in enumerate(docs):
        _check_tokens(f"docs[{i}]", doc)
    if len(docs) == 0:
        raise ValueError("docs is empty: a corpus needs at least one document")
    vocab = sorted({t for doc in docs for t in doc})
    index = {t: i for i, t in enumerate(vocab)}
    counts = np.zeros((len(docs), len(vocab)), dtype=np.int64)
    for d, doc in enumerate(docs):
        for t, f in Counter(doc).items():
            counts[d, index[t]] = f
    return counts, vocab


def tf_raw(counts: np.ndarray) -> np.ndarray:
    """tf = f (the raw count)."""
    return _check_counts(counts, 2)


def tf_boolean(counts: np.ndarray) -> np.ndarray:
    """tf = 1 if the term occurs in the document, else 0."""
    return (_check_counts(counts, 2) > 0).astype(np.float64)


def tf_relative(counts: np.ndarray) -> np.ndarray:
    """tf = f / (number of tokens in the document); an empty document's row stays 0."""
    f = _check_counts(counts, 2)
    length = f.sum(axis=1, keepdims=True)  # (D, 1)
    return np.divide(f, length, out=np.zeros_like(f), where=length > 0)


def tf_log1p(counts: np.ndarray) -> np.ndarray:
    """tf = log(1 + f), 004's "logarithmically scaled frequency"."""
    return np.log1p(_check_counts(counts, 2))


def tf_sublinear(counts: np.ndarray) -> np.ndarray:
    """tf = 1 + log f for f > 0, else 0 (Manning et al.; scikit-learn's sublinear_tf)."""
    f = _check_counts(counts, 2)
    return np.where(f > 0, 1.0 + np.log(np.where(f > 0, f, 1.0)), 0.0)


def tf_augmented(counts: np.ndarray) -> np.ndarray:
    """tf = 0.5 + 0.5 f / max_t' f[d, t'], as 004 writes it (absent terms get 0.5)."""
    f = _check_counts(counts, 2)
    peak = f.max(axis=1, keepdims=True) if f.shape[1] else np.zeros((f.shape[0], 1))
    if np.any(peak == 0):
        raise ValueError(f"documents {np.flatnonzero(peak[:, 0] == 0).tolist()} are empty: "
                         "augmented tf divides by the largest count")
    return 0.5 + 0.5 * f / peak


def document_frequency(counts: np.ndarray) -> np.ndarray:
    """df[t] (V,): the number of documents containing term t."""
    return (_check_counts(counts, 2) > 0).sum(axis=0)


def _check_df(df: np.ndarray, n_docs: int) -> np.ndarray:
    """df as float64 in [0, n_docs], or a ValueError naming the bound."""
    if isinstance(n_docs, bool) or not isinstance(n_docs, (int, np.integer)) or n_docs < 1:
        raise ValueError(f"n_docs must be an integer >= 1, got {n_docs!r}")
    arr = _check_counts(df, 1, "df")
    if np.any(arr > n_docs):
        raise ValueError(f"df must be in [0, n_docs={n_docs}], got max {arr.max()}")
    return arr


def idf_plain(df: np.ndarray, n_docs: int) -> np.ndarray:
    """idf = log(N / df); every df must be >= 1 (004: "this will lead to a division-by-zero")."""
    d = _check_df(df, n_docs)
    if np.any(d == 0):
        raise ValueError("idf_plain needs df >= 1; terms "
                         f"{np.flatnonzero(d == 0).tolist()[:5]} have df 0 "
                         "(use idf_smooth)")
    return np.log(n_docs / d)


def idf_smooth(df: np.ndarray, n_docs: int) -> np.ndarray:
    """idf = ln((1 + N) / (1 + df)) + 1, scikit-learn's smooth_idf; defined at df = 0."""
    return np.log((1 + n_docs) / (1 + _check_df(df, n_docs))) + 1.0


def idf_bm25(df: np.ndarray, n_docs: int) -> np.ndarray:
    """idf = log(1 + (N − df + 0.5) / (df + 0.5)), Lucene's BM25 idf (bm25s "lucene");
    always > 0."""
    d = _check_df(df, n_docs)
    return np.log1p((n_docs - d + 0.5) / (d + 0.5))


def idf_robertson(df: np.ndarray, n_docs: int) -> np.ndarray:
    """idf = log((N − df + 0.5) / (df + 0.5)), Robertson–Spärck Jones; negative when df > N/2."""
    d = _check_df(df, n_docs)
    return np.log((n_docs - d + 0.5) / (d + 0.5))


def idf_okapi(df: np.ndarray, n_docs: int, epsilon: float = 0.25) -> np.ndarray:
    """rank-bm25's BM25Okapi idf: Robertson's, with each negative value replaced by ε × the mean
    idf."""
    idf = idf_robertson(df, n_docs)
    if isinstance(epsilon, bool) or not isinstance(epsilon, Real) or not math.isfinite(epsilon):
        raise ValueError(f"epsilon must be a finite number, got {epsilon!r}")
    return np.where(idf < 0, epsilon * idf.mean(), idf)


TF = Callable[[np.ndarray], np.ndarray]
IDF = Callable[[np.ndarray, int], np.ndarray]


def tfidf(counts: np.ndarray, *, tf: TF = tf_relative, idf: IDF = idf_plain) -> np.ndarray:
    """TF-IDF weights (D, V) = tf(counts) · idf(df, D), 004 §3.3.1.

    Example: ``tfidf(term_counts([["a", "b"], ["a"]])[0])`` → [[0, 0.347], [0, 0]].
    """
    c = _check_counts(counts, 2)
    if c.shape[0] == 0:
        raise ValueError("counts has no documents")
    return tf(c) * idf(document_frequency(c), c.shape[0])[None, :]


# ---------------------------------------------------------------- BM25 (§3.4)


def check_bm25_parameters(k1: float, b: float) -> None:
    """ValueError unless k1 is a finite number >= 0 and b a number in [0, 1]."""
    if isinstance(k1, bool) or not (isinstance(k1, Real) and math.isfinite(k1) and k1 >= 0):
        raise ValueError(f"k1 must be finite and >= 0, got {k1!r}")
    if isinstance(b, bool) or not (isinstance(b, Real) and 0 <= b <= 1):
        raise ValueError(f"b must be in [0, 1], got {b!r}")


def check_k(k: int, name: str = "k") -> None:
    """ValueError unless ``k`` (a count of results, a batch size) is an integer >= 1."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {k!r}")


def bm25_scores(query: Sequence[Hashable], corpus: Sequence[Sequence[Hashable]], *, k1: float = 1.5,
                b: float = 0.75, idf: IDF = idf_bm25) -> np.ndarray:
    """Okapi BM25 score (D,) of every document for ``query``, 004 §3.4:

        Σ_q idf(q) · f(q, D)(k1 + 1) / (f(q, D) + k1 (1 − b + b |D| / avgdl))

    A repeated query term counts each time (the sum runs over q_1..q_n). ``idf`` is called on
    the df of the whole vocabulary, so corpus-wide rules (rank-bm25's floor) fit. Terms absent
    from the corpus add 0.
    """
    check_bm25_parameters(k1, b)
    _check_tokens("query", query)
    _check_tokens("corpus", corpus, "documents")
    counts, vocab = term_counts(corpus)  # (D, V)
    lengths = counts.sum(axis=1).astype(np.float64)  # (D,)
    if lengths.sum() == 0:
        raise ValueError("corpus has no tokens: the average document length is 0")
    norm = k1 * (1 - b + b * lengths / lengths.mean())  # (D,)
    weights = idf(document_frequency(counts), len(corpus))  # (V,)
    index = {t: i for i, t in enumerate(vocab)}
    scores = np.zeros(len(corpus))
    for q in query:
        if q in index:
            f = counts[:, index[q]].astype(np.float64)  # (D,)
            # f = 0 adds 0; skipping it avoids 0/0 when k1 = 0 or (b = 1) the document is empty
            sat = np.divide(f * (k1 + 1), f + norm, out=np.zeros_like(f), where=f > 0)
            scores += weights[index[q]] * sat
    return scores


def top_k(scores: np.ndarray, k: int) -> list[tuple[int, float]]:
    """The k best (index, score) pairs, highest first; ties go to the lower index."""
    check_k(k)
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim != 1 or np.isnan(s).any():
        raise ValueError(f"scores must be a 1-D array without NaN, got shape {s.shape}")
    order = np.argsort(-s, kind="stable")[:k]
    return [(int(i), float(s[i])) for i in order]


def bm25_top_k(query: Sequence[Hashable], corpus: Sequence[Sequence[Hashable]], k: int, *,
               k1: float = 1.5, b: float = 0.75, idf: IDF = idf_bm25) -> list[tuple[int, float]]:
    """The k best documents for ``query`` as (document index, BM25 score), highest first."""
    return top_k(bm25_scores(query, corpus, k1=k1, b=b, idf=idf), k)


# ---------------------------------------------------------------- reciprocal rank fusion (§3.5)


def reciprocal_rank_fusion(rankings: Sequence[Sequence[Hashable]], *,
                           k: float = 60.0) -> list[tuple[Hashable, float]]:
    """Fuse rankings (best first): RRF(d) = Σ_r 1 / (k + r(d)), r 1-based; Cormack et al. 2009.

    Returns (item, score), highest first; equal scores keep the order of first appearance.
    Sums use math.fsum, so equal sets of ranks tie exactly. Example:
    ``reciprocal_rank_fusion([["a", "b"], ["b"]])`` → [("b", 1/62 + 1/61), ("a", 1/61)].
    """
    if isinstance(k, bool) or not isinstance(k, Real) or not (math.isfinite(k) and k > 0):
        raise ValueError(f"k must be finite and > 0, got {k!r}")
    _check_tokens("rankings", rankings, "rankings")
    if len(rankings) == 0:
        raise ValueError("rankings is empty: nothing to fuse")
    parts: dict[Hashable, list[float]] = {}
    for n, ranking in enumerate(rankings):
        _check_tokens(f"rankings[{n}]", ranking, "items")
        if len(set(ranking)) != len(ranking):
            raise ValueError(f"ranking {n} lists an item twice")
        for rank, item in enumerate(ranking, start=1):
            parts.setdefault(item, []).append(1.0 / (k + rank))
    fused = [(item, math.fsum(p)) for item, p in parts.items()]
    return sorted(fused, key=lambda pair: -pair[1])  # sorted is stable: ties keep first appearance
