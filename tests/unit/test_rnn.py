"""halluc_lab.foundations.rnn: the Elman RNN LM and its hand-derived BPTT gradients (003 §2, boxed i–vii)."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from halluc_lab.foundations import rnn
from halluc_lab.foundations.autoregressive import prediction_mask


def setup_case(vocab=6, hidden=5, batch=3, steps=7, seed=0, p=None):
    g = torch.Generator().manual_seed(seed)
    model = rnn.ElmanLM(rnn.RNNConfig(vocab, hidden, init_scale=1.5), g)
    if p is not None:  # general inputs x_t ∈ R^p: replace W_xh with an H × p matrix
        model.W_xh = torch.nn.Parameter(torch.randn(hidden, p, generator=g))
    x = torch.randn(batch, steps, model.W_xh.shape[1], generator=g)
    targets = torch.randint(0, vocab, (batch, steps), generator=g)
    return model, x, targets


def test_forward_matches_torch_nn_rnn():
    model, x, _ = setup_case()
    ref = torch.nn.RNN(6, 5, nonlinearity="tanh", batch_first=True)
    with torch.no_grad():
        ref.weight_ih_l0.copy_(model.W_xh)
        ref.weight_hh_l0.copy_(model.W_hh)
        ref.bias_ih_l0.copy_(model.b_h)
        ref.bias_hh_l0.zero_()
    out, _ = ref(x)
    torch.testing.assert_close(torch.stack(model.trace(x).h[1:], dim=1), out)


def test_token_forward_is_the_one_hot_trace():
    model, _, targets = setup_case()
    x = F.one_hot(targets, 6).float()
    torch.testing.assert_close(model(targets), model.trace(x).z)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), hidden=st.integers(1, 6), steps=st.integers(1, 6),
       p=st.integers(1, 4), masked=st.booleans())
def test_every_boxed_gradient_agrees_with_autograd_in_float64(seed, hidden, steps, p, masked):
    model, x, targets = setup_case(hidden=hidden, steps=steps, seed=seed, p=p)
    mask = torch.rand(targets.shape, generator=torch.Generator().manual_seed(seed)) > 0.3 if masked else None
    errors = rnn.gradient_check(model, x, targets, mask)
    assert set(errors) == set(rnn.GRADIENT_NAMES)
    assert max(errors.values()) < 1e-8, errors


def test_gradient_check_detects_a_wrong_gradient(monkeypatch):
    model, x, targets = setup_case()
    wrong = lambda m, x, *a, **k: (1 + torch.stack(m.trace(x).h[1:], 1) ** 2)[..., None] * m.W_hh
    monkeypatch.setattr(rnn, "jacobians", wrong)  # D_t with 1 + h² instead of 1 - h²
    assert rnn.gradient_check(model, x, targets)["J"] > 1e-2


def test_parameter_gradients_match_autograd_of_the_loss_in_float32():
    model, x, targets = setup_case()
    loss = rnn.sequence_loss(model, x, targets)
    loss.backward()
    hand = rnn.bptt(model, x, targets)
    torch.testing.assert_close(hand.loss, loss.detach())
    for name, param in model.named_parameters():
        torch.testing.assert_close(getattr(hand, name), param.grad, rtol=1e-5, atol=1e-6)


def test_recursion_ends_with_the_local_term_and_jacobian_is_d_times_w():
    model, x, targets = setup_case()
    g = rnn.bptt(model, x, targets)
    torch.testing.assert_close(g.s[:, -1], g.delta[:, -1])  # s_T = δ_T  (s_{T+1} = 0)
    torch.testing.assert_close(g.dz.sum(-1), torch.zeros(3, 7), atol=1e-6, rtol=0)  # Σ_i (p - y)_i = 0
    J = rnn.jacobians(model, x)
    h1 = model.trace(x).h[1]
    torch.testing.assert_close(J[:, 0], torch.diag_embed(1 - h1 ** 2) @ model.W_hh.detach())


def test_masked_positions_add_nothing():
    model, x, targets = setup_case()
    mask = torch.ones_like(targets, dtype=torch.bool)
    mask[:, 4:] = False
    full = rnn.bptt(model, x[:, :4], targets[:, :4])
    masked = rnn.bptt(model, x, targets, mask)
    torch.testing.assert_close(masked.loss, full.loss)
    torch.testing.assert_close(masked.W_hh, full.W_hh)


def test_training_with_hand_gradients_learns_a_deterministic_cycle():
    # sequences BOS, 1, 2, 3, 1, 2, 3, ...: after training, the next token is predictable
    tokens = torch.tensor([[0] + [1 + (i % 3) for i in range(9)]] * 8)
    mask = prediction_mask(tokens, eos_id=5)
    model = rnn.ElmanLM(rnn.RNNConfig(6, 8), torch.Generator().manual_seed(0))
    losses = rnn.train_lm(model, tokens, mask, steps=60, batch_size=4, lr=0.1,
                          generator=torch.Generator().manual_seed(1))
    assert losses[0] > 1.0  # about ln 6 at the start
    assert losses[-1] < 0.2 * losses[0]


def test_bad_input_is_rejected():
    model, x, targets = setup_case()
    with pytest.raises(ValueError, match="hidden_size"):
        rnn.ElmanLM(rnn.RNNConfig(4, 0), torch.Generator())
    with pytest.raises(ValueError, match="init_scale"):
        rnn.ElmanLM(rnn.RNNConfig(4, 2, init_scale=0.0), torch.Generator())
    with pytest.raises(ValueError, match="x must have shape"):
        model.trace(x[..., :2])
    with pytest.raises(ValueError, match="h0"):
        model.trace(x, h0=torch.zeros(3, 2))
    with pytest.raises(ValueError, match="targets"):
        rnn.bptt(model, x, targets + 10)
    with pytest.raises(ValueError, match="targets"):
        rnn.sequence_loss(model, x, targets[:, :3])
    with pytest.raises(TypeError, match="x must"):
        rnn.bptt(model, targets, targets)
    with pytest.raises(ValueError, match="mask"):
        rnn.bptt(model, x, targets, mask=torch.ones(3, 7))
    tokens = torch.zeros(4, 5, dtype=torch.long)
    with pytest.raises(ValueError, match="mask"):
        rnn.train_lm(model, tokens, torch.ones(4, 5, dtype=torch.bool), 1, 1, 0.1, torch.Generator())
    with pytest.raises(ValueError, match="steps"):
        rnn.train_lm(model, tokens, torch.ones(4, 4, dtype=torch.bool), 0, 1, 0.1, torch.Generator())
    with pytest.raises(ValueError, match="lr"):
        rnn.train_lm(model, tokens, torch.ones(4, 4, dtype=torch.bool), 1, 1, -0.1, torch.Generator())


@pytest.mark.gpu
def test_gradient_check_and_training_on_cuda():
    model, x, targets = setup_case()
    model, x, targets = model.to("cuda"), x.to("cuda"), targets.to("cuda")
    assert max(rnn.gradient_check(model, x, targets).values()) < 1e-8
    tokens = torch.tensor([[0] + [1 + (i % 3) for i in range(9)]] * 8, device="cuda")
    mask = prediction_mask(tokens, eos_id=5)
    losses = rnn.train_lm(model, tokens, mask, steps=20, batch_size=4, lr=0.05,
                          generator=torch.Generator(device="cuda").manual_seed(1))
    assert losses[-1] < losses[0]
