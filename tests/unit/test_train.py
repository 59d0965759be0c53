"""The training loop: schedule, AdamW, accumulation, resume and checkpoint integrity."""

import dataclasses
import math
import os

import pytest
import torch

from halluc_lab.training.data import IGNORE, Batch, batches
from halluc_lab.training.train import (CheckpointError, NextTokenLoss, TrainConfig, accumulate_gradients, adamw_reference_step,
                              latest_checkpoint, load_checkpoint, lr_at, make_optimizer, train)
from tests.unit._tiny_lm import TinyConfig, TinyLM


def rows(n=16, t=10, vocab=12, seed=0):
    """Rows of a learnable pattern (each token is the previous plus one), some labels masked."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(1, vocab, (n, 1), generator=g)
    ids = (start + torch.arange(t)) % vocab  # (N, T)
    labels = ids.clone()
    labels[:, 0] = IGNORE
    cut = torch.randint(1, t // 2, (n,), generator=g)  # uneven numbers of targets per row
    labels[torch.arange(t)[None, :] < cut[:, None]] = IGNORE
    return Batch(ids, labels)


def model(seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    return TinyLM(TinyConfig()).to(dtype)


def test_schedule_matches_the_document_formula_and_hugging_face():
    from transformers import get_cosine_schedule_with_warmup

    cfg = TrainConfig(steps=50, lr=3e-3, warmup_steps=7)
    for t in range(cfg.steps + 1):
        doc = cfg.lr * t / 7 if t <= 7 else cfg.lr * 0.5 * (1 + math.cos(math.pi * (t - 7) / (50 - 7)))
        assert lr_at(t, cfg) == pytest.approx(doc, abs=1e-15)
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=cfg.lr)
    hf = get_cosine_schedule_with_warmup(opt, num_warmup_steps=7, num_training_steps=50)
    for t in range(cfg.steps + 1):  # HF evaluates the same function at t = 0, 1, ...
        assert lr_at(t, cfg) == pytest.approx(cfg.lr * hf.lr_lambdas[0](t), abs=1e-15)
    assert lr_at(7, cfg) == cfg.lr and lr_at(50, cfg) == pytest.approx(0.0, abs=1e-18)
    no_warmup = TrainConfig(steps=10, lr=1.0, warmup_steps=0)
    assert lr_at(0, no_warmup) == 1.0 and lr_at(5, no_warmup) == pytest.approx(0.5)


def test_reference_adamw_matches_torch_adamw():
    torch.manual_seed(0)
    p_ref = torch.randn(5, 3, dtype=torch.float64)
    p = p_ref.clone().requires_grad_(True)
    opt = torch.optim.AdamW([p], lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    m, v = torch.zeros_like(p_ref), torch.zeros_like(p_ref)
    for t in range(1, 6):
        g = torch.randn(5, 3, dtype=torch.float64)
        p.grad = g.clone()
        opt.step()
        adamw_reference_step(p_ref, g, m, v, t, lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
        torch.testing.assert_close(p.detach(), p_ref, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("k", [2, 3, 16])
def test_accumulation_gives_the_large_batch_gradient(k):
    batch = rows()
    assert len(set((batch.labels != IGNORE).sum(1).tolist())) > 1  # micro-batches differ in target counts
    big, acc = model(dtype=torch.float64), model(dtype=torch.float64)
    loss_big, n_big = accumulate_gradients(big, batch, 1)
    loss_acc, n_acc = accumulate_gradients(acc, batch, k)
    torch.testing.assert_close(loss_acc, loss_big, rtol=1e-12, atol=0)
    assert n_acc.item() == n_big.item() == batch.n_targets.item()
    for a, b in zip(acc.parameters(), big.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-10, atol=1e-14)


def test_mean_of_microbatch_means_is_not_the_large_batch_gradient_when_counts_differ():
    batch = rows()
    big = model(dtype=torch.float64)
    accumulate_gradients(big, batch, 1)
    naive = model(dtype=torch.float64)
    for half in (batch[:8], batch[8:]):  # 000 §5.7 literally: (1/K) Σ_k ∇L^(k) with per-micro-batch means
        from halluc_lab.training.losses import causal_lm_loss
        (causal_lm_loss(naive(half.input_ids), half.labels) / 2).backward()
    assert not torch.allclose(naive.head.weight.grad, big.head.weight.grad, rtol=1e-6)


def test_training_lowers_the_loss():
    m = model()
    hist = train(m, batches(rows(64), 16, seed=0), TrainConfig(steps=60, lr=3e-2, warmup_steps=5, log_every=10))
    assert hist.step == list(range(1, 61)) and len(hist.loss) == 60
    assert sum(hist.loss[-5:]) / 5 < 0.5 * sum(hist.loss[:5]) / 5
    assert hist.lr[0] == pytest.approx(3e-2 / 5) and all(r > 0 for r in hist.tokens_per_s)


class Crash(RuntimeError):
    pass


def test_resume_continues_exactly_as_without_the_interruption(tmp_path):
    cfg = TrainConfig(steps=8, lr=1e-2, warmup_steps=2, checkpoint_every=3, log_every=2)
    data = batches(rows(32), 8, seed=1)
    straight = model()
    full = train(straight, data, cfg, checkpoint_dir=tmp_path / "a")

    def crashing(i):
        if i == 4:  # step 5: after the checkpoint at step 3 (and before the one at 6)
            raise Crash
        return data(i)

    interrupted = model()
    with pytest.raises(Crash):
        train(interrupted, crashing, cfg, checkpoint_dir=tmp_path / "b")
    assert latest_checkpoint(tmp_path / "b").endswith("step-000003")
    resumed = model(seed=123)  # different initial weights: everything must come from the checkpoint
    hist = train(resumed, data, cfg, checkpoint_dir=tmp_path / "b", resume=True)
    assert hist.step == full.step and hist.loss == full.loss and hist.grad_norm == full.grad_norm
    for a, b in zip(resumed.parameters(), straight.parameters()):
        assert torch.equal(a, b)


def _one_checkpoint(tmp_path, cfg):
    m = model()
    train(m, batches(rows(16), 8, seed=0), cfg, checkpoint_dir=tmp_path)
    return latest_checkpoint(tmp_path)


def test_corrupted_weights_raise_instead_of_loading(tmp_path):
    cfg = TrainConfig(steps=2, warmup_steps=1)
    path = _one_checkpoint(tmp_path, cfg)
    weights = os.path.join(path, "model.safetensors")
    data = bytearray(open(weights, "rb").read())
    data[-3] ^= 0xFF
    open(weights, "wb").write(bytes(data))
    fresh = model(seed=5)
    before = [p.clone() for p in fresh.parameters()]
    with pytest.raises(CheckpointError, match="corrupted"):
        load_checkpoint(path, fresh, make_optimizer(fresh, cfg), cfg)
    assert all(torch.equal(a, b) for a, b in zip(fresh.parameters(), before))


def test_truncated_state_file_raises(tmp_path):
    cfg = TrainConfig(steps=2, warmup_steps=1)
    path = _one_checkpoint(tmp_path, cfg)
    state = os.path.join(path, "trainer_state.pt")
    open(state, "wb").write(open(state, "rb").read()[:100])
    with pytest.raises(CheckpointError, match="cannot read"):
        load_checkpoint(path, model(), None, cfg)


def test_checkpoint_of_another_config_or_model_raises(tmp_path):
    cfg = TrainConfig(steps=2, warmup_steps=1)
    path = _one_checkpoint(tmp_path, cfg)
    with pytest.raises(CheckpointError, match="another TrainConfig.*lr"):
        load_checkpoint(path, model(), None, dataclasses.replace(cfg, lr=5e-4))
    with pytest.raises(CheckpointError, match="different model"):
        load_checkpoint(path, TinyLM(TinyConfig(dim=6)), None, cfg)


def test_non_finite_loss_raises():
    m = model()
    with torch.no_grad():
        m.head.bias.fill_(float("nan"))
    with pytest.raises(FloatingPointError, match="step 1"):
        train(m, batches(rows(8), 8, seed=0), TrainConfig(steps=2, warmup_steps=1, log_every=1))


@pytest.mark.parametrize("kwargs, match", [({"steps": 0}, "steps"), ({"warmup_steps": 1000}, "warmup_steps"),
                                           ({"lr": -1.0}, "lr"), ({"accum_steps": 0}, "accum_steps"),
                                           ({"grad_clip": 0.0}, "grad_clip"), ({"betas": (0.9, 1.0)}, "betas"),
                                           ({"eps": float("nan")}, "eps"), ({"eps": float("inf")}, "eps"),
                                           ({"weight_decay": float("nan")}, "weight_decay"),
                                           ({"weight_decay": float("inf")}, "weight_decay"),
                                           ({"grad_clip": float("inf")}, "grad_clip")])
def test_bad_config_values_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(**kwargs)


def test_label_smoothing_out_of_range_raises():
    with pytest.raises(ValueError, match="label_smoothing"):
        NextTokenLoss(label_smoothing=1.0)


def test_the_loop_trains_any_loss_it_is_given():
    """A loss that counts rows, not tokens (as DPO or a reward model do): the loop divides by its count."""
    calls = []

    def last_token_loss(m, batch):
        logits = m(batch.input_ids)  # (B, T, V)
        calls.append(batch.input_ids.shape[0])
        return -torch.log_softmax(logits[:, -2], -1).gather(-1, batch.input_ids[:, -1:]).sum(), \
            torch.tensor(float(batch.input_ids.shape[0]))

    m = model()
    hist = train(m, batches(rows(16), 8, seed=0), TrainConfig(steps=30, lr=3e-2, warmup_steps=2, log_every=5,
                                                              accum_steps=2), loss=last_token_loss)
    assert calls[:2] == [4, 4] and len(calls) == 60
    assert hist.loss[-1] < hist.loss[0]


def test_a_batch_without_targets_is_an_error_not_a_silent_zero_loss():
    empty = rows(8)
    empty = Batch(empty.input_ids, torch.full_like(empty.labels, IGNORE))
    with pytest.raises(ValueError, match="no target tokens"):
        train(model(), batches(empty, 8, seed=0), TrainConfig(steps=2, warmup_steps=1, log_every=1))


def test_bad_step_and_accumulation_raise():
    with pytest.raises(ValueError, match="step must be"):
        lr_at(11, TrainConfig(steps=10, warmup_steps=1))
    with pytest.raises(ValueError, match="accum_steps"):
        accumulate_gradients(model(), rows(4), 5)


# -- the captured step (CUDA) ----------------------------------------------------------------------
def _lab_rows(device):
    from halluc_lab.training.data import encode_example, pack
    from halluc_lab.tasks import Arithmetic, ArithmeticConfig

    task = Arithmetic(ArithmeticConfig(max_digits=2))
    tok = task.tokenizer()
    seqs = [encode_example(tok, e) for e in task.examples("train", 400, seed=0)]
    return pack(seqs, 32, tok.pad_id).to(device), tok.vocab_size


def _lab_model(vocab, device):
    from tests.unit._tiny_lm import small_transformer

    return small_transformer(vocab, seed=0).train().to(device)


@pytest.mark.gpu
def test_captured_step_trains_as_the_eager_step_does_and_repeats_bit_for_bit():
    dev = torch.device("cuda")
    rows_, vocab = _lab_rows(dev)
    cfg = TrainConfig(steps=30, lr=3e-3, warmup_steps=3, log_every=5, accum_steps=2)

    def run(graph):
        m = _lab_model(vocab, dev)
        h = train(m, batches(rows_, 16, seed=0), cfg, cuda_graph=graph, autocast_dtype=torch.bfloat16)
        return h, [p.detach().clone() for p in m.parameters()]

    eager, graphed, again = run(False), run(True), run(True)
    assert graphed[0].loss == again[0].loss and graphed[0].grad_norm == again[0].grad_norm
    assert all(torch.equal(a, b) for a, b in zip(graphed[1], again[1]))
    # The same arithmetic in another order of kernels: equal to rounding, not to the bit.
    assert max(abs(a - b) for a, b in zip(eager[0].loss, graphed[0].loss)) < 0.05 * eager[0].loss[0]
    assert graphed[0].loss[-1] < 0.8 * graphed[0].loss[0]


@pytest.mark.gpu
def test_captured_step_resumes_exactly_as_without_the_interruption(tmp_path):
    dev = torch.device("cuda")
    rows_, vocab = _lab_rows(dev)
    cfg = TrainConfig(steps=12, lr=3e-3, warmup_steps=2, checkpoint_every=4, log_every=2)
    data = batches(rows_, 16, seed=1)
    straight = _lab_model(vocab, dev)
    full = train(straight, data, cfg, checkpoint_dir=tmp_path / "a", cuda_graph=True, autocast_dtype=torch.bfloat16)

    def crashing(i):
        if i == 6:
            raise Crash
        return data(i)

    with pytest.raises(Crash):
        train(_lab_model(vocab, dev), crashing, cfg, checkpoint_dir=tmp_path / "b", cuda_graph=True,
              autocast_dtype=torch.bfloat16)
    resumed = _lab_model(vocab, dev)
    hist = train(resumed, data, cfg, checkpoint_dir=tmp_path / "b", resume=True, cuda_graph=True,
                 autocast_dtype=torch.bfloat16)
    assert hist.loss == full.loss and hist.grad_norm == full.grad_norm
    assert all(torch.equal(a, b) for a, b in zip(resumed.parameters(), straight.parameters()))


def test_a_captured_step_needs_a_cuda_model():
    with pytest.raises(ValueError, match="cuda_graph=True needs"):
        train(model(), batches(rows(8), 8, seed=0), TrainConfig(steps=2, warmup_steps=1), cuda_graph=True)


def test_graphs_run_a_body_eagerly_each_time_or_capture_it_once_by_name(monkeypatch):
    from halluc_lab.training import step

    calls = []

    def body(tag):
        def run():
            calls.append(tag)
            return torch.tensor(len(calls))
        return run

    eager = step.Graphs(enabled=False)
    assert [int(eager.run("a", body("a"))) for _ in range(3)] == [1, 2, 3]  # the body every time

    captured, replays = [], []

    class StandIn:  # a graph that counts its replays (capture_graph itself is tested on CUDA by PPO and DPO)
        def replay(self):
            replays.append(self)

    def stand_in_capture(fn, optimizers=()):
        captured.append(tuple(optimizers))
        return StandIn(), fn()

    monkeypatch.setattr(step, "capture_graph", stand_in_capture)
    calls.clear()
    graphs, opt = step.Graphs(), object()
    outs = [graphs.run("update", body("u"), [opt]) for _ in range(3)] + [graphs.run("score", body("s"))]
    assert calls == ["u", "s"] and captured == [(opt,), ()]  # each name captured once, with its optimizers
    assert len(replays) == 4 and outs[0] is outs[1] is outs[2]  # replays return the capture's outputs


@pytest.mark.parametrize("field, value", [
    (field, value) for field in ("lr", "eps", "weight_decay", "grad_clip", "betas", "steps",
                                 "log_every")
    for value in (None, "1e-3", True) if (field, value) != ("grad_clip", None)])  # None: no clip
def test_config_fields_of_the_wrong_type_are_named_with_their_range(field, value):
    with pytest.raises(ValueError, match=rf"^{field} must be .*(>|in \[0, 1\)).*, got {value!r}"):
        TrainConfig(**{field: value})


def test_config_accepts_numpy_numbers_and_holds_them_as_python_numbers():
    import numpy as np

    from halluc_lab.training.train import lr_at

    cfg = TrainConfig(steps=np.int64(10), warmup_steps=np.int32(2), lr=np.float32(0.5),
                      betas=(np.float64(0.9), 0.95))
    assert cfg == TrainConfig(steps=10, warmup_steps=2, lr=0.5, betas=(0.9, 0.95))
    assert type(cfg.steps) is int and type(cfg.lr) is float and type(cfg.betas[0]) is float
    assert lr_at(np.int64(1), cfg) == lr_at(1, cfg)


def test_next_token_loss_accepts_a_numpy_smoothing_and_refuses_a_bool():
    import numpy as np

    assert NextTokenLoss(np.float32(0.1)).label_smoothing == np.float32(0.1)
    with pytest.raises(ValueError, match="label_smoothing"):
        NextTokenLoss(True)
