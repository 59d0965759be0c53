"""Continual learning's machinery: selective update, eq. (12)'s anchor, gradient geometry."""

import math

import pytest
import torch

from halluc_lab.continual import (Anchored, block_parameters, first_order_change, flat_gradient, grow_vocabulary,
                                  span_share, train_only)
from halluc_lab.data import Batch, batches
from halluc_lab.model import ModelConfig, Transformer
from halluc_lab.step import NextTokenLoss
from halluc_lab.train import TrainConfig, train

CONFIG = ModelConfig(vocab_size=16, hidden_size=16, n_layers=3, n_heads=2)


def model() -> Transformer:
    return Transformer(CONFIG, seed=0)


def rows(seed: int, n: int = 16) -> Batch:
    ids = torch.randint(0, CONFIG.vocab_size, (n, 8), generator=torch.Generator().manual_seed(seed))
    return Batch(ids, ids.clone())


def test_training_only_one_block_leaves_every_other_parameter_bit_identical():
    m = model()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    names = train_only(m, block_parameters(m, [2]))
    assert names and all(n.startswith("layers.2.") for n in names)
    train(m, batches(rows(0), 8, seed=0), TrainConfig(steps=4, lr=1e-2, warmup_steps=1))
    after = m.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before if not k.startswith("layers.2."))
    assert any(not torch.equal(before[k], after[k]) for k in names)


@pytest.mark.parametrize("bad", [[], [3], [-1], [True]])
def test_block_parameters_rejects_blocks_the_model_lacks(bad):
    with pytest.raises(ValueError):
        block_parameters(model(), bad)


def test_train_only_rejects_unknown_names():
    with pytest.raises(ValueError, match="unknown"):
        train_only(model(), ["layers.9.nothing"])


def test_the_anchor_adds_lambda_half_the_squared_distance_and_its_gradient_pulls_back():
    m = model()
    train_only(m, block_parameters(m, [0]))
    base = NextTokenLoss()
    anchored = Anchored(base, m, lam=0.5)
    batch = rows(1)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if p.requires_grad:
                p.add_(0.1)  # every trainable weight 0.1 from its anchor
    n_trainable = sum(p.numel() for p in m.parameters() if p.requires_grad)
    with torch.no_grad():
        assert float(anchored.penalty(m)) == pytest.approx(0.5 * n_trainable * 0.01, rel=1e-4)
        (s0, c0), (s1, c1) = base(m, batch), anchored(m, batch)
        assert float(s1 / c1 - s0 / c0) == pytest.approx(0.5 * float(anchored.penalty(m)), rel=1e-5)
        assert torch.equal(Anchored(base, m, lam=0)(m, batch)[0], s0)  # λ = 0: the loss itself
    g0, g1 = flat_gradient(m, base, batch), flat_gradient(m, anchored, batch)
    torch.testing.assert_close(g1 - g0, torch.full_like(g0, 0.5 * 0.1), rtol=1e-3, atol=1e-5)  # λ (ϑ − θ^(k))
    with pytest.raises(ValueError):
        Anchored(base, m, lam=-1.0)


def test_flat_gradient_is_autograds_and_leaves_grad_fields_alone():
    m, batch = model(), rows(2)
    g = flat_gradient(m, NextTokenLoss(), batch)
    assert all(p.grad is None for p in m.parameters())
    summed, count = NextTokenLoss()(m, batch)
    (summed / count).backward()
    torch.testing.assert_close(g, torch.cat([p.grad.flatten() for p in m.parameters()]))


def test_span_share_is_one_inside_zero_orthogonal_and_cos_squared_between():
    e1, e2, e3 = torch.eye(3)
    assert span_share(e1 + e2, [e1, e2]) == pytest.approx(1.0)
    assert span_share(e3, [e1, e2]) == pytest.approx(0.0)
    theta = 0.3
    g = torch.tensor([math.cos(theta), 0.0, math.sin(theta)])
    assert span_share(g, [e1, 2 * e1]) == pytest.approx(math.cos(theta) ** 2)  # a dependent column changes nothing
    with pytest.raises(ValueError):
        span_share(torch.zeros(3), [e1])
    with pytest.raises(ValueError):
        span_share(e1, [])


def test_first_order_change_predicts_a_small_steps_change_of_the_old_loss():
    """001 Part 4 §1: a step on the new loss moves the old one by about −η ⟨g_old, g_new⟩."""
    m, old, new, lr = model(), rows(3), rows(4), 1e-3
    loss = NextTokenLoss()
    g_old, g_new = flat_gradient(m, loss, old), flat_gradient(m, loss, new)

    def mean(batch):
        with torch.no_grad():
            summed, count = loss(m, batch)
            return float(summed / count)

    before = mean(old)
    with torch.no_grad():
        start = 0
        for p in m.parameters():
            p.sub_(lr * g_new[start:start + p.numel()].view_as(p))
            start += p.numel()
    actual = mean(old) - before
    predicted = first_order_change(g_old, g_new, lr)
    assert predicted != 0 and actual == pytest.approx(predicted, rel=0.05)


def test_a_grown_vocabulary_keeps_every_old_logit_and_adds_seeded_rows():
    m = model()
    grown = grow_vocabulary(m, CONFIG.vocab_size + 5, seed=3)
    x = rows(5).input_ids[:2]
    with torch.no_grad():
        old, new = m(x), grown(x)
    assert new.shape[-1] == CONFIG.vocab_size + 5
    torch.testing.assert_close(new[..., :CONFIG.vocab_size], old)  # the old tokens' logits are unchanged
    again = grow_vocabulary(m, CONFIG.vocab_size + 5, seed=3)
    assert torch.equal(again.embed_tokens.weight, grown.embed_tokens.weight)
    assert not torch.equal(grow_vocabulary(m, CONFIG.vocab_size + 5, seed=4).embed_tokens.weight,
                           grown.embed_tokens.weight)
    with pytest.raises(ValueError):
        grow_vocabulary(m, CONFIG.vocab_size - 1, seed=0)
