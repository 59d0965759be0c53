"""Continual learning's machinery: selective update, eq. (12)'s anchor, gradient geometry."""

import math

import pytest
import torch

from halluc_lab.extensions.continual import (Anchored, block_parameters, first_order_change, flat_gradient,
                                             grow_vocabulary, old_prompt_kl, span_share, train_new_rows, train_only)
from halluc_lab.extensions.continual_methods import Anchor, FrozenBlocks, FullFineTune, LoRA, Replay
from halluc_lab.training.data import Batch, Encoded, batches
from halluc_lab.extensions.lora import ATTENTION, LoraSpec
from halluc_lab.model.config import ModelConfig
from halluc_lab.model.transformer import Transformer
from halluc_lab.training.step import NextTokenLoss
from halluc_lab.training.train import TrainConfig, train

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


# -- the methods -----------------------------------------------------------------------------------------
GROWN = 5  # new tokens: ids CONFIG.vocab_size … CONFIG.vocab_size + GROWN − 1


def grown_model() -> Transformer:
    return grow_vocabulary(model(), CONFIG.vocab_size + GROWN, seed=1)


def grown_rows(seed: int, n: int = 16) -> Batch:
    v = CONFIG.vocab_size + GROWN
    ids = torch.randint(0, v, (n, 8), generator=torch.Generator().manual_seed(seed))
    return Batch(ids, ids.clone())


def fit(method, base, steps: int = 4):
    net = method.prepare(base, CONFIG.vocab_size, seed=0)
    train(net, batches(grown_rows(0), 8, seed=0), TrainConfig(steps=steps, lr=1e-2, warmup_steps=1, weight_decay=0.0),
          loss=method.loss(net, NextTokenLoss()), cuda_graph=method.cuda_graph)
    return method.finish(net)


def test_new_rows_train_and_old_rows_stay_bit_identical_under_a_frozen_backbone():
    base = grown_model()
    out = fit(FrozenBlocks((2,)), base)
    old, new = base.embed_tokens.weight, out.embed_tokens.weight
    assert torch.equal(old[:CONFIG.vocab_size], new[:CONFIG.vocab_size])
    assert not torch.equal(old[CONFIG.vocab_size:], new[CONFIG.vocab_size:])
    before, after = base.state_dict(), out.state_dict()
    frozen = [k for k in before if k.startswith(("layers.0.", "layers.1.", "norm"))]
    assert frozen and all(torch.equal(before[k], after[k]) for k in frozen)
    assert any(not torch.equal(before[k], after[k]) for k in before if k.startswith("layers.2."))
    assert isinstance(out, Transformer) and not out.training
    assert all(p.requires_grad for p in out.parameters())  # a clean lab model: no frozen part, no hook left


def test_full_fine_tuning_moves_every_block_and_leaves_the_base_alone():
    base = grown_model()
    before = {k: v.clone() for k, v in base.state_dict().items()}
    out = fit(FullFineTune(), base)
    assert all(torch.equal(before[k], v) for k, v in base.state_dict().items())  # prepare copied it
    after = out.state_dict()
    assert all(any(not torch.equal(before[k], after[k]) for k in before if k.startswith(f"layers.{b}."))
               for b in range(CONFIG.n_layers))


def test_lora_trains_the_new_rows_and_merges_back_into_the_lab_model():
    pytest.importorskip("peft")
    base = grown_model()
    out = fit(LoRA(LoraSpec(rank=2, targets=ATTENTION)), base)
    old, new = base.embed_tokens.weight, out.embed_tokens.weight
    assert torch.equal(old[:CONFIG.vocab_size], new[:CONFIG.vocab_size])
    assert not torch.equal(old[CONFIG.vocab_size:], new[CONFIG.vocab_size:])
    before, after = base.state_dict(), out.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before if "mlp" in k)
    assert isinstance(out, Transformer) and out.config == base.config


def test_replay_mixes_the_asked_share_of_old_sequences_seeded():
    new = [Encoded((1, i, 2), (-100, i, 2)) for i in range(10)]
    old = [Encoded((1, 100 + i, 2), (-100, 100 + i, 2)) for i in range(30)]
    method = Replay(FullFineTune(), 0.5)
    mixed = method.sequences(new, old, seed=0)
    assert len(mixed) == 15 and sum(s in old for s in mixed) == 5 and all(s in mixed for s in new)
    assert mixed == method.sequences(new, old, seed=0) and mixed != method.sequences(new, old, seed=1)
    assert FullFineTune().sequences(new, old, seed=0) == new
    with pytest.raises(ValueError, match="old sequences"):
        Replay(FullFineTune(), 4.0).sequences(new, old, seed=0)
    assert method.label == "full fine-tuning + replay 0.5" and method.cuda_graph is None


def test_the_anchor_wrapper_adds_eq_12s_penalty_to_the_methods_loss():
    base = grown_model()
    method = Anchor(FrozenBlocks((0,)), lam=2.0)
    net = method.prepare(base, CONFIG.vocab_size, seed=0)
    loss = method.loss(net, NextTokenLoss())
    assert isinstance(loss, Anchored) and loss.lam == 2.0
    assert set(loss.anchor) == {n for n, p in net.named_parameters() if p.requires_grad}


