"""halluc_lab.foundations.ngram: bigram counts, MLE, add-k smoothing, likelihood and perplexity."""

import itertools
import math
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from halluc_lab.foundations import autoregressive as ar
from halluc_lab.foundations.ngram import (
    BOS,
    EOS,
    NGramLM,
    count_bigrams,
    decode,
    encode,
    fit_bigram,
    log_likelihood,
    perplexity,
    random_ngram,
    vocabulary,
)

# 004 §3.2's example corpus ("The cat sat on the mat. The dog sat on the mat."), one sentence each
CORPUS = [["the", "cat", "sat", "on", "the", "mat"], ["the", "dog", "sat", "on", "the", "mat"]]


@pytest.fixture
def corpus_ids():
    symbols = vocabulary(CORPUS)
    return symbols, encode(CORPUS, symbols)


def test_vocabulary_puts_bos_first_and_eos_last():
    assert vocabulary(CORPUS) == (BOS, "cat", "dog", "mat", "on", "sat", "the", EOS)


def test_encode_decode_round_trip_and_padding(corpus_ids):
    symbols, ids = corpus_ids
    assert ids.shape == (2, 8)
    assert decode(ids, symbols) == CORPUS
    short = encode([["cat"], []], symbols)
    assert short.tolist() == [[0, 1, 7], [0, 7, 7]]  # EOS-padded; an empty sentence is BOS EOS
    assert decode(short, symbols) == [["cat"], []]


def test_counts_match_a_counter_and_the_document_table(corpus_ids):
    symbols, ids = corpus_ids
    counts = count_bigrams(ids, len(symbols))
    expected = Counter()
    for sentence in CORPUS:
        padded = [BOS, *sentence, EOS]
        expected.update(itertools.pairwise(padded))
    for (a, b), n in expected.items():
        assert counts[symbols.index(a), symbols.index(b)] == n
    assert counts.sum() == sum(expected.values()) == 14
    # 004 §3.2's forward co-occurrence matrix over (the, cat, dog, sat, on, mat)
    order = [symbols.index(w) for w in ("the", "cat", "dog", "sat", "on", "mat")]
    table = [[0, 1, 1, 0, 0, 2], [0, 0, 0, 1, 0, 0], [0, 0, 0, 1, 0, 0],
             [0, 0, 0, 0, 2, 0], [2, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]]
    assert counts[order][:, order].tolist() == table


def test_mle_is_count_over_context_count(corpus_ids):
    symbols, ids = corpus_ids
    lm = fit_bigram(count_bigrams(ids, len(symbols)), symbols)
    p = lambda a, b: lm.probs[symbols.index(a), symbols.index(b)].item()
    assert p("the", "mat") == pytest.approx(2 / 4)
    assert p("the", "cat") == pytest.approx(1 / 4)
    assert p(BOS, "the") == 1.0
    assert p("mat", EOS) == 1.0
    assert p(EOS, EOS) == 1.0
    torch.testing.assert_close(lm.probs.sum(-1), torch.ones(len(symbols), dtype=torch.float64))


def test_add_k_smoothing_formula_and_limits(corpus_ids):
    symbols, ids = corpus_ids
    counts = count_bigrams(ids, len(symbols))
    v_plus_1 = len(symbols) - 1  # predictable targets: the vocabulary and EOS
    lm = fit_bigram(counts, symbols, k=0.5)
    the, mat = symbols.index("the"), symbols.index("mat")
    assert lm.probs[the, mat].item() == pytest.approx((2 + 0.5) / (4 + 0.5 * v_plus_1))
    assert lm.probs[the, 0].item() == 0.0  # BOS is never predicted, even smoothed
    huge = fit_bigram(counts, symbols, k=1e9)
    torch.testing.assert_close(huge.probs[:-1, 1:], torch.full((v_plus_1, v_plus_1), 1 / v_plus_1,
                                                               dtype=torch.float64), atol=1e-7, rtol=0)


