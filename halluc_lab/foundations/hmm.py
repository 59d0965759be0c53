"""A hidden Markov model for part-of-speech tags: a synthetic grammar, sampling, MLE, Viterbi.

Chapter 2 (classical NLP). Source: 004 ch. 4 "POS Tagging", whose §4.1 only says what tagging is
("labeling words in a text with their corresponding parts of speech"); the model, its estimation
and its decoding are the standard first-order HMM tagger (Jurafsky & Martin, *Speech and Language
Processing*, 3rd ed., ch. 8), written here in numpy float64 with natural logs.

An :class:`HMM` has T tags and W words: ``start`` (T,) = P(tag_1), ``transition`` (T, T) =
P(tag_i | tag_{i-1}) (row = previous tag), ``emission`` (T, W) = P(word_i | tag_i). The joint
probability of a sentence w_1..w_n with tags t_1..t_n is
start[t_1] · emission[t_1, w_1] · Π_{i≥2} transition[t_{i-1}, t_i] · emission[t_i, w_i].

Choices the source leaves open, made explicit here (each with a test in tests/unit/test_hmm.py):

- No end tag: sentences have a fixed length (:func:`sample`'s ``length``), so the joint above is
  a distribution over tag and word sequences of that length; nothing rewards a tag for ending a
  sentence. Jurafsky & Martin's end state would add a factor P(END | t_n).
- :func:`estimate` is supervised maximum likelihood with add-``smoothing`` (Lidstone) smoothing:
  every start, transition and emission count gets ``smoothing`` added before its row is
  normalised, so unseen words of a tag and unseen tag pairs keep a small probability. With
  ``smoothing=0`` it is the plain MLE, and a tag never seen as a previous tag or never emitting
  has no estimate (0 / 0): that is a ValueError, not a silent uniform row.
- :func:`viterbi` works in log space (log 0 = −inf) and breaks ties toward the lower tag index.
  Words outside the vocabulary and sentences no tag sequence can emit are ValueErrors.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

TaggedSentence = tuple[tuple[str, ...], tuple[str, ...]]  # (words, tags), of equal length


@dataclass(frozen=True, eq=False)
class HMM:
    """A first-order HMM over named tags and words; arrays are float64, read-only, rows sum to 1."""

    tags: tuple[str, ...]  # T tag names
    words: tuple[str, ...]  # W words (the vocabulary)
    start: np.ndarray  # (T,) P(first tag)
    transition: np.ndarray  # (T, T) P(next tag | tag), row = previous tag
    emission: np.ndarray  # (T, W) P(word | tag)

    def __post_init__(self) -> None:
        for name in ("tags", "words"):
            names = tuple(getattr(self, name))
            if not names or len(set(names)) != len(names):
                raise ValueError(f"{name} must be non-empty and distinct, got {names!r}")
            object.__setattr__(self, name, names)
        n_tags, n_words = len(self.tags), len(self.words)
        shapes = {"start": (n_tags,), "transition": (n_tags, n_tags), "emission": (n_tags, n_words)}
        for name, shape in shapes.items():
            # a copy: the caller's array stays theirs
            arr = np.array(getattr(self, name), dtype=np.float64)
            if arr.shape != shape:
                raise ValueError(f"{name} must have shape {shape} (T={n_tags} tags, "
                                 f"W={n_words} words), "
                                 f"got {arr.shape}")
            if not np.all(np.isfinite(arr)) or np.any(arr < 0):
                raise ValueError(f"{name} must be finite and non-negative")
            sums = arr.sum(axis=-1)
            bad = np.flatnonzero(np.abs(np.atleast_1d(sums) - 1.0) > 1e-9)
            if bad.size:
                where = "" if arr.ndim == 1 else f" rows {[self.tags[i] for i in bad[:5]]}"
                raise ValueError(f"{name}{where} must sum to 1 (within 1e-9), got "
                                 f"{np.atleast_1d(sums)[bad[:5]]}")
            arr.setflags(write=False)
            object.__setattr__(self, name, arr)


# ---------------------------------------------------------------- a synthetic grammar

_START = {"DET": 0.5, "NOUN": 0.25, "ADJ": 0.1, "ADV": 0.05, "VERB": 0.05, "PREP": 0.05}
_TRANSITION = {
    "DET": {"ADJ": 0.35, "NOUN": 0.65},
    "ADJ": {"ADJ": 0.1, "NOUN": 0.9},
    "NOUN": {"NOUN": 0.1, "VERB": 0.55, "ADV": 0.1, "PREP": 0.25},
    "VERB": {"DET": 0.4, "NOUN": 0.15, "ADJ": 0.1, "ADV": 0.2, "PREP": 0.15},
    "ADV": {"DET": 0.2, "ADJ": 0.2, "VERB": 0.3, "PREP": 0.3},
    "PREP": {"DET": 0.7, "ADJ": 0.1, "NOUN": 0.2},
}
_EMISSION = {  # run, fish, light and fast are ambiguous: only the context tells their tag
    "DET": {"the": 0.5, "a": 0.35, "every": 0.15},
    "ADJ": {"big": 0.25, "small": 0.2, "old": 0.15, "light": 0.2, "fast": 0.2},
    "NOUN": {"dog": 0.15, "cat": 0.15, "fish": 0.15, "run": 0.1, "light": 0.15, "river": 0.15,
             "boat": 0.15},
    "VERB": {"run": 0.2, "fish": 0.15, "light": 0.1, "sees": 0.2, "swims": 0.15, "sleeps": 0.2},
    "ADV": {"fast": 0.3, "quickly": 0.4, "often": 0.3},
    "PREP": {"in": 0.4, "near": 0.35, "with": 0.25},
}


def toy_grammar() -> HMM:
    """A small English-like tagger: 6 tags, 22 words, four of them ambiguous.

    "run" and "fish" are NOUN or VERB, "light" ADJ, NOUN or VERB, "fast" ADJ or ADV; the most
    frequent tag of each is wrong in some contexts, so decoding needs the neighbours.

    Example:
        >>> g = toy_grammar()
        >>> g.tags, g.emission.shape
        (('DET', 'ADJ', 'NOUN', 'VERB', 'ADV', 'PREP'), (6, 22))
    """
    tags = tuple(_EMISSION)
    # first appearance order
    words = tuple(dict.fromkeys(w for row in _EMISSION.values() for w in row))
    return HMM(tags, words,
               np.array([_START.get(t, 0.0) for t in tags]),
               np.array([[_TRANSITION[a].get(b, 0.0) for b in tags] for a in tags]),
               np.array([[_EMISSION[t].get(w, 0.0) for w in words] for t in tags]))


# ---------------------------------------------------------------- sampling


def _draw(rng: np.random.Generator, probs: np.ndarray) -> np.ndarray:
    """One index per row of ``probs`` (N, K), drawn by inverse CDF; zero-probability entries
    never."""
    cum = np.cumsum(probs, axis=1)
    cum /= cum[:, -1:]  # the last entry is exactly 1.0 > u, so every row draws something
    u = rng.random((probs.shape[0], 1))
    return (cum <= u).sum(axis=1)  # the first k with cum[k] > u; then probs[k] > 0


def sample(hmm: HMM, n_sentences: int, length: int, seed: int) -> list[TaggedSentence]:
    """``n_sentences`` tagged sentences of ``length`` words each, drawn from ``hmm``.

    All sentences are drawn together, a position at a time, from ``np.random.default_rng(seed)``:
    same seed, same sentences.

    Example:
        >>> words, tags = sample(toy_grammar(), 1, 4, seed=0)[0]
        >>> len(words) == len(tags) == 4
        True
    """
    # a seed of None would give numpy's unseeded generator: other sentences at every call
    for name, value, low in (("n_sentences", n_sentences, 1), ("length", length, 1),
                             ("seed", seed, 0)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    rng = np.random.default_rng(seed)
    tags = np.empty((n_sentences, length), dtype=np.int64)
    words = np.empty((n_sentences, length), dtype=np.int64)
    tags[:, 0] = _draw(rng, np.broadcast_to(hmm.start, (n_sentences, len(hmm.tags))))
    for i in range(length):
        if i > 0:
            tags[:, i] = _draw(rng, hmm.transition[tags[:, i - 1]])
        words[:, i] = _draw(rng, hmm.emission[tags[:, i]])
    return [(tuple(hmm.words[w] for w in ws), tuple(hmm.tags[t] for t in ts))
            for ws, ts in zip(words, tags)]


# ---------------------------------------------------------------- estimation


def _indices(items: Sequence[str], index: dict[str, int], kind: str) -> list[int]:
    """Positions of ``items`` in ``index``, or a ValueError naming the unknown ones."""
    unknown = sorted({x for x in items if x not in index})
    if unknown:
        raise ValueError(f"unknown {kind}: {unknown[:5]}")
    return [index[x] for x in items]


def estimate(tagged_sentences: Sequence[TaggedSentence], tags: Sequence[str], words: Sequence[str],
             smoothing: float = 1e-3) -> HMM:
    """Supervised maximum-likelihood HMM from (words, tags) pairs, with add-``smoothing`` counts.

    start[t] ∝ #(sentences starting with t) + s; transition[a, b] ∝ #(a followed by b) + s;
    emission[t, w] ∝ #(w tagged t) + s, each row normalised to 1 (s = ``smoothing``, Lidstone).

    Example:
        >>> h = estimate([(("the", "dog"), ("DET", "NOUN"))], ["DET", "NOUN"], ["the", "dog"],
        ...              smoothing=1)
        >>> h.start.tolist(), h.emission[0].tolist()
        ([0.6666666666666666, 0.3333333333333333], [0.6666666666666666, 0.3333333333333333])
    """
    if not (isinstance(smoothing, (int, float)) and math.isfinite(smoothing) and smoothing >= 0):
        raise ValueError(f"smoothing must be finite and >= 0, got {smoothing!r}")
    if len(tagged_sentences) == 0:
        raise ValueError("tagged_sentences is empty: nothing to count")
    tags, words = tuple(tags), tuple(words)
    tag_index = {t: i for i, t in enumerate(tags)}
    word_index = {w: i for i, w in enumerate(words)}
    start = np.zeros(len(tags))
    transition = np.zeros((len(tags), len(tags)))
    emission = np.zeros((len(tags), len(words)))
    for n, (ws, ts) in enumerate(tagged_sentences):
        if len(ws) != len(ts) or len(ws) == 0:
            raise ValueError(f"sentence {n} has {len(ws)} words and {len(ts)} tags: "
                             "they must be equal and non-zero")
        t_ids = _indices(ts, tag_index, "tags")
        w_ids = _indices(ws, word_index, "words")
        start[t_ids[0]] += 1
        np.add.at(transition, (t_ids[:-1], t_ids[1:]), 1)
        np.add.at(emission, (t_ids, w_ids), 1)
    rows = {"start": start + smoothing, "transition": transition + smoothing,
            "emission": emission + smoothing}
    for name, arr in rows.items():
        totals = arr.sum(axis=-1, keepdims=True)
        if np.any(totals == 0):
            empty = [tags[i] for i in np.flatnonzero(totals[..., 0] == 0)] if arr.ndim == 2 else []
            raise ValueError(f"{name} has no counts{' for tags ' + str(empty) if empty else ''}: "
                             "with smoothing=0 its maximum-likelihood estimate is 0/0")
        rows[name] = arr / totals
    return HMM(tags, words, **rows)


# ---------------------------------------------------------------- decoding


def _log(p: np.ndarray) -> np.ndarray:
    """Natural log with log 0 = −inf (no warning)."""
    with np.errstate(divide="ignore"):
        return np.log(p)


def log_joint(hmm: HMM, words: Sequence[str], tags: Sequence[str]) -> float:
    """log P(words, tags) under ``hmm`` (−inf where a factor is 0)."""
    if len(words) != len(tags) or len(words) == 0:
        raise ValueError(f"words ({len(words)}) and tags ({len(tags)}) must have equal, "
                         "non-zero length")
    w = _indices(words, {x: i for i, x in enumerate(hmm.words)}, "words")
    t = _indices(tags, {x: i for i, x in enumerate(hmm.tags)}, "tags")
    logs = [_log(hmm.start[t[0]])] + [_log(hmm.transition[a, b]) for a, b in pairwise(t)]
    return float(sum(logs) + _log(hmm.emission[t, w]).sum())


def viterbi(hmm: HMM, words: Sequence[str]) -> tuple[tuple[str, ...], float]:
    """The most probable tag sequence for ``words`` and its joint log-probability log P(words,
    tags).

    δ_1[j] = log start[j] + log emission[j, w_1]; δ_i[j] = max_k δ_{i-1}[k] + log transition[k, j]
    + log emission[j, w_i], remembering the best k; the tags are read back from the best δ_n.

    Example:
        >>> viterbi(toy_grammar(), ["the", "fish", "swims"])[0]
        ('DET', 'NOUN', 'VERB')
    """
    if len(words) == 0:
        raise ValueError("words is empty: there is nothing to tag")
    w = _indices(words, {x: i for i, x in enumerate(hmm.words)}, "words")
    log_a, log_b = _log(hmm.transition), _log(hmm.emission)  # (T, T), (T, W)
    delta = _log(hmm.start) + log_b[:, w[0]]  # (T,)
    back = np.zeros((len(w), len(hmm.tags)), dtype=np.int64)  # back[i, j]: best tag before j at i
    for i in range(1, len(w)):
        scores = delta[:, None] + log_a  # (T previous, T next)
        back[i] = np.argmax(scores, axis=0)  # the first maximum: ties go to the lower tag index
        delta = scores[back[i], np.arange(len(hmm.tags))] + log_b[:, w[i]]
    best = int(np.argmax(delta))
    if delta[best] == -np.inf:
        raise ValueError(f"no tag sequence can emit {list(words)} under this HMM (probability 0)")
    path = [best]
    for i in range(len(w) - 1, 0, -1):
        path.append(int(back[i, path[-1]]))
    return tuple(hmm.tags[j] for j in reversed(path)), float(delta[best])


def tag_accuracy(pred: Sequence[Sequence[str]], gold: Sequence[Sequence[str]]) -> float:
    """The share of tokens whose predicted tag is the gold tag; one tag sequence per sentence each.

    Example: ``tag_accuracy([("DET", "NOUN")], [("DET", "VERB")])`` → 0.5.
    """
    if len(pred) != len(gold):
        raise ValueError(f"pred has {len(pred)} sentences and gold {len(gold)}")
    correct = total = 0
    for n, (p, g) in enumerate(zip(pred, gold)):
        if isinstance(p, str) or isinstance(g, str):
            raise TypeError("pred and gold hold one tag sequence per sentence, not tags")
        if len(p) != len(g):
            raise ValueError(f"sentence {n} has {len(p)} predicted tags and {len(g)} gold tags")
        correct += sum(a == b for a, b in zip(p, g))
        total += len(g)
    if total == 0:
        raise ValueError("gold holds no tags: accuracy is 0/0")
    return correct / total