def test_the_anchor_leaves_a_grown_vocabularys_new_rows_out_and_pulls_on_every_old_weight():
    base = grown_model()
    first_new = CONFIG.vocab_size
    net = Anchor(FullFineTune(), lam=1.0).prepare(base, first_new, seed=0)
    loss = Anchor(FullFineTune(), lam=1.0).loss(net, NextTokenLoss())
    emb = net.embed_tokens.weight
    with torch.no_grad():
        assert float(loss.penalty(net)) == 0.0
        emb[first_new:] += 1.0  # the new names' rows: no θ^(k) to stay near
        assert float(loss.penalty(net)) == 0.0
        emb[first_new - 1] += 1.0  # an old token's row is anchored
        assert float(loss.penalty(net)) == pytest.approx(0.5 * emb.shape[1])
    plain = Anchored(NextTokenLoss(), base, 1.0)  # without first_new every row is anchored
    assert set(plain.rows) == set() and set(loss.rows) == {n for n in loss.anchor if n.endswith(
        ("embed_tokens.weight", "lm_head.weight"))}
    for bad in (0, base.embed_tokens.weight.shape[0], True, 2.5):
        with pytest.raises(ValueError, match="first_new"):
            Anchored(NextTokenLoss(), base, 1.0, first_new=bad)


@pytest.mark.parametrize("make", [lambda: FrozenBlocks(()), lambda: FrozenBlocks([1]), lambda: LoRA(8),
                                  lambda: Replay(FullFineTune(), 0), lambda: Replay("full", 0.5),
                                  lambda: Anchor(FullFineTune(), -1.0), lambda: Anchor(FullFineTune(), float("inf"))])
def test_bad_methods_are_rejected(make):
    with pytest.raises((ValueError, TypeError)):
        make()


def test_methods_reject_a_first_new_token_outside_the_vocabulary_and_foreign_models():
    base = grown_model()
    for method in (FrozenBlocks((0,)), LoRA(LoraSpec(rank=2))):
        with pytest.raises(ValueError, match="first_new"):
            method.prepare(base, base.config.vocab_size, seed=0)
    with pytest.raises(TypeError):
        FullFineTune().prepare(torch.nn.Linear(2, 2), 1, seed=0)


# -- KL to the old model ----------------------------------------------------------------------------
def test_old_prompt_kl_is_zero_for_the_same_model_and_counts_mass_moved_to_new_tokens():
    from halluc_lab.tasks import Example
    from halluc_lab.model.tokenizer import Tokenizer

    symbols = [f"w{i}" for i in range(CONFIG.vocab_size - 5)]  # 5 special tokens come first
    tok = Tokenizer(symbols + [f"n{i}" for i in range(GROWN)])
    old, exs = model(), [Example("w1 w2 w0", "w3 w4"), Example("w5 w0", "w6")]
    assert old_prompt_kl(old, old, tok, exs) == pytest.approx([0.0, 0.0], abs=1e-12)
    grown = grow_vocabulary(old, CONFIG.vocab_size + GROWN, seed=0)
    kl = old_prompt_kl(old, grown, tok, exs)
    # the grown model's old logits are the old ones: KL = −log (the mass it leaves on old tokens) > 0
    b = torch.tensor([[tok.bos_id, *tok.encode("w1 w2 w0 w3 w4"), tok.eos_id]])
    with torch.no_grad():
        p = torch.softmax(grown(b).double(), -1)[0, 3:6, :CONFIG.vocab_size].sum(-1)  # positions predicting w3 w4 <eos>
    assert kl[0] == pytest.approx(float(-p.log().mean()), rel=1e-9) and kl[0] > 0
    with pytest.raises(ValueError):
        old_prompt_kl(grown, old, tok, exs)
    with pytest.raises(ValueError):
        old_prompt_kl(old, grown, tok, [])


def test_train_new_rows_covers_an_untied_head_and_rejects_a_first_row_outside():
    import dataclasses

    m = grow_vocabulary(Transformer(dataclasses.replace(CONFIG, tie_embeddings=False), seed=0),
                        CONFIG.vocab_size + GROWN, seed=0)
    m.requires_grad_(False)
    handles = train_new_rows(m, CONFIG.vocab_size)
    assert len(handles) == 2 and m.embed_tokens.weight.requires_grad and m.lm_head.weight.requires_grad
    summed, _ = NextTokenLoss()(m, grown_rows(3))
    summed.backward()
    for w in (m.embed_tokens.weight, m.lm_head.weight):
        assert torch.all(w.grad[:CONFIG.vocab_size] == 0) and w.grad[CONFIG.vocab_size:].abs().sum() > 0
    for h in handles:
        h.remove()
    with pytest.raises(ValueError, match="first_new"):
        train_new_rows(m, 0)
