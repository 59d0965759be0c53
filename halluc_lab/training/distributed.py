"""Data parallelism over processes that ``torchrun`` starts: who am I, start and stop, shard,
reduce.

Beyond one GPU (README "Running on several GPUs"). PyTorch's own engine does the work:
``torch.distributed`` for the process group and its collectives, ``DistributedDataParallel`` (DDP)
for the gradients. This module is the thin layer the training loops use::

    torchrun --nproc_per_node=2 scripts/train.py arithmetic-sft     # N processes, one per GPU

``torchrun`` starts the processes and sets ``RANK`` (this process among all), ``LOCAL_RANK`` (among
those of its machine: the GPU it uses) and ``WORLD_SIZE`` (how many) in each one's environment;
:func:`start` reads them and joins the process group — NCCL between GPUs, gloo between CPU processes
(the tests run two of those). Without ``torchrun`` nothing here does anything: one process is a
world of one, so a plain ``python`` run is exactly the single-process run.

The rule every loop keeps: **the global batch is the single-process one.** Each optimizer step's
batch is drawn the same way on every rank (the data are a function of the step), each rank takes its
:func:`shard` of the rows, and a gradient is a sum over all ranks' rows divided by the count over
all ranks (:mod:`halluc_lab.training.step`). So N processes compute the single process's step, up to
the order of floating-point sums (tested against a one-process run).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE")  # what torchrun sets in each process it starts


@dataclass(frozen=True)
class Topology:
    """Where this process sits among those of one run."""

    rank: int = 0  # among all processes, 0 .. world_size − 1
    local_rank: int = 0  # among the processes of this machine: the index of its GPU
    world_size: int = 1  # how many processes

    def __post_init__(self):
        for name in ("rank", "local_rank", "world_size"):
            v = getattr(self, name)
            if (isinstance(v, bool) or not isinstance(v, int)
                    or v < (1 if name == "world_size" else 0)):
                raise ValueError(f"{name} must be an int >= "
                                 f"{1 if name == 'world_size' else 0}, got {v!r}")
        if self.rank >= self.world_size:
            raise ValueError(f"rank {self.rank} must be below world_size {self.world_size}")

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that prints, shows progress and writes files."""
        return self.rank == 0


def topology(environ=None) -> Topology:
    """This process's :class:`Topology` from the variables ``torchrun`` sets (a world of one if
    unset).

    >>> topology({"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"})
    Topology(rank=1, local_rank=1, world_size=2)
    >>> topology({})
    Topology(rank=0, local_rank=0, world_size=1)
    """
    environ = os.environ if environ is None else environ
    found = {k: environ[k] for k in ENV if k in environ}
    if not found:
        return Topology()
    if len(found) != len(ENV) or not all(v.isdigit() for v in found.values()):
        raise ValueError(f"a distributed run needs all of {ENV} set to integers (torchrun sets "
                         f"them), got {found}")
    return Topology(int(found["RANK"]), int(found["LOCAL_RANK"]), int(found["WORLD_SIZE"]))


def active() -> bool:
    """True inside a started process group of more than one process."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    """This process's rank (0 outside a process group)."""
    return dist.get_rank() if active() else 0


def world_size() -> int:
    """How many processes train together (1 outside a process group)."""
    return dist.get_world_size() if active() else 1


def is_main() -> bool:
    """True on rank 0, and in a plain single-process run."""
    return rank() == 0


def start(backend: str | None = None) -> torch.device:
    """Join the process group ``torchrun`` describes (nothing for a world of one); this rank's
    device.

    On a machine with CUDA each process takes the GPU of its local rank (and NCCL); elsewhere the
    CPU (and gloo). ``backend`` overrides the choice. Call :func:`stop` at the end.
    """
    topo = topology()
    cuda = torch.cuda.is_available()
    if cuda and topo.local_rank >= torch.cuda.device_count():
        raise ValueError(f"local rank {topo.local_rank} has no GPU: this machine has "
                         f"{torch.cuda.device_count()}; "
                         "start at most that many processes per node")
    device = torch.device("cuda", topo.local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)  # "cuda" without an index now means this rank's GPU
    if topo.world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend or ("nccl" if cuda else "gloo"), rank=topo.rank,
                                world_size=topo.world_size, device_id=device if cuda else None)
    return device


def stop() -> None:
    """Leave the process group (after a last barrier, so no rank exits while another still
    reads)."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def barrier() -> None:
    """Wait until every rank gets here (nothing in a single process)."""
    if active():
        dist.barrier()


def print0(*args, **kwargs) -> None:
    """``print`` on rank 0 only."""
    if is_main():
        print(*args, **kwargs)


def all_sum(x: torch.Tensor) -> torch.Tensor:
    """The sum of ``x`` over all ranks (a new tensor; ``x`` itself in a single process)."""
    if not active():
        return x
    out = x.clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def mean_over_ranks(value: float) -> float:
    """A metric averaged over the ranks (each rank's value weighs the same)."""
    if not active():
        return float(value)
    device = torch.device("cuda") if dist.get_backend() == "nccl" else torch.device("cpu")
    return float(all_sum(torch.tensor(float(value), dtype=torch.float64,
                                      device=device))) / world_size()


def gather_objects(obj) -> list:
    """Every rank's ``obj`` (picklable), in rank order, on every rank (``[obj]`` in a single
    process)."""
    if not active():
        return [obj]
    out = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj, src: int = 0):
    """Rank ``src``'s ``obj`` on every rank (``obj`` itself in a single process)."""
    if not active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def shard(n: int, *, at: int | None = None, of: int | None = None) -> slice:
    """This rank's contiguous share of ``n`` items: ``n // of`` each, the first ``n % of`` ranks one
    more.

    ``at``/``of``: a rank and world size other than this process's. Rank order is item order, so the
    shares laid end to end are the items in order (what :func:`gather_objects` gives back).

    >>> [shard(10, at=r, of=3) for r in range(3)]
    [slice(0, 4, None), slice(4, 7, None), slice(7, 10, None)]
    """
    at = rank() if at is None else at
    of = world_size() if of is None else of
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be an int >= 0, got {n!r}")
    Topology(at, at, of)  # checks the pair
    size, extra = divmod(n, of)
    begin = at * size + min(at, extra)
    return slice(begin, begin + size + (at < extra))


def wrap(model: nn.Module) -> nn.Module:
    """``model`` in ``DistributedDataParallel`` when several processes train (itself otherwise).

    DDP copies rank 0's weights to every rank once, then all-reduces (averages) the gradients in
    buckets while the backward pass runs, and syncs only outside ``no_sync()`` — the accumulation
    seam of :mod:`halluc_lab.training.step`.
    """
    if not active() or isinstance(model, DistributedDataParallel):
        return model
    device = next(model.parameters()).device
    return DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)


def is_wrapped(model: nn.Module) -> bool:
    """True for a model inside ``DistributedDataParallel``."""
    return isinstance(model, DistributedDataParallel)