def test_log_likelihood_and_perplexity_by_hand(corpus_ids):
    symbols, ids = corpus_ids
    lm = fit_bigram(count_bigrams(ids, len(symbols)), symbols)
    # the cat sat on the mat: P = 1 · 1/4 · 1 · 1 · 1 · 1/2 · 1 (the EOS factor)
    ll = log_likelihood(lm, ids)
    torch.testing.assert_close(ll, torch.tensor([math.log(1 / 8)] * 2, dtype=torch.float64))
    assert perplexity(lm, ids) == pytest.approx(math.exp(-2 * math.log(1 / 8) / 14))


def test_unseen_bigram_has_zero_mle_probability_and_infinite_perplexity(corpus_ids):
    symbols, ids = corpus_ids
    counts = count_bigrams(ids, len(symbols))
    held_out = encode([["the", "cat", "sat", "on", "the", "dog"]], symbols)  # dog -> </s> unseen
    assert log_likelihood(fit_bigram(counts, symbols), held_out).item() == -math.inf
    assert perplexity(fit_bigram(counts, symbols), held_out) == math.inf
    assert math.isfinite(perplexity(fit_bigram(counts, symbols, k=0.1), held_out))


def test_log_likelihood_agrees_with_the_generic_chain_rule(corpus_ids):
    symbols, ids = corpus_ids
    lm = fit_bigram(count_bigrams(ids, len(symbols)), symbols, k=0.3)
    torch.testing.assert_close(log_likelihood(lm, ids), ar.sequence_log_prob(lm, ids, lm.eos_id))
    torch.testing.assert_close(log_likelihood(lm, ids), ar.sequence_log_prob(lm, ids, lm.eos_id, stepwise=True))


@settings(max_examples=15, deadline=None)
@given(k=st.floats(1e-3, 10.0), seed=st.integers(0, 1000))
def test_mle_maximises_training_likelihood(k, seed):
    src = random_ngram(list("abcd"), order=2, branching=2, end_prob=0.3,
                       generator=torch.Generator().manual_seed(seed))
    ids, _ = ar.generate(src, torch.zeros(30, 1, dtype=torch.long), 15,
                         torch.Generator().manual_seed(seed + 1), eos_id=src.eos_id)
    counts = count_bigrams(ids, len(src.symbols))
    seen = counts[:-1].sum(1) > 0
    keep = [0] + [i for i in range(1, len(src.symbols) - 1) if seen[i]] + [len(src.symbols) - 1]
    symbols = tuple(src.symbols[i] for i in keep)
    ids = encode(decode(ids, src.symbols), symbols)
    counts = count_bigrams(ids, len(symbols))
    mle = log_likelihood(fit_bigram(counts, symbols), ids).sum()
    assert mle >= log_likelihood(fit_bigram(counts, symbols, k=k), ids).sum() - 1e-9


def test_ngram_call_reads_the_last_n_minus_1_symbols():
    src = random_ngram(list("abc"), order=3, branching=2, end_prob=0.2,
                       generator=torch.Generator().manual_seed(0))
    tokens = torch.tensor([[0, 1, 3, 2]])
    lp = src(tokens)  # (1, 4, 5)
    torch.testing.assert_close(lp[0, 0], src.probs[0, 0].log())  # context (BOS, BOS)
    torch.testing.assert_close(lp[0, 1], src.probs[0, 1].log())
    torch.testing.assert_close(lp[0, 3], src.probs[3, 2].log())


def test_random_ngram_is_reproducible_sparse_and_never_starts_with_eos():
    make = lambda seed: random_ngram(list("abcde"), order=3, branching=2, end_prob=0.25,
                                     generator=torch.Generator().manual_seed(seed))
    a, b, c = make(1), make(1), make(2)
    assert torch.equal(a.probs, b.probs) and not torch.equal(a.probs, c.probs)
    nonzero = (a.probs[..., 1:-1] > 0).sum(-1)  # allowed words per context
    assert bool((nonzero[:, :-1] == 2).all())
    assert a.probs[0, 0, -1].item() == 0.0  # no empty sentence
    assert a.probs[0, 1, -1].item() == pytest.approx(0.25)


