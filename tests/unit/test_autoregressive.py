"""halluc_lab.foundations.autoregressive: the chain rule two ways, and free-running generation."""

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from halluc_lab.foundations import autoregressive as ar
from halluc_lab.foundations.ngram import random_ngram
from halluc_lab.foundations.rnn import ElmanLM, RNNConfig


def tiny_rnn(vocab=5, hidden=6, seed=0, dtype=torch.float64):
    return ElmanLM(RNNConfig(vocab, hidden, init_scale=2.0), torch.Generator().manual_seed(seed)).to(dtype)


def test_prediction_mask_stops_after_the_first_eos():
    tokens = torch.tensor([[0, 3, 4, 9, 9], [0, 9, 9, 9, 9], [0, 1, 2, 3, 4]])
    mask = ar.prediction_mask(tokens, eos_id=9)
    assert mask.tolist() == [[True, True, True, False], [True, False, False, False], [True] * 4]


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), length=st.integers(2, 9))
def test_teacher_forced_pass_equals_the_stepwise_loop_on_an_rnn(seed, length):
    model = tiny_rnn(seed=seed)
    tokens = torch.randint(0, 5, (3, length), generator=torch.Generator().manual_seed(seed))
    torch.testing.assert_close(ar.teacher_forced_log_probs(model, tokens),
                               ar.stepwise_log_probs(model, tokens), rtol=1e-12, atol=1e-12)


def test_teacher_forced_pass_equals_the_stepwise_loop_on_a_trigram():
    src = random_ngram(list("abcd"), order=3, branching=2, end_prob=0.2,
                       generator=torch.Generator().manual_seed(0))
    tokens, _ = ar.generate(src, torch.zeros(8, 1, dtype=torch.long), 12,
                            torch.Generator().manual_seed(1), eos_id=src.eos_id)
    torch.testing.assert_close(ar.sequence_log_prob(src, tokens, src.eos_id),
                               ar.sequence_log_prob(src, tokens, src.eos_id, stepwise=True))


def test_teacher_forced_log_probs_match_f_cross_entropy():
    model = tiny_rnn()
    tokens = torch.randint(0, 5, (2, 7), generator=torch.Generator().manual_seed(5))
    logits = model(tokens)[:, :-1]
    expected = -F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten(), reduction="none")
    torch.testing.assert_close(ar.teacher_forced_log_probs(model, tokens).flatten(), expected)


def test_chain_rule_probabilities_of_all_continuations_sum_to_one():
    model = tiny_rnn(vocab=3)
    rows = [[0, *rest] for rest in itertools.product(range(3), repeat=3)]  # every 3-token continuation
    tokens = torch.tensor(rows)
    total = ar.teacher_forced_log_probs(model, tokens).sum(-1).exp().sum()
    assert total.item() == pytest.approx(1.0, abs=1e-12)


def test_generation_is_reproducible_and_its_log_probs_are_the_teacher_forced_ones():
    model = tiny_rnn()
    prompt = torch.zeros(6, 1, dtype=torch.long)
    a, lp_a = ar.generate(model, prompt, 8, torch.Generator().manual_seed(3), eos_id=4)
    b, lp_b = ar.generate(model, prompt, 8, torch.Generator().manual_seed(3), eos_id=4)
    assert torch.equal(a, b) and torch.equal(lp_a, lp_b)
    mask = ar.prediction_mask(a, eos_id=4)
    tf = ar.teacher_forced_log_probs(model, a)
    torch.testing.assert_close(torch.where(mask, tf, 0.0), lp_a)


def test_generation_keeps_finished_rows_at_eos():
    src = random_ngram(list("ab"), order=2, branching=1, end_prob=0.9,
                       generator=torch.Generator().manual_seed(0))
    tokens, lp = ar.generate(src, torch.zeros(50, 1, dtype=torch.long), 10,
                             torch.Generator().manual_seed(0), eos_id=src.eos_id)
    after = torch.cumsum((tokens == src.eos_id).long(), 1) > 1  # strictly after the first EOS
    assert bool((tokens[after] == src.eos_id).all())
    assert bool((lp[after[:, 1:]] == 0).all())


def test_context_window_changes_nothing_but_the_cost():
    src = random_ngram(list("abc"), order=3, branching=2, end_prob=0.2,
                       generator=torch.Generator().manual_seed(2))

    class Unbounded:  # the same model without a context_window attribute
        def __call__(self, tokens):
            return src(tokens)

    prompt = torch.zeros(20, 1, dtype=torch.long)
    a, _ = ar.generate(src, prompt, 10, torch.Generator().manual_seed(5), eos_id=src.eos_id)
    b, _ = ar.generate(Unbounded(), prompt, 10, torch.Generator().manual_seed(5), eos_id=src.eos_id)
    assert torch.equal(a, b)


def test_zero_new_tokens_returns_the_prompt():
    tokens, lp = ar.generate(tiny_rnn(), torch.zeros(2, 1, dtype=torch.long), 0, torch.Generator())
    assert tokens.shape == (2, 1) and lp.shape == (2, 0)


def test_a_ruled_out_token_has_log_probability_minus_infinity():
    src = random_ngram(list("abc"), order=2, branching=1, end_prob=0.5,
                       generator=torch.Generator().manual_seed(0))
    allowed = int(src.probs[0, 1:-1].argmax()) + 1
    banned = next(i for i in range(1, 4) if i != allowed)
    lp = ar.sequence_log_prob(src, torch.tensor([[0, banned, src.eos_id]]), src.eos_id)
    assert lp.item() == -math.inf


def test_bad_input_is_rejected():
    model = tiny_rnn()
    with pytest.raises(TypeError, match="tokens"):
        ar.teacher_forced_log_probs(model, torch.zeros(1, 3))
    with pytest.raises(ValueError, match="tokens"):
        ar.teacher_forced_log_probs(model, torch.zeros(1, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="tokens"):
        ar.teacher_forced_log_probs(model, torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="non-negative"):
        ar.prediction_mask(torch.tensor([[0, -1]]), eos_id=4)
    with pytest.raises(ValueError, match="model"):
        ar.teacher_forced_log_probs(lambda t: torch.zeros(t.shape), torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="NaN"):
        ar.teacher_forced_log_probs(lambda t: torch.full((*t.shape, 4), math.nan),
                                    torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="scores only"):
        ar.teacher_forced_log_probs(lambda t: torch.zeros(*t.shape, 4), torch.tensor([[0, 7]]))
    with pytest.raises(ValueError, match="tokens must be ids"):
        ar.teacher_forced_log_probs(model, torch.tensor([[0, 7]]))
    with pytest.raises(ValueError, match="max_new_tokens"):
        ar.generate(model, torch.zeros(1, 1, dtype=torch.long), -1, torch.Generator())
    with pytest.raises(TypeError, match="generator"):
        ar.generate(model, torch.zeros(1, 1, dtype=torch.long), 3, 0)


@pytest.mark.gpu
def test_chain_rule_and_generation_on_cuda():
    model = tiny_rnn(dtype=torch.float32).to("cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    tokens, lp = ar.generate(model, torch.zeros(16, 1, dtype=torch.long, device="cuda"), 12, g, eos_id=4)
    assert tokens.device.type == "cuda" and lp.device.type == "cuda"
    torch.testing.assert_close(ar.teacher_forced_log_probs(model, tokens),
                               ar.stepwise_log_probs(model, tokens), rtol=1e-5, atol=1e-5)
