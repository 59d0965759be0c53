"""One optimizer step: accumulate the loss's gradient over micro-batches, clip it, update with AdamW
— run eagerly, or captured once as a CUDA graph and replayed.

Chapters 7–10 (every training run goes through :func:`halluc_lab.training.train.train`). Sources:
000 §5.7 (gradient accumulation), §5.8 (AdamW); 001 Part 1 Listing 2 (forward, ``zero_grad``,
``backward``, ``step``).

A loss is a callable ``loss(model, batch) -> (summed loss, count)`` (:data:`Loss`): the step sums
both over the micro-batches and divides the gradient once by the total count. So the gradient is
the big batch's mean whatever the micro-batches hold, and a reward model, DPO or a policy gradient
is another callable, never another loop.

Why a CUDA graph. The lab's models are small: a training step is hundreds of small kernels, and on
a GPU the host's time to launch them is most of the step. :class:`CapturedStep` records the whole
step (forward, backward, clipping, the fused AdamW update) once and replays it with one call, as
the engine does for a decode step. It needs batches of one shape (packed rows are), a capturable
optimizer (the learning rate lives in a device tensor the loop fills each step), and a warm-up
before the capture, whose updates it undoes so the run is the one it would have been.

Departure from 000 §5.7: it writes accumulation as the mean of K micro-batch gradients, which equals
the big batch's gradient only when the micro-batches hold equally many target tokens; here the sums
are accumulated and divided once (tested).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from numbers import Real
from typing import Any

import torch
from torch import nn

from halluc_lab.training.data import Batch
from halluc_lab.training.distributed import all_sum, is_wrapped, world_size
from halluc_lab.training.losses import causal_lm_loss

Loss = Callable[[nn.Module, Batch], "tuple[torch.Tensor, torch.Tensor]"]
"""``loss(model, batch) -> (summed loss, count)``: 0-d tensors; the step divides the gradient by the
count."""


@dataclass(frozen=True)
class NextTokenLoss:
    """Next-token cross-entropy summed over the batch's target tokens (000 §5.2–5.4, 001 eq. 9).

    The loss of pre-training (every token a target) and of SFT (completion-only labels): which
    tokens count is decided by the batch's labels, not here.
    """

    label_smoothing: float = 0.0  # ε of 004 §3.7

    def __post_init__(self):
        smoothing = self.label_smoothing  # a Real: numpy numbers too, a bool not
        if isinstance(smoothing, bool) or not (isinstance(smoothing, Real) and 0 <= smoothing < 1):
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing!r}")

    def __call__(self, model: nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        logits = model(batch.input_ids, **batch.model_kwargs())  # (B, T, V)
        summed = causal_lm_loss(logits, batch.labels, label_smoothing=self.label_smoothing,
                                reduction="sum")
        return summed, batch.n_targets


def autocast(device: torch.device, dtype: torch.dtype | None):
    """Autocast to ``dtype`` on ``device`` (None or float32: none). Its weight-cast cache is off: a
    cached cast made while capturing a graph would be replayed stale."""
    if dtype is None or dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype, cache_enabled=False)


def _sync_gradients(model: nn.Module, last: bool):
    """The seam for data parallelism: a model wrapped for it (``no_sync``, as
    DistributedDataParallel has) all-reduces its gradients only on the last micro-batch of a
    step."""
    no_sync = getattr(model, "no_sync", None)
    return contextlib.nullcontext() if last or no_sync is None else no_sync()


def accumulate_gradients(model: nn.Module, batch: Batch, accum_steps: int, *,
                         loss: Loss = NextTokenLoss(), autocast_dtype: torch.dtype | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Backpropagate the batch's mean loss in ``accum_steps`` micro-batches; return (mean loss,
    count).

    Each micro-batch's *summed* loss is backpropagated and the accumulated gradient divided once by
    the whole batch's count (see the module docstring). Both results are 0-d tensors: no host sync.
    A model in ``DistributedDataParallel`` holds this rank's share of the global batch: the loss and
    the count are summed over the ranks, so the gradient and both results are the global batch's.
    """
    n_rows = batch.input_ids.shape[0]
    if not isinstance(accum_steps, int) or not 1 <= accum_steps <= n_rows:
        raise ValueError(f"accum_steps must be an int in [1, {n_rows}] (the batch's rows), got "
                         f"{accum_steps!r}")
    device = batch.input_ids.device
    total, count = torch.zeros((), device=device), torch.zeros((), device=device)
    sizes = [n_rows // accum_steps + (i < n_rows % accum_steps) for i in range(accum_steps)]
    start = 0
    for i, size in enumerate(sizes):
        with _sync_gradients(model, last=i == accum_steps - 1):
            with autocast(device, autocast_dtype):
                summed, n = loss(model, batch[start:start + size])  # a view: no copy of the rows
            summed.backward()
        total += summed.detach()
        count += n
        start += size
    ranks = world_size() if is_wrapped(model) else 1
    if ranks > 1:  # the loss and count over all ranks' rows
        total, count = all_sum(torch.stack([total, count])).unbind()
    scale = 1.0 / count.clamp_min(1)  # a step without targets is reported by the loop
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if grads:  # DDP averaged the ranks' summed gradients: × ranks makes them the sum over all rows
        torch._foreach_mul_(grads, scale if ranks == 1 else scale * ranks)
    return total * scale, count


def make_optimizer(model: nn.Module, cfg, *, capturable: bool = False) -> torch.optim.AdamW:
    """AdamW (000 §5.8) with weight decay on matrices and none on vectors (norm gains, biases).

    ``cfg`` holds ``lr``, ``betas``, ``eps`` and ``weight_decay`` (a
    :class:`~halluc_lab.training.train.TrainConfig`). ``capturable``: for a :class:`CapturedStep`;
    the learning rate is then a device tensor.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    # On a GPU the fused kernel updates every parameter in one launch; elsewhere PyTorch's default.
    fused = True if params and all(p.is_cuda for p in params) else None
    lr = torch.tensor(float(cfg.lr), device=params[0].device) if capturable else cfg.lr
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, betas=cfg.betas,
                             eps=cfg.eps, fused=fused, capturable=capturable)


def capture_graph(body: Callable[[], Any], optimizers: Sequence[torch.optim.Optimizer] = (), *,
                  warmup: int = 2) -> tuple[torch.cuda.CUDAGraph, Any]:
    """``(graph, outputs)``: ``body()`` captured as a CUDA graph, to be replayed on inputs copied
    into the tensors it reads. Gradients are set to None first, so the captured backward writes
    fresh ones.

    ``warmup`` runs on a side stream come first (cuBLAS workspaces, lazy caches and the optimizers'
    state must exist before a capture); what they did to the parameters and state of ``optimizers``
    (capturable ones, their learning rates device tensors) is undone in place — the graph records
    those addresses — so the first replay is the first real update. ``body`` must not synchronise
    with the host.
    """
    own = [(opt, [p for g in opt.param_groups for p in g["params"]]) for opt in optimizers]
    params = [p for _, ps in own for p in ps]
    saved = [p.detach().clone() for p in params]
    state = {p: {k: v.clone() for k, v in opt.state[p].items()} for opt, ps in own for p in ps
             if opt.state[p]}
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            for opt in optimizers:
                opt.zero_grad(set_to_none=True)
            body()
    torch.cuda.current_stream().wait_stream(side)
    with torch.no_grad():
        for p, before in zip(params, saved):
            p.copy_(before)
        for opt, ps in own:
            for p in ps:
                for k, v in opt.state[p].items():
                    v.copy_(state[p][k]) if p in state else v.zero_()
    for opt in optimizers:
        opt.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = body()
    return graph, out


class Graphs:
    """Computations captured as CUDA graphs by name at their first call and replayed after
    (``enabled``), or run eagerly each time. A body reads and writes tensors that keep their
    addresses (copy new inputs into them); its graph's outputs are the tensors it wrote at capture,
    overwritten by every replay."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self._graphs: dict[str, tuple[torch.cuda.CUDAGraph, Any]] = {}

    def run(self, name: str, body: Callable[[], Any],
            optimizers: Sequence[torch.optim.Optimizer] = ()) -> Any:
        """``body()`` eagerly, or its graph (captured on the first call, undoing the warm-up's steps
        of ``optimizers``, :func:`capture_graph`) replayed; its outputs."""
        if not self.enabled:
            return body()
        if name not in self._graphs:
            self._graphs[name] = capture_graph(body, optimizers)
        graph, out = self._graphs[name]
        graph.replay()
        return out


class EagerStep:
    """One optimizer step run op by op: the readable reference :class:`CapturedStep` replays."""

    def __init__(self, model: nn.Module, opt: torch.optim.Optimizer, *, grad_clip: float | None,
                 accum_steps: int, loss: Loss, autocast_dtype: torch.dtype | None):
        self.model, self.opt, self.loss = model, opt, loss
        self.params = [p for g in opt.param_groups for p in g["params"]]
        self.grad_clip = grad_clip or math.inf
        self.accum_steps, self.autocast_dtype = accum_steps, autocast_dtype

    def body(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Gradients, clipping, update; returns (mean loss, gradient norm before clipping,
        count)."""
        total, count = accumulate_gradients(self.model, batch, self.accum_steps, loss=self.loss,
                                            autocast_dtype=self.autocast_dtype)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip)
        self.opt.step()
        return total, grad_norm, count

    def __call__(self, batch: Batch, lr: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        for g in self.opt.param_groups:
            g["lr"] = lr
        out = self.body(batch)
        self.opt.zero_grad(set_to_none=True)
        return out


class CapturedStep(EagerStep):
    """The same step captured as a CUDA graph on the first batch and replayed on every later one."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.graph: torch.cuda.CUDAGraph | None = None
        device = self.params[0].device
        # a resumed optimizer reads its rate back as a float or a CPU tensor
        for g in self.opt.param_groups:
            if not (isinstance(g["lr"], torch.Tensor) and g["lr"].device == device):
                g["lr"] = torch.tensor(float(g["lr"]), device=device)

    def _capture(self, batch: Batch) -> None:
        fields = (batch.input_ids, batch.labels, batch.position_ids, batch.segment_ids)
        self.static = Batch(*(None if t is None else t.clone() for t in fields))
        self.graph, self.out = capture_graph(lambda: self.body(self.static), [self.opt])

    def __call__(self, batch: Batch, lr: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        for g in self.opt.param_groups:
            g["lr"].fill_(lr)
        if self.graph is None:
            self._capture(batch)
        fields = (batch.input_ids, batch.labels, batch.position_ids, batch.segment_ids)
        static = (self.static.input_ids, self.static.labels, self.static.position_ids,
                  self.static.segment_ids)
        for new, old in zip(fields, static):
            if (new is None) != (old is None) or (new is not None and new.shape != old.shape):
                raise ValueError("a captured training step needs every batch in the shape of the "
                                 f"first ({tuple(old.shape) if old is not None else None}, got "
                                 f"{tuple(new.shape) if new is not None else None}); train with "
                                 "cuda_graph=False")
            if new is not None:
                old.copy_(new, non_blocking=True)
        self.graph.replay()
        return tuple(t.clone() for t in self.out)
