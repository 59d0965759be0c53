"""One plain training loop: AdamW, warmup + cosine, accumulation, clipping, checkpoints, resume.

Chapters 7–8. Sources: 000 §5.7 (gradient accumulation), §5.8 (AdamW, Loshchilov & Hutter
2019; linear warmup then cosine annealing); 001 Part 1 Listing 2 (the training step:
forward, ``zero_grad``, ``backward``, ``step``).

The loop knows no loss: it takes a callable ``loss(model, batch) -> (summed loss, count)``
(:data:`halluc_lab.training.step.Loss`); :mod:`halluc_lab.training.step` runs one optimizer step
with it (eagerly, or replayed as a CUDA graph on a GPU). Next-token cross-entropy
(:class:`~halluc_lab.training.step.NextTokenLoss`, pre-training and SFT) is the default; DPO, a
reward model or a policy gradient pass their own — no loss is ever chosen by a string. Data come
from a function ``step -> Batch`` (:func:`halluc_lab.training.data.batches`) so that a resumed run
sees exactly the batches it would have seen; the only other randomness (scheduled sampling)
is seeded by the step as well. Hence resuming from a checkpoint reproduces the losses of
an uninterrupted run (tested).

Checkpoints go to ``checkpoint_dir/step-NNNNNN/``: the model's state dict as
``model.safetensors`` (any ``nn.Module``; shared weights saved once) and ``trainer_state.pt``
(optimizer state, step, history, the config, and SHA-256 checksums of the weight files). Loading one
checks all of it and raises :class:`CheckpointError` on any mismatch: never a partial load.

Departures: the schedule counts optimizer steps from t = 1, so the first update already
uses η0/W (Hugging Face's ``get_cosine_schedule_with_warmup`` is the same function of t but
starts at t = 0, where the rate is 0). Weight decay applies to matrices only (embeddings and
linear weights), not to norm gains, as in nanoGPT.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from numbers import Integral, Real

import torch
from safetensors.torch import load_model, save_model
from torch import nn

from halluc_lab.training import distributed
from halluc_lab.training.data import Batch
from halluc_lab.device import deterministic
from halluc_lab.progress import progress
from halluc_lab.training.step import (CapturedStep, EagerStep, Loss, NextTokenLoss,
                                      accumulate_gradients,  # noqa: F401
                             make_optimizer)

STATE_FILE = "trainer_state.pt"


class CheckpointError(ValueError):
    """A checkpoint that is corrupted or belongs to a different run."""


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings of one run (000 §5.8 notation in brackets)."""

    steps: int = 1000  # optimizer steps [T]
    lr: float = 1e-3  # peak learning rate [η0]
    warmup_steps: int = 100  # linear warmup steps [W]
    betas: tuple[float, float] = (0.9, 0.95)  # Adam moment decays [β1, β2]
    eps: float = 1e-8  # Adam denominator guard [ε]
    weight_decay: float = 0.1  # decoupled weight decay on matrices [λ]
    grad_clip: float | None = 1.0  # clip the global gradient norm to this (None: no clipping)
    accum_steps: int = 1  # micro-batches per optimizer step [K of 000 §5.7]
    checkpoint_every: int = 0  # save every N steps (0: only at the end, when a directory is given)
    keep_checkpoints: int = 2  # how many recent checkpoints to keep on disk
    log_every: int = 25  # steps between host syncs that record the history

    def __post_init__(self):
        for name, low in (("steps", 1), ("warmup_steps", 0), ("accum_steps", 1),
                          ("checkpoint_every", 0), ("keep_checkpoints", 1), ("log_every", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, Integral) or v < low:
                raise ValueError(f"{name} must be an int >= {low}, got {v!r}")
            object.__setattr__(self, name, int(v))  # a numpy integer: the int a cache key holds
        if self.warmup_steps >= self.steps:
            raise ValueError(f"warmup_steps must be < steps ({self.steps}), "
                             f"got {self.warmup_steps}")
        for name, low, what in (("lr", 0, "a finite number > 0"), ("eps", 0, "a finite number > 0"),
                                ("weight_decay", None, "a finite number >= 0"),
                                ("grad_clip", 0, "a finite number > 0 or None")):
            v = getattr(self, name)
            if v is None and name == "grad_clip":
                continue
            if (isinstance(v, bool) or not isinstance(v, Real)
                    or not ( math.isfinite(v) and (v >= 0 if low is None else v > low))):
                raise ValueError(f"{name} must be {what}, got {v!r}")
            object.__setattr__(self, name, _plain(v))
        betas = self.betas
        if not (isinstance(betas, (tuple, list)) and len(betas) == 2 and all(
                isinstance(b, Real) and not isinstance(b, bool) and 0 <= b < 1 for b in betas)):
            raise ValueError(f"betas must be two numbers in [0, 1), got {betas!r}")
        object.__setattr__(self, "betas", tuple(_plain(b) for b in betas))


def _plain(x: Real) -> int | float:
    """A numpy scalar as the Python float a cache key can hold; a Python int or float unchanged."""
    return x if type(x) in (int, float) else float(x)


def lr_at(step: int, cfg: TrainConfig) -> float:
    """η_t of 000 §5.8: η0·t/W for t ≤ W, then η0·½(1 + cos(π (t − W)/(T − W))).

    >>> cfg = TrainConfig(steps=10, lr=1.0, warmup_steps=2)
    >>> [round(lr_at(t, cfg), 3) for t in (1, 2, 6, 10)]
    [0.5, 1.0, 0.5, 0.0]
    """
    if isinstance(step, bool) or not isinstance(step, Integral) or not 0 <= step <= cfg.steps:
        raise ValueError(f"step must be an int in [0, {cfg.steps}], got {step!r}")
    # W = 0: no warmup, the cosine starts at t = 0
    if step <= cfg.warmup_steps and cfg.warmup_steps > 0:
        return cfg.lr * step / cfg.warmup_steps
    angle = math.pi * (step - cfg.warmup_steps) / (cfg.steps - cfg.warmup_steps)
    return cfg.lr * 0.5 * (1.0 + math.cos(angle))


@torch.no_grad()
def adamw_reference_step(param: torch.Tensor, grad: torch.Tensor, m: torch.Tensor, v: torch.Tensor,
                         t: int, lr: float, betas: tuple[float, float], eps: float,
                         weight_decay: float) -> None:
    """One AdamW update written as 000 §5.8 states it, in place (``torch.optim.AdamW`` agrees,
    tested).

    m_t = β1 m + (1−β1) g;  v_t = β2 v + (1−β2) g²;  m̂ = m_t/(1−β1^t);  v̂ = v_t/(1−β2^t);
    θ_t = θ − η (m̂/(√v̂ + ε) + λ θ).
    """
    b1, b2 = betas
    m.mul_(b1).add_((1 - b1) * grad)
    v.mul_(b2).add_((1 - b2) * grad * grad)
    m_hat, v_hat = m / (1 - b1 ** t), v / (1 - b2 ** t)
    param.sub_(lr * (m_hat / (v_hat.sqrt() + eps) + weight_decay * param))


@dataclass
class History:
    """What the loop records, one entry per optimizer step."""

    step: list[int] = field(default_factory=list)  # optimizer step t
    loss: list[float] = field(default_factory=list)  # mean target-token loss of the step's batch
    lr: list[float] = field(default_factory=list)  # learning rate used at the step
    grad_norm: list[float] = field(default_factory=list)  # global gradient norm before clipping
    # input tokens per second (averaged per log window)
    tokens_per_s: list[float] = field(default_factory=list)
    # other series a stage records (PPO: per round)
    metrics: dict[str, list[float]] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> History:
        series = {f.name: list(d[f.name]) for f in dataclasses.fields(cls) if f.name != "metrics"}
        return cls(**series, metrics={k: list(v) for k, v in d.get("metrics", {}).items()})


def train(model: nn.Module, data: Callable[[int], Batch], cfg: TrainConfig, *,
          checkpoint_dir: str | os.PathLike | None = None, resume: bool = False,
          loss: Loss = NextTokenLoss(),
          prepare: Callable[[nn.Module, Batch, int], Batch] | None = None,
          autocast_dtype: torch.dtype | None = None, cuda_graph: bool | None = None,
          desc: str = "train") -> History:
    """Train ``model`` for ``cfg.steps`` optimizer steps; return the metrics history.

    Args:
        model: maps ``input_ids (B, T)`` (and the batch's model kwargs) to logits (B, T, V).
        data: ``data(i)`` is the whole batch of optimizer step ``i + 1``; it is split into
            ``cfg.accum_steps`` micro-batches whose summed losses are divided by the batch's
            count, so the gradient equals the big batch's.
        loss: ``loss(model, batch) -> (summed loss, count)``; next-token cross-entropy by default.
        checkpoint_dir: where to save checkpoints (every ``cfg.checkpoint_every`` steps and at the
        end). resume: continue from the latest checkpoint in ``checkpoint_dir`` if there is one.
        prepare: ``prepare(model, batch, step) -> batch`` run before the step (scheduled sampling).
        autocast_dtype: e.g. ``torch.bfloat16`` for autocast on the model's device; None for none.
        cuda_graph: capture the step as a CUDA graph
        (:class:`~halluc_lab.training.step.CapturedStep`); None: on CUDA
            in a single process.

    Under ``torchrun`` (:mod:`halluc_lab.training.distributed`) every rank draws the same global
    batch, runs ``prepare`` on it, and trains on its contiguous share of the rows in
    ``DistributedDataParallel``; the losses, the gradient and so the weights are the single
    process's (up to the order of float sums). Rank 0 writes the checkpoints; every rank resumes
    from them.
    """
    with deterministic():  # same seed, same device type: the same bits (ARCHITECTURE.md §3)
        return _train_loop(model, data, cfg, checkpoint_dir, resume, loss, prepare, autocast_dtype,
                           cuda_graph, desc)


def _train_loop(model, data, cfg, checkpoint_dir, resume, loss, prepare, autocast_dtype, cuda_graph,
                desc) -> History:
    """The body of :func:`train`."""
    device = next(model.parameters()).device
    ranks = distributed.world_size()
    graphed = device.type == "cuda" and ranks == 1 if cuda_graph is None else cuda_graph
    if graphed and device.type != "cuda":
        raise ValueError(f"cuda_graph=True needs the model on a CUDA device, not {device.type}")
    if graphed and ranks > 1:
        raise ValueError("cuda_graph=True is for one process: a distributed step runs eagerly "
                         "(DDP's all-reduce "
                         "overlaps the backward pass)")
    opt = make_optimizer(model, cfg, capturable=graphed)
    history, start = History(), 1
    if resume:
        if checkpoint_dir is None:
            raise ValueError("resume=True needs a checkpoint_dir")
        last = latest_checkpoint(checkpoint_dir)
        if last is not None:
            done, history = load_checkpoint(last, model, opt, cfg)
            start = done + 1
    was_training = model.training
    model.train()
    step_fn = (CapturedStep if graphed else EagerStep)(distributed.wrap(model), opt,
                                                       grad_clip=cfg.grad_clip,
                                                       accum_steps=cfg.accum_steps, loss=loss,
                                                       autocast_dtype=autocast_dtype)
    pending: list[tuple] = []
    clock = time.perf_counter()
    for step in progress(range(start, cfg.steps + 1), desc=desc, initial=start - 1,
                         total=cfg.steps):
        lr = lr_at(step, cfg)
        batch = data(step - 1).to(device)
        if prepare is not None:
            batch = prepare(model, batch, step)
        tokens = batch.input_ids.numel()  # the global batch's
        if ranks > 1:
            batch = _shard(batch, cfg.accum_steps)
        total, grad_norm, count = step_fn(batch, lr)
        pending.append((step, lr, total, grad_norm, count, tokens))
        save_now = checkpoint_dir is not None and (
            step == cfg.steps or (cfg.checkpoint_every and step % cfg.checkpoint_every == 0))
        if step % cfg.log_every == 0 or step == cfg.steps or save_now:
            clock = _flush(pending, history, clock)
        if save_now:
            if distributed.is_main():
                save_checkpoint(checkpoint_dir, step, model, opt, history, cfg)
            # every rank's next read (a resume, the cache) sees the whole checkpoint
            distributed.barrier()
    # a captured step's gradients live in its graph's memory: let them go
    opt.zero_grad(set_to_none=True)
    model.train(was_training)
    return history


def _shard(batch: Batch, accum_steps: int) -> Batch:
    """This rank's contiguous rows of a global batch, split into the same ``accum_steps``
    micro-batches."""
    n = batch.input_ids.shape[0]
    share = distributed.shard(n)
    if share.stop - share.start < accum_steps:
        raise ValueError(f"a batch of {n} rows over {distributed.world_size()} processes "
                         "leaves rank "
                         f"{distributed.rank()} {share.stop - share.start} rows, fewer than "
                         f"accum_steps={accum_steps}: "
                         "use fewer processes, a bigger batch or fewer micro-batches")
    return batch[share]


def _flush(pending: list, history: History, clock: float) -> float:
    """Move the pending step records to the history (one host sync); check the loss is finite and
    that every step had something to learn from."""
    if not pending:
        return clock
    values = torch.stack([torch.stack([p[2].float(), p[3].float(), p[4].float()])
                          for p in pending]).tolist()
    now = time.perf_counter()
    rate = sum(p[5] for p in pending) / max(now - clock, 1e-9)
    for (step, lr, *_), (loss, gn, count) in zip(pending, values):
        if count == 0:
            raise ValueError(f"the batch of step {step} has no target tokens (every label is "
                             "IGNORE, or the "
                             "loss counted nothing): check the data's labels")
        if not math.isfinite(loss):
            raise FloatingPointError(f"the loss is {loss} at step {step} (lr {lr:.3g}): "
                                     "lower the learning rate or check the data")
        history.step.append(step)
        history.loss.append(loss)
        history.lr.append(lr)
        history.grad_norm.append(gn)
        history.tokens_per_s.append(rate)
    pending.clear()
    return now


# -- checkpoints ---------------------------------------------------------------------------------
def file_sha256(path: str) -> str:
    """The SHA-256 of a file's bytes, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


WEIGHTS_FILE = "model.safetensors"


def model_fingerprint(model: nn.Module) -> str:
    """What must match for a checkpoint to belong to this model: its class, config and parameter
    shapes."""
    shapes = ",".join(f"{k}:{tuple(v.shape)}" for k, v in model.state_dict().items())
    return f"{type(model).__name__}|{getattr(model, 'config', None)!r}|{shapes}"


def save_checkpoint(checkpoint_dir: str | os.PathLike, step: int, model: nn.Module,
                    opt: torch.optim.Optimizer, history: History, cfg: TrainConfig) -> str:
    """Write ``step-NNNNNN/`` atomically (a temporary directory renamed at the end); keep the last
    few."""
    checkpoint_dir = os.fspath(checkpoint_dir)
    os.makedirs(checkpoint_dir, exist_ok=True)
    final = os.path.join(checkpoint_dir, f"step-{step:06d}")
    tmp = final + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    save_model(model, os.path.join(tmp, WEIGHTS_FILE))
    torch.save({"step": step, "optimizer": opt.state_dict(), "history": history.to_dict(),
                "config": dataclasses.asdict(cfg), "model": model_fingerprint(model),
                "sha256": {WEIGHTS_FILE: file_sha256(os.path.join(tmp, WEIGHTS_FILE))}},
               os.path.join(tmp, STATE_FILE))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    kept = sorted(d for d in os.listdir(checkpoint_dir) if d.startswith("step-")
                  and not d.endswith(".tmp"))
    for old in kept[:-cfg.keep_checkpoints]:
        shutil.rmtree(os.path.join(checkpoint_dir, old), ignore_errors=True)
    return final


def latest_checkpoint(checkpoint_dir: str | os.PathLike) -> str | None:
    """The newest complete ``step-NNNNNN`` directory, or None."""
    if not os.path.isdir(checkpoint_dir):
        return None
    done = sorted(d for d in os.listdir(checkpoint_dir) if d.startswith("step-")
                  and not d.endswith(".tmp"))
    return os.path.join(os.fspath(checkpoint_dir), done[-1]) if done else None


def load_checkpoint(path: str | os.PathLike, model: nn.Module, opt: torch.optim.Optimizer | None,
                    cfg: TrainConfig | None) -> tuple[int, History]:
    """Load weights (and optimizer state) into ``model`` (and ``opt``); return (step, history).

    Raises :class:`CheckpointError` if the state file is unreadable, a weight file's checksum
    differs, the checkpoint was written for another config or another model, or any
    parameter is missing, extra or of another shape. Nothing is loaded in that case.
    """
    path = os.fspath(path)
    try:
        state = torch.load(os.path.join(path, STATE_FILE), map_location="cpu", weights_only=True)
    except Exception as e:  # any unreadable state is the same problem for the caller
        raise CheckpointError(f"{path}: cannot read {STATE_FILE} ({type(e).__name__}: {e})") from e
    if cfg is not None and state["config"] != dataclasses.asdict(cfg):
        diff = {k: (v, state["config"].get(k)) for k, v in dataclasses.asdict(cfg).items()
                if state["config"].get(k) != v}
        raise CheckpointError(f"{path} was written for another TrainConfig; differing fields "
                              f"(now, checkpoint): {diff}")
    if sorted(state["sha256"]) != [WEIGHTS_FILE]:
        raise CheckpointError(f"{path}: the state records weight files {sorted(state['sha256'])}, "
                              f"not {WEIGHTS_FILE}")
    for f, digest in state["sha256"].items():
        if not os.path.exists(os.path.join(path, f)):
            raise CheckpointError(f"{path}/{f} is missing")
        if file_sha256(os.path.join(path, f)) != digest:
            raise CheckpointError(f"{path}/{f} is corrupted: its SHA-256 differs from the one "
                                  "recorded at save time")
    if state["model"] != model_fingerprint(model):
        raise CheckpointError(f"{path} holds a different model (class, config or parameter "
                              "shapes differ)")
    if opt is not None:
        saved = [len(g["params"]) for g in state["optimizer"]["param_groups"]]
        if saved != [len(g["params"]) for g in opt.param_groups]:
            raise CheckpointError(f"{path}: optimizer state has parameter groups of sizes {saved}, "
                                  f"this optimizer {[len(g['params']) for g in opt.param_groups]}")
    try:
        missing, unexpected = load_model(model, os.path.join(path, WEIGHTS_FILE), strict=True,
                                         device=str(next(model.parameters()).device))
        if missing or unexpected:
            raise KeyError(sorted(set(missing) | set(unexpected)))
        if opt is not None:
            opt.load_state_dict(state["optimizer"])
    except Exception as e:
        raise CheckpointError(f"{path}: cannot load into this model "
                              f"({type(e).__name__}: {e})") from e
    return int(state["step"]), History.from_dict(state["history"])