def test_samples_reproduce_the_source_bigram_frequencies():
    src = random_ngram(list("abc"), order=2, branching=2, end_prob=0.3,
                       generator=torch.Generator().manual_seed(3))
    ids, _ = ar.generate(src, torch.zeros(4000, 1, dtype=torch.long), 40,
                         torch.Generator().manual_seed(4), eos_id=src.eos_id)
    fitted = fit_bigram(count_bigrams(ids, len(src.symbols)), src.symbols)
    torch.testing.assert_close(fitted.probs, src.probs, atol=0.03, rtol=0)


# --- bad input -------------------------------------------------------------------------------

def test_bad_corpora_are_rejected():
    with pytest.raises(ValueError, match="empty"):
        vocabulary([])
    with pytest.raises(TypeError, match="corpus"):
        vocabulary("the cat")
    with pytest.raises(TypeError, match=r"corpus\[0\]"):
        vocabulary(["the cat"])
    with pytest.raises(TypeError, match="token"):
        vocabulary([["the", 3]])
    with pytest.raises(ValueError, match="start and end"):
        vocabulary([["the", EOS]])
    with pytest.raises(ValueError, match="unknown token 'bird'"):
        encode([["the", "bird"]], vocabulary(CORPUS))


def test_bad_counts_and_k_are_rejected(corpus_ids):
    symbols, ids = corpus_ids
    counts = count_bigrams(ids, len(symbols))
    negative = counts.clone()
    negative[1, 2] = -1
    with pytest.raises(ValueError, match="non-negative"):
        fit_bigram(negative, symbols)
    with pytest.raises(ValueError, match="non-negative"):
        fit_bigram(counts * math.nan, symbols)
    with pytest.raises(ValueError, match="shape"):
        fit_bigram(counts[:-1], symbols)
    with pytest.raises(ValueError, match="k must"):
        fit_bigram(counts, symbols, k=-0.1)
    with pytest.raises(ValueError, match="k must"):
        fit_bigram(counts, symbols, k=math.inf)
    with pytest.raises(ValueError, match="column 0"):
        bad = counts.clone()
        bad[1, 0] = 1
        fit_bigram(bad, symbols)
    wider = (*symbols[:-1], "zebra", EOS)  # a vocabulary word the corpus never uses
    with pytest.raises(ValueError, match="never seen.*zebra"):
        fit_bigram(count_bigrams(encode(CORPUS, wider), len(wider)), wider)
    fit_bigram(count_bigrams(encode(CORPUS, wider), len(wider)), wider, k=1.0)  # fine with k > 0


def test_bad_ids_and_tables_are_rejected(corpus_ids):
    symbols, ids = corpus_ids
    with pytest.raises(TypeError, match="ids"):
        count_bigrams(ids.float(), len(symbols))
    with pytest.raises(ValueError, match="ids must be in"):
        count_bigrams(ids, 3)
    with pytest.raises(ValueError, match="BOS"):
        count_bigrams(ids[:, 1:], len(symbols))
    with pytest.raises(ValueError, match="symbols"):
        NGramLM(symbols=("a", "b"), probs=torch.eye(2))
    good = fit_bigram(count_bigrams(ids, len(symbols)), symbols)
    with pytest.raises(ValueError, match="sum to 1"):
        NGramLM(symbols=symbols, probs=good.probs * 0.5)
    with pytest.raises(ValueError, match="absorbing"):
        p = good.probs.clone()
        p[-1, -1], p[-1, 1] = 0.0, 1.0
        NGramLM(symbols=symbols, probs=p)
    with pytest.raises(ValueError, match="shape"):
        NGramLM(symbols=symbols, probs=good.probs[:, :-1])
    with pytest.raises(ValueError, match="tokens"):
        good(torch.tensor([[0, 99]]))
    with pytest.raises(ValueError, match="branching"):
        random_ngram(list("ab"), 2, 3, 0.2, torch.Generator())
    with pytest.raises(ValueError, match="end_prob"):
        random_ngram(list("ab"), 2, 1, 1.0, torch.Generator())
    with pytest.raises(ValueError, match="order"):
        random_ngram(list("ab"), 1, 1, 0.5, torch.Generator())
