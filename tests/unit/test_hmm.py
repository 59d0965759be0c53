"""halluc_lab.foundations.hmm: the toy POS grammar, sampling, supervised MLE and Viterbi decoding (004 ch. 4)."""

import itertools
import math
from collections import Counter, defaultdict

import numpy as np
import pytest

from halluc_lab.foundations.hmm import (
    HMM,
    estimate,
    log_joint,
    sample,
    tag_accuracy,
    toy_grammar,
    viterbi,
)

AMBIGUOUS = {"run": {"NOUN", "VERB"}, "fish": {"NOUN", "VERB"}, "light": {"ADJ", "NOUN", "VERB"},
             "fast": {"ADJ", "ADV"}}


def _random_hmm(n_tags: int, n_words: int, seed: int) -> HMM:
    rng = np.random.default_rng(seed)
    return HMM(tuple(f"T{i}" for i in range(n_tags)), tuple(f"w{i}" for i in range(n_words)),
               rng.dirichlet(np.ones(n_tags)), rng.dirichlet(np.ones(n_tags), size=n_tags),
               rng.dirichlet(np.ones(n_words), size=n_tags))


def _joint(hmm: HMM, words, tags) -> float:
    """P(words, tags) as a plain product, written independently of the module."""
    t = [hmm.tags.index(x) for x in tags]
    w = [hmm.words.index(x) for x in words]
    p = hmm.start[t[0]] * hmm.emission[t[0], w[0]]
    for i in range(1, len(t)):
        p *= hmm.transition[t[i - 1], t[i]] * hmm.emission[t[i], w[i]]
    return float(p)


def _brute_force(hmm: HMM, words):
    """The argmax over all T^n tag sequences (first maximum in itertools.product order) and its joint."""
    return max(((tags, _joint(hmm, words, tags)) for tags in itertools.product(hmm.tags, repeat=len(words))),
               key=lambda pair: pair[1])


@pytest.fixture(scope="module")
def grammar() -> HMM:
    return toy_grammar()


@pytest.fixture(scope="module")
def train(grammar):
    return sample(grammar, 2000, 8, seed=0)


@pytest.fixture(scope="module")
def fresh(grammar):
    return sample(grammar, 500, 8, seed=1)


# ---------------------------------------------------------------- Viterbi is the exact argmax


@pytest.mark.parametrize("seed", range(6))
def test_viterbi_equals_brute_force_argmax_on_random_hmms(seed):
    hmm = _random_hmm(3, 4, seed)
    rng = np.random.default_rng(100 + seed)
    for length in (1, 2, 3, 5):
        words = [hmm.words[i] for i in rng.integers(0, 4, size=length)]
        tags, log_prob = viterbi(hmm, words)
        best_tags, best_p = _brute_force(hmm, words)
        assert tags == best_tags
        assert log_prob == pytest.approx(math.log(best_p), rel=1e-12)
        assert log_joint(hmm, words, tags) == pytest.approx(log_prob, rel=1e-12)


def test_viterbi_equals_brute_force_on_sentences_of_the_toy_grammar(grammar):
    for words, _ in sample(grammar, 20, 4, seed=7):
        tags, log_prob = viterbi(grammar, words)
        best_tags, best_p = _brute_force(grammar, words)
        assert tags == best_tags
        assert log_prob == pytest.approx(math.log(best_p), rel=1e-12)


def test_ties_go_to_the_lower_tag_index():
    uniform = HMM(("A", "B"), ("x",), [0.5, 0.5], [[0.5, 0.5], [0.5, 0.5]], [[1.0], [1.0]])
    assert viterbi(uniform, ["x", "x", "x"]) == (("A", "A", "A"), pytest.approx(3 * math.log(0.5)))


def test_a_sentence_no_tag_sequence_can_emit_is_rejected(grammar):
    with pytest.raises(ValueError, match="probability 0"):
        viterbi(grammar, ["the", "the"])  # DET never follows DET
    assert log_joint(grammar, ["the", "the"], ["DET", "DET"]) == -math.inf


# ---------------------------------------------------------------- tagging sampled sentences


def _most_frequent_tag(tagged):
    counts = defaultdict(Counter)
    for words, tags in tagged:
        for w, t in zip(words, tags):
            counts[w][t] += 1
    return {w: c.most_common(1)[0][0] for w, c in counts.items()}


