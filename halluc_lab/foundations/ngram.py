"""N-gram language models: bigram counts, maximum likelihood, add-k smoothing, likelihood,
perplexity.

Chapter 1. Sources: 004 §2.1 (the bigram model, a Markov model of order 1; its likelihood, the
MLE P(w_i | w_{i-1}) = Count(w_{i-1}, w_i) / Count(w_{i-1}), the log-likelihood), §2.1.1
(perplexity); 002 "Perplexity", "Start Token", "End Token".

An :class:`NGramLM` of order n is a table P(next | previous n - 1 symbols); it is also a
next-token model in the sense of :mod:`halluc_lab.foundations.autoregressive` (call it on (B, T) ids
to get (B, T, S) log-probabilities), so the chain-rule functions, generation and perplexity there
work on it unchanged. Bigrams are fitted from counts (:func:`count_bigrams`, :func:`fit_bigram`); a
known higher-order source for experiments comes from :func:`random_ngram`.

Conventions the documents leave implicit, made explicit here:

- Symbols: id 0 is the start symbol ``<s>`` (BOS), then the vocabulary in sorted order, then the
  end symbol ``</s>`` (EOS). Every sentence is BOS, its words, EOS; BOS is given, never
  predicted (its column is 0); EOS is predicted once and then absorbing (P(EOS | EOS) = 1), which
  is how finished sentences are padded. 004 writes P(W) = P(w_1) Π P(w_i | w_{i-1}); with BOS,
  P(w_1) = P(w_1 | BOS), and the EOS factor makes the probabilities of all finite sentences sum
  to 1.
- The MLE denominator is the number of times w_{i-1} occurs *as a context* (followed by
  something, EOS included), Σ_w Count(w_{i-1}, w). 004 says "the number of times the word w_{i-1}
  appears"; without an end symbol the two differ for a word that ends a sentence, and its row no
  longer sums to 1 (chapter 1 shows it; see the errata).
- Add-k smoothing adds k to every count of a predictable target (the vocabulary and EOS, not
  BOS): P(w | c) = (Count(c, w) + k) / (Count(c) + k (V + 1)). With k = 0 a context never seen
  in the corpus has no MLE (0 / 0): that is an error, not a silent uniform row.
- Perplexity counts every predicted symbol, EOS included, one per sentence.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from halluc_lab.foundations.autoregressive import prediction_mask
from halluc_lab.foundations.information import check_distribution, sequence_perplexity

BOS, EOS = "<s>", "</s>"


@dataclass(frozen=True)
class NGramLM:
    """A table of next-symbol probabilities given the previous ``order - 1`` symbols."""

    symbols: tuple[str, ...]  # BOS, the vocabulary, EOS; a symbol's id is its index
    probs: torch.Tensor  # (S,) * order: probs[c_1, ..., c_{n-1}, w] = P(w | c_1 … c_{n-1})
    k: float = 0.0  # the add-k pseudo-count it was fitted with (0: maximum likelihood or hand-made)

    def __post_init__(self):
        _check_symbols(self.symbols)
        p, s = self.probs, len(self.symbols)
        if not isinstance(p, torch.Tensor) or not p.is_floating_point():
            raise TypeError("probs must be a floating-point tensor")
        if p.dim() < 2 or any(n != s for n in p.shape):
            raise ValueError(f"probs must have shape ({s},) * order with order ≥ 2 for "
                             f"{s} symbols, "
                             f"got {tuple(p.shape)}")
        check_distribution(p, dim=-1, name="probs")
        if bool((p[..., 0] != 0).any()):
            raise ValueError("probs must give the start symbol (column 0) probability 0: BOS is "
                             "never predicted")
        if bool((p[..., -1, -1] != 1).any()):
            raise ValueError("probs must make EOS absorbing: P(EOS | ..., EOS) = 1")

    @property
    def order(self) -> int:
        """n: 2 for a bigram model."""
        return self.probs.dim()

    @property
    def context_window(self) -> int:
        """How many previous symbols it reads: n - 1 (generation shows it no more)."""
        return self.order - 1

    @property
    def eos_id(self) -> int:
        """The end symbol's id (the last one)."""
        return len(self.symbols) - 1

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, T) ids -> (B, T, S) log P(next | the n - 1 symbols ending at t), BOS-padded on the
        left."""
        if not isinstance(tokens, torch.Tensor) or tokens.dtype != torch.long or tokens.dim() != 2:
            raise TypeError("tokens must be a (B, T) torch.long tensor")
        if bool((tokens < 0).any()) or bool((tokens >= len(self.symbols)).any()):
            raise ValueError(f"tokens must be ids in [0, {len(self.symbols) - 1}]")
        pad = torch.zeros(tokens.shape[0], self.order - 2, dtype=torch.long, device=tokens.device)
        padded = torch.cat([pad, tokens], dim=1)  # (B, T + n - 2): BOS before the start
        ctx = [padded[:, j:j + tokens.shape[1]] for j in range(self.order - 1)]  # n - 1 × (B, T)
        return torch.log(self.probs.to(tokens.device)[tuple(ctx)])  # (B, T, S); log 0 = -inf

    def to(self, device: torch.device | str) -> NGramLM:
        """The same model with its table on ``device``."""
        return dataclasses.replace(self, probs=self.probs.to(device))


def _check_symbols(symbols) -> None:
    if not isinstance(symbols, tuple) or not all(isinstance(s, str) for s in symbols):
        raise TypeError("symbols must be a tuple of str")
    if len(symbols) < 2 or symbols[0] != BOS or symbols[-1] != EOS:
        raise ValueError(f"symbols must be ({BOS!r}, *vocabulary, {EOS!r}), got {symbols[:3]}…")
    if len(set(symbols)) != len(symbols):
        raise ValueError("symbols must be unique")


def _check_corpus(corpus) -> None:
    if isinstance(corpus, str) or not isinstance(corpus, Sequence):
        raise TypeError("corpus must be a sequence of sentences, each a sequence of str tokens")
    if len(corpus) == 0:
        raise ValueError("corpus is empty: it needs at least one sentence")
    for i, sentence in enumerate(corpus):
        if isinstance(sentence, str) or not isinstance(sentence, Sequence):
            raise TypeError(f"corpus[{i}] must be a sequence of str tokens (a tokenised sentence), "
                            f"got {type(sentence).__name__}")
        for tok in sentence:
            if not isinstance(tok, str):
                raise TypeError(f"corpus[{i}] has a token of type {type(tok).__name__}; "
                                "tokens are str")
            if tok in (BOS, EOS):
                raise ValueError(f"corpus[{i}] contains {tok!r}; start and end symbols are "
                                 "added by encode")


def vocabulary(corpus: Sequence[Sequence[str]]) -> tuple[str, ...]:
    """The symbols of a corpus: (BOS, *sorted distinct tokens, EOS).

    Example:
        >>> vocabulary([["the", "cat"], ["the", "dog"]])
        ('<s>', 'cat', 'dog', 'the', '</s>')
    """
    _check_corpus(corpus)
    return (BOS, *sorted({tok for sentence in corpus for tok in sentence}), EOS)


def encode(corpus: Sequence[Sequence[str]], symbols: tuple[str, ...]) -> torch.Tensor:
    """Sentences -> (N, L) ids: BOS, words, EOS, EOS-padded to the longest (L = max length + 2).

    Unknown tokens raise ``ValueError`` naming the token (add it to the vocabulary, or map it to an
    unknown-word symbol before encoding).
    """
    _check_corpus(corpus)
    _check_symbols(symbols)
    index = {s: i for i, s in enumerate(symbols)}
    length = max(len(sentence) for sentence in corpus) + 2
    ids = torch.full((len(corpus), length), len(symbols) - 1, dtype=torch.long)  # EOS everywhere
    ids[:, 0] = 0  # BOS
    for i, sentence in enumerate(corpus):
        for t, tok in enumerate(sentence, start=1):
            if tok not in index:
                raise ValueError(f"corpus[{i}] has the unknown token {tok!r} (not in symbols)")
            ids[i, t] = index[tok]
    return ids


def decode(ids: torch.Tensor, symbols: tuple[str, ...]) -> list[list[str]]:
    """(N, L) ids -> sentences: the words between BOS and the first EOS."""
    eos = len(symbols) - 1
    out = []
    for row in ids.tolist():
        words = []
        for i in row[1:]:
            if i == eos:
                break
            words.append(symbols[i])
        out.append(words)
    return out


def count_bigrams(ids: torch.Tensor, num_symbols: int) -> torch.Tensor:
    """Count(c, w): how often symbol w follows context c, over the real predictions of ``ids``.

    Args:
        ids: (N, L) encoded sentences (:func:`encode`), BOS first, EOS-padded.
        num_symbols: S, the size of the symbol table.

    Returns:
        (S, S) float64 counts; column BOS and row EOS are zero (EOS padding is not counted).

    Example:
        >>> sy = vocabulary([["a", "b"]]); count_bigrams(encode([["a", "b"]], sy), len(sy))[0]
        tensor([0., 1., 0., 0.], dtype=torch.float64)
    """
    if not isinstance(ids, torch.Tensor) or ids.dtype != torch.long or ids.dim() != 2:
        raise TypeError("ids must be a (N, L) torch.long tensor of encoded sentences")
    if ids.shape[0] == 0 or ids.shape[1] < 2:
        raise ValueError("ids must hold at least one sentence (N ≥ 1, L ≥ 2), got "
                         f"{tuple(ids.shape)}")
    if bool((ids < 0).any()) or bool((ids >= num_symbols).any()):
        raise ValueError(f"ids must be in [0, {num_symbols - 1}] (num_symbols = {num_symbols})")
    if bool((ids[:, 0] != 0).any()) or bool((ids[:, 1:] == 0).any()):
        raise ValueError("ids must start every row with BOS (id 0) and contain it nowhere else")
    mask = prediction_mask(ids, eos_id=num_symbols - 1)  # (N, L-1)
    pair = ids[:, :-1] * num_symbols + ids[:, 1:]  # (N, L-1): flat (context, next) index
    flat = torch.bincount(pair[mask], minlength=num_symbols * num_symbols)
    return flat.reshape(num_symbols, num_symbols).to(torch.float64)


def fit_bigram(counts: torch.Tensor, symbols: tuple[str, ...], k: float = 0.0) -> NGramLM:
    """Maximum likelihood (k = 0) or add-k bigram probabilities from counts (004 §2.1).

    P(w | c) = (Count(c, w) + k) / (Σ_w' Count(c, w') + k (V + 1)) for w in the vocabulary and EOS.

    Args:
        counts: (S, S) non-negative counts (:func:`count_bigrams`); column BOS must be zero.
        symbols: the S symbols, BOS first and EOS last.
        k: the pseudo-count, ≥ 0.

    Returns:
        an order-2 :class:`NGramLM`.

    Example:
        >>> sy = vocabulary([["a"]]); fit_bigram(count_bigrams(encode([["a"]], sy), 3), sy).probs[0]
        tensor([0., 1., 0.], dtype=torch.float64)
    """
    _check_symbols(symbols)
    s = len(symbols)
    if not isinstance(counts, torch.Tensor):
        raise TypeError("counts must be a torch.Tensor")
    if counts.shape != (s, s):
        raise ValueError(f"counts must have shape ({s}, {s}) for {s} symbols, got "
                         f"{tuple(counts.shape)}")
    c = counts.to(torch.float64)
    if not bool(torch.isfinite(c).all()) or bool((c < 0).any()):
        raise ValueError("counts must be finite and non-negative")
    if bool((c[:, 0] != 0).any()):
        raise ValueError("counts must have zero in column 0: BOS never follows anything")
    if isinstance(k, bool) or not isinstance(k, (int, float)) or not math.isfinite(k) or k < 0:
        raise ValueError(f"k must be a finite number ≥ 0, got {k!r}")
    smoothed = c[:-1, 1:] + k  # (S-1, S-1): contexts BOS…last word, targets first word…EOS
    totals = smoothed.sum(dim=1, keepdim=True)  # (S-1, 1) = Count(c) + k (V + 1)
    unseen = (totals.squeeze(1) == 0).nonzero().flatten().tolist()
    if unseen:
        names = [symbols[i] for i in unseen[:5]]
        raise ValueError(f"k = 0 leaves contexts never seen in the corpus ({names}) without an MLE "
                         "(0 / 0): use k > 0, or leave those symbols out of the vocabulary")
    probs = torch.zeros(s, s, dtype=torch.float64, device=c.device)
    probs[:-1, 1:] = smoothed / totals
    probs[-1, -1] = 1.0  # EOS is absorbing
    return NGramLM(symbols=symbols, probs=probs, k=float(k))


def log_likelihood(lm: NGramLM, ids: torch.Tensor) -> torch.Tensor:
    """log P(sentence) under the model for each encoded sentence: Σ_i log P(w_i | context).

    Args:
        lm: the model.
        ids: (N, L) encoded sentences.

    Returns:
        (N,) natural-log likelihoods; ``-inf`` where a bigram has probability 0 (an unseen bigram
        under the MLE).
    """
    lp = lm(ids)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)  # (N, L-1): log P(w_i | context)
    mask = prediction_mask(ids, lm.eos_id)
    return torch.where(mask, lp, torch.zeros_like(lp)).sum(dim=1)


def perplexity(lm: NGramLM, ids: torch.Tensor) -> float:
    """exp(-(Σ log-likelihood) / number of predicted symbols), EOS included (004 §2.1.1).

    ``inf`` when the model gives some observed symbol probability 0.
    """
    lp = lm(ids)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)  # (N, L-1)
    return float(sequence_perplexity(lp, prediction_mask(ids, lm.eos_id)))


def random_ngram(words: Sequence[str], order: int, branching: int, end_prob: float,
                 generator: torch.Generator, spread: float = 1.0) -> NGramLM:
    """A random sparse n-gram source: each context allows ``branching`` next words, plus EOS.

    The rows are drawn once, from ``generator``: every context gets ``branching`` distinct words,
    chosen uniformly, with weights softmax(spread · N(0, 1)) scaled to 1 - end_prob, and EOS gets
    end_prob (so a sentence has about 1 / end_prob words), except that the first word never is
    EOS (no empty sentences). Contexts that cannot occur (BOS after a word, anything after EOS but
    EOS) get rows of the same kind or the absorbing EOS row; they are never used.

    Args:
        words: the vocabulary (distinct str).
        order: n ≥ 2.
        branching: how many words each context allows, in [1, len(words)].
        end_prob: P(EOS | context) for contexts ending in a word, in (0, 1).
        generator: a CPU torch.Generator.
        spread: the standard deviation of the weights' logits (0: uniform over the allowed words).

    Example:
        >>> src = random_ngram(["a", "b", "c"], order=3, branching=2, end_prob=0.2,
        ...                    generator=torch.Generator().manual_seed(0))
        >>> src.probs.shape
        torch.Size([5, 5, 5])
    """
    words = tuple(words)
    symbols = (BOS, *words, EOS)
    _check_symbols(symbols)
    v, s = len(words), len(symbols)
    if not isinstance(order, int) or isinstance(order, bool) or order < 2:
        raise ValueError(f"order must be an int ≥ 2, got {order!r}")
    if not isinstance(branching, int) or isinstance(branching, bool) or not 1 <= branching <= v:
        raise ValueError(f"branching must be an int in [1, {v}], got {branching!r}")
    if not isinstance(end_prob, (int, float)) or not 0 < end_prob < 1:
        raise ValueError(f"end_prob must be in (0, 1), got {end_prob!r}")
    if not isinstance(spread, (int, float)) or not math.isfinite(spread) or spread < 0:
        raise ValueError(f"spread must be a finite number ≥ 0, got {spread!r}")
    n_ctx = s ** (order - 1)
    allowed = torch.rand(n_ctx, v, generator=generator).argsort(dim=1)[:, :branching]  # (C, b)
    logits = spread * torch.randn(n_ctx, branching, generator=generator, dtype=torch.float64)
    probs = torch.zeros(n_ctx, s, dtype=torch.float64)  # (C, S), C = S^(n-1) flattened contexts
    probs.scatter_(1, allowed + 1, torch.softmax(logits, dim=1))  # words have ids 1 … V
    probs = probs.reshape((s,) * order)
    first = (0,) * (order - 1)  # the context of the first word: BOS only
    probs[..., 1:-1] *= 1 - end_prob
    probs[..., -1] = end_prob
    probs[first] /= 1 - end_prob  # undo both for the first word: no empty sentence
    probs[first + (-1,)] = 0.0
    probs[..., -1, :] = 0.0
    probs[..., -1, -1] = 1.0  # EOS absorbing
    return NGramLM(symbols=symbols, probs=probs)
