"""Losses: cross-entropy by hand, its gradient, label smoothing, per-token and per-sequence log-probs."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from halluc_lab.training.losses import IGNORE, causal_lm_loss, label_smoothed_nll, sequence_logprobs, token_logprobs


def test_loss_is_equation_9_by_hand():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7, dtype=torch.float64)
    labels = torch.tensor([[IGNORE, 3, 1, IGNORE, 6], [IGNORE, IGNORE, 2, 2, 0]])
    logp = torch.log_softmax(logits, -1)
    terms = [-logp[b, t - 1, labels[b, t]] for b in range(2) for t in range(1, 5 + 0) if labels[b, t] != IGNORE]
    assert causal_lm_loss(logits, labels, reduction="sum").item() == pytest.approx(sum(terms).item(), rel=1e-12)
    assert causal_lm_loss(logits, labels).item() == pytest.approx(sum(terms).item() / len(terms), rel=1e-12)


def test_gradient_with_respect_to_logits_is_p_minus_onehot():
    torch.manual_seed(1)
    z = torch.randn(1, 2, 6, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([[IGNORE, 4]])
    causal_lm_loss(z, labels).backward()
    expected = torch.softmax(z[0, 0].detach(), -1) - F.one_hot(torch.tensor(4), 6)  # 000 §5.5
    torch.testing.assert_close(z.grad[0, 0], expected.double())
    assert torch.all(z.grad[0, 1] == 0)  # the last position predicts nothing


@settings(max_examples=20, deadline=None)
@given(st.floats(0.0, 0.9), st.integers(0, 1000))
def test_label_smoothing_matches_the_reference_and_pytorch(eps, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(1, 9, 5, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 5, (1, 9), generator=g)
    labels[0, 0] = IGNORE
    ours = causal_lm_loss(logits, labels, label_smoothing=eps)
    ref = label_smoothed_nll(logits[0, :-1], labels[0, 1:], eps)
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-12)


def test_label_smoothing_with_uniform_logits_is_log_k():
    logits = torch.zeros(1, 2, 8)
    assert causal_lm_loss(logits, torch.tensor([[IGNORE, 3]]), label_smoothing=0.3).item() == pytest.approx(math.log(8))




def test_reduction_none_gives_per_position_losses_that_sum_to_the_sum():
    torch.manual_seed(2)
    logits = torch.randn(2, 5, 7, dtype=torch.float64)
    labels = torch.tensor([[IGNORE, 3, 1, IGNORE, 6], [IGNORE, IGNORE, 2, 2, 0]])
    per = causal_lm_loss(logits, labels, reduction="none")
    assert per.shape == (2, 4)
    assert torch.all(per[labels[:, 1:] == IGNORE] == 0)
    torch.testing.assert_close(per.sum(), causal_lm_loss(logits, labels, reduction="sum"))


def test_mean_over_no_target_tokens_raises_instead_of_nan():
    logits = torch.zeros(1, 3, 5)
    labels = torch.full((1, 3), IGNORE)
    with pytest.raises(ValueError, match="every label is IGNORE"):
        causal_lm_loss(logits, labels)
    assert causal_lm_loss(logits, labels, reduction="sum").item() == 0.0


@pytest.mark.parametrize("kwargs, match", [({"reduction": "avg"}, "reduction"), ({"label_smoothing": 1.0}, "label_smoothing"),
                                           ({"label_smoothing": float("nan")}, "label_smoothing")])
def test_bad_loss_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        causal_lm_loss(torch.zeros(1, 2, 3), torch.tensor([[IGNORE, 1]]), **kwargs)


def test_mis_shaped_or_float_labels_raise():
    with pytest.raises(ValueError, match="labels"):
        causal_lm_loss(torch.zeros(1, 2, 3), torch.tensor([[IGNORE, 1, 1]]))
    with pytest.raises(TypeError, match="integer"):
        token_logprobs(torch.zeros(1, 2, 3), torch.tensor([[0.0, 1.0]]))


def test_token_logprobs_are_minus_the_per_token_loss_and_differentiable():
    torch.manual_seed(3)
    logits = torch.randn(2, 6, 9, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 9, (2, 6))
    labels[:, :2] = IGNORE
    lp = token_logprobs(logits, labels)
    torch.testing.assert_close(lp, -causal_lm_loss(logits, labels, reduction="none"))
    lp.sum().backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0


def test_sequence_logprobs_sum_the_kept_tokens_only():
    torch.manual_seed(4)
    logits = torch.randn(2, 5, 6, dtype=torch.float64)
    labels = torch.randint(0, 6, (2, 5))
    labels[:, 0] = IGNORE
    lp = token_logprobs(logits, labels)
    torch.testing.assert_close(sequence_logprobs(logits, labels), lp.sum(-1))
    keep = torch.tensor([[True, False, True, True], [False, False, False, True]])
    torch.testing.assert_close(sequence_logprobs(logits, labels, keep), (lp * keep).sum(-1))
    by_hand = torch.log_softmax(logits[1, 3], -1)[labels[1, 4]]
    assert sequence_logprobs(logits, labels, keep)[1].item() == pytest.approx(by_hand.item(), rel=1e-12)
    with pytest.raises(ValueError, match="mask"):
        sequence_logprobs(logits, labels, keep.long())


@pytest.mark.parametrize("bad", [5, 100, -1, -5])
@pytest.mark.parametrize("call", [
    lambda z, y: causal_lm_loss(z, y),
    lambda z, y: causal_lm_loss(z, y, reduction="sum"),
    lambda z, y: causal_lm_loss(z, y, reduction="none"),
    token_logprobs,
    sequence_logprobs,
])
def test_labels_outside_the_vocabulary_or_ignore_are_refused_by_name(call, bad):
    logits, labels = torch.zeros(1, 3, 5), torch.tensor([[IGNORE, 1, bad]])
    with pytest.raises(ValueError, match=rf"labels must be token ids in \[0, 5\) .* got {bad}"):
        call(logits, labels)


def test_logits_that_are_not_a_float_tensor_are_refused_by_name():
    labels = torch.tensor([[IGNORE, 1]])
    for logits in (torch.zeros(1, 2, 3, dtype=torch.long), [[[0.0] * 3] * 2], None):
        with pytest.raises(TypeError, match="logits must be a float tensor"):
            causal_lm_loss(logits, labels)
    import numpy as np

    smoothed = causal_lm_loss(torch.zeros(1, 2, 3), labels, label_smoothing=np.float32(0.1))
    assert smoothed.item() == pytest.approx(math.log(3))