def test_estimated_hmm_tags_fresh_sentences_as_well_as_the_true_one(grammar, train, fresh):
    estimated = estimate(train, grammar.tags, grammar.words)
    gold = [tags for _, tags in fresh]
    true_acc = tag_accuracy([viterbi(grammar, w)[0] for w, _ in fresh], gold)
    est_acc = tag_accuracy([viterbi(estimated, w)[0] for w, _ in fresh], gold)
    best = _most_frequent_tag(train)
    baseline = tag_accuracy([[best[x] for x in w] for w, _ in fresh], gold)
    assert abs(est_acc - true_acc) <= 0.02
    assert est_acc > baseline + 0.05  # context beats the word's own most frequent tag
    assert true_acc > 0.95


def test_ambiguous_words_get_different_tags_in_different_contexts(grammar, train, fresh):
    estimated = estimate(train, grammar.tags, grammar.words)
    seen = defaultdict(set)
    for words, _ in fresh:
        for w, t in zip(words, viterbi(estimated, words)[0]):
            seen[w].add(t)
    for word, allowed in AMBIGUOUS.items():
        assert len(seen[word]) >= 2 and seen[word] <= allowed, (word, seen[word])
    # the same word, two hand-made contexts
    assert viterbi(grammar, ["the", "fish", "swims"])[0] == ("DET", "NOUN", "VERB")
    assert viterbi(grammar, ["the", "cat", "fish", "in", "the", "river"])[0][2] == "VERB"
    assert viterbi(grammar, ["the", "light", "boat", "swims"])[0][1] == "ADJ"
    assert viterbi(grammar, ["the", "dog", "sees", "the", "light"])[0][4] == "NOUN"
    assert viterbi(grammar, ["the", "fast", "dog", "sleeps"])[0][1] == "ADJ"
    assert viterbi(grammar, ["dog", "run", "fast"])[0][1:] == ("VERB", "ADV")


def test_toy_grammar_has_the_ambiguous_words(grammar):
    for word, allowed in AMBIGUOUS.items():
        column = grammar.emission[:, grammar.words.index(word)]
        assert {grammar.tags[i] for i in np.flatnonzero(column)} == allowed


# ---------------------------------------------------------------- sampling and estimation


def test_sample_is_seeded_and_shaped(grammar):
    a = sample(grammar, 5, 6, seed=3)
    assert a == sample(grammar, 5, 6, seed=3)
    assert a != sample(grammar, 5, 6, seed=4)
    assert all(len(w) == len(t) == 6 for w, t in a)
    assert all(grammar.emission[grammar.tags.index(t), grammar.words.index(w)] > 0
               for words, tags in a for w, t in zip(words, tags))


def test_estimates_converge_to_the_true_parameters(grammar):
    errors = []
    for n in (100, 1000, 10000):
        est = estimate(sample(grammar, n, 8, seed=2), grammar.tags, grammar.words)
        errors.append(max(np.abs(getattr(est, k) - getattr(grammar, k)).max()
                          for k in ("start", "transition", "emission")))
    assert errors[0] > errors[1] > errors[2]
    assert errors[2] < 0.02


def test_estimate_is_counts_plus_smoothing_normalised():
    data = [(("the", "dog"), ("DET", "NOUN")), (("dog", "dog"), ("NOUN", "NOUN"))]
    mle = estimate(data, ["DET", "NOUN"], ["the", "dog"], smoothing=0)
    assert mle.start.tolist() == [0.5, 0.5]
    assert mle.transition.tolist() == [[0.0, 1.0], [0.0, 1.0]]
    assert mle.emission.tolist() == [[1.0, 0.0], [0.0, 1.0]]
    smoothed = estimate(data, ["DET", "NOUN"], ["the", "dog"], smoothing=0.5)
    assert smoothed.transition[1].tolist() == [0.5 / 2, 1.5 / 2]  # counts (0, 1) + 0.5 each
    assert smoothed.emission[1].tolist() == [0.5 / 4, 3.5 / 4]  # counts (0, 3) + 0.5 each


def test_estimate_without_smoothing_rejects_a_tag_it_never_saw():
    with pytest.raises(ValueError, match=r"transition has no counts for tags \['ADJ', 'NOUN'\]"):
        estimate([(("the", "dog"), ("DET", "NOUN"))], ["DET", "ADJ", "NOUN"], ["the", "dog"], smoothing=0)


# ---------------------------------------------------------------- bad input


def test_hmm_copies_its_arrays_and_makes_them_read_only():
    start = np.array([1.0, 0.0])
    hmm = HMM(("A", "B"), ("x",), start, np.eye(2), [[1.0], [1.0]])
    start[0] = 0.5
    assert hmm.start[0] == 1.0
    with pytest.raises(ValueError):
        hmm.start[0] = 0.0


@pytest.mark.parametrize("start, transition, emission, match", [
    ([0.6, 0.6], np.eye(2), [[1.0], [1.0]], "start must sum to 1"),
    ([1.0, 0.0], [[0.5, 0.4], [0.0, 1.0]], [[1.0], [1.0]], r"transition rows \['A'\] must sum to 1"),
    ([1.0, 0.0], np.eye(2), [[1.0], [0.9]], r"emission rows \['B'\] must sum to 1"),
    ([1.5, -0.5], np.eye(2), [[1.0], [1.0]], "start must be finite and non-negative"),
    ([1.0, 0.0], [[1.5, -0.5], [0.0, 1.0]], [[1.0], [1.0]], "transition must be finite and non-negative"),
    ([1.0, 0.0], np.eye(3), [[1.0], [1.0]], r"transition must have shape \(2, 2\)"),
    ([1.0, 0.0], np.eye(2), [[1.0, 0.0]], r"emission must have shape \(2, 1\)"),
])
def test_bad_parameters_are_rejected(start, transition, emission, match):
    with pytest.raises(ValueError, match=match):
        HMM(("A", "B"), ("x",), start, transition, emission)


def test_duplicate_tags_are_rejected():
    with pytest.raises(ValueError, match="distinct"):
        HMM(("A", "A"), ("x",), [1.0, 0.0], np.eye(2), [[1.0], [1.0]])


def test_unknown_words_are_named(grammar):
    with pytest.raises(ValueError, match=r"unknown words: \['unicorn', 'zebra'\]"):
        viterbi(grammar, ["the", "zebra", "unicorn"])
    with pytest.raises(ValueError, match=r"unknown words: \['zebra'\]"):
        estimate([(("the", "zebra"), ("DET", "NOUN"))], grammar.tags, grammar.words)
    with pytest.raises(ValueError, match=r"unknown tags: \['X'\]"):
        estimate([(("the", "dog"), ("DET", "X"))], grammar.tags, grammar.words)


@pytest.mark.parametrize("call", [
    lambda g: viterbi(g, []),
    lambda g: sample(g, 0, 5, seed=0),
    lambda g: sample(g, 2, 1.5, seed=0),
    lambda g: estimate([], g.tags, g.words),
    lambda g: estimate([(("the",), ("DET", "NOUN"))], g.tags, g.words),
    lambda g: estimate([(("the",), ("DET",))], g.tags, g.words, smoothing=-1),
    lambda g: tag_accuracy([("DET",)], [("DET",), ("NOUN",)]),
    lambda g: tag_accuracy([("DET", "NOUN")], [("DET",)]),
    lambda g: tag_accuracy([()], [()]),
])
def test_bad_arguments_are_rejected(grammar, call):
    with pytest.raises(ValueError):
        call(grammar)


def test_tag_accuracy_wants_one_tag_sequence_per_sentence():
    with pytest.raises(TypeError, match="one tag sequence per sentence"):
        tag_accuracy(["DET"], ["DET"])


def test_tag_accuracy_counts_tokens_across_sentences():
    assert tag_accuracy([("DET", "NOUN"), ("VERB",)], [("DET", "VERB"), ("VERB",)]) == pytest.approx(2 / 3)


@pytest.mark.parametrize("seed", [None, -1, 1.5, "0", True])
def test_sample_refuses_a_seed_that_is_not_an_integer_by_name(seed):
    with pytest.raises(ValueError, match="seed must be an integer >= 0"):
        sample(toy_grammar(), 2, 3, seed)
