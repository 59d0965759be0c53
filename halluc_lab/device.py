"""Device, dtype, seeding, determinism and scales: chosen once per notebook (ARCHITECTURE.md §3).

Every chapter starts with a ``parameters`` cell holding ``scale``, ``seed`` and
``device``; its next cell calls :func:`setup`, which resolves them into a
:class:`Runtime` and prints what it chose and why::

    rt = setup(scale="auto", device="auto", seed=0)
    # device: cpu (no CUDA or MPS device found) · dtype float32 · scale smoke (auto on cpu) · seed 0
    steps = rt.pick(smoke=200, full=5_000)

Library code never names a device: it takes the device from its tensors or model.

Determinism. Same seed, same device type, same code: bit-identical losses, weights and
evaluation numbers, on the GPU too. :func:`deterministic` turns on PyTorch's deterministic
algorithms (which also makes ``torch.compile`` skip benchmark-driven kernel choices), turns off
cuDNN's benchmark mode, and cuBLAS gets a fixed workspace (``CUBLAS_WORKSPACE_CONFIG``, read
when its first handle is made, hence set when this module is imported). :func:`setup` turns it on
for a whole notebook and :func:`halluc_lab.training.train.train` for every training run. What it
costs in speed is measured in ``benchmarks/train_step.py`` and recorded on the results page.
"""

from __future__ import annotations

import contextlib
import os
import random
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

ENV_DEVICE = "HALLUC_DEVICE"  # overrides device="auto", e.g. HALLUC_DEVICE=cpu
ENV_THREADS = "HALLUC_THREADS"  # CPU threads for torch (default 1, see setup)
SCALES = ("auto", "smoke", "full")
DEVICES = ("auto", "cpu", "cuda", "mps")

# cuBLAS chooses how to split a GEMM's reduction by the workspace it has; a fixed workspace makes
# the split, and so the bits, the same every run (CUDA docs, "Results reproducibility"). Read once,
# when the first cuBLAS handle is created: it must be in the environment before any GPU matrix
# product.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


@dataclass(frozen=True)
class Runtime:
    """Where and how big a notebook runs."""

    device: torch.device  # where models and tensors live
    dtype: torch.dtype  # autocast dtype: bfloat16 on CUDA, float32 elsewhere
    scale: str  # "smoke" (CPU, about a minute) or "full" (one GPU, a few minutes)
    seed: int  # the seed every generator in the notebook derives from
    reason: str  # why this device was chosen, in words

    def pick(self, *, smoke, full):
        """The value for this scale: ``rt.pick(smoke=200, full=5000)``."""
        return full if self.scale == "full" else smoke

    def autocast(self):
        """bf16 autocast on CUDA; a no-op context elsewhere."""
        if self.device.type == "cuda" and self.dtype != torch.float32:
            return torch.autocast("cuda", dtype=self.dtype)
        return contextlib.nullcontext()

    def generator(self, offset: int = 0) -> torch.Generator:
        """A fresh generator on this device seeded with ``seed + offset``."""
        return torch.Generator(device=self.device).manual_seed(self.seed + offset)

    def describe(self) -> str:
        """One line: device, dtype, scale and seed."""
        name = self.device.type
        if self.device.type == "cuda":
            name += f" ({torch.cuda.get_device_name(self.device)})"
        return (f"device: {name} ({self.reason}) · dtype {str(self.dtype).removeprefix('torch.')}"
                f" · scale {self.scale} · seed {self.seed}")


def _check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


def choose_device(requested: str = "auto") -> tuple[torch.device, str]:
    """Pick a device: the request, else ``$HALLUC_DEVICE``, else cuda, then mps, then cpu.

    Returns the device and the reason it was chosen.
    """
    _check_choice("device", requested, DEVICES)
    if requested == "auto" and os.environ.get(ENV_DEVICE):
        requested = os.environ[ENV_DEVICE]
        _check_choice(f"${ENV_DEVICE}", requested, DEVICES[1:])
        reason = f"${ENV_DEVICE}={requested}"
    elif requested != "auto":
        reason = "asked for"
    else:
        if torch.cuda.is_available():
            return torch.device("cuda"), "CUDA available"
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps"), "Apple MPS available, no CUDA"
        return torch.device("cpu"), "no CUDA or MPS device found"
    if requested == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device 'cuda' was asked for ({reason}) but torch sees no CUDA device")
    if requested == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device 'mps' was asked for ({reason}) but MPS is not available")
    return torch.device(requested), reason


def resolve_scale(scale: str, device: torch.device) -> str:
    """``auto`` means ``full`` on CUDA and ``smoke`` elsewhere."""
    _check_choice("scale", scale, SCALES)
    if scale != "auto":
        return scale
    return "full" if device.type == "cuda" else "smoke"


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices) with one integer."""
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@contextlib.contextmanager
def deterministic(enabled: bool = True) -> Iterator[None]:
    """Run the body with deterministic kernels (or without them), restoring the previous setting
    after."""
    before = (torch.are_deterministic_algorithms_enabled(),
              torch.is_deterministic_algorithms_warn_only_enabled(), torch.backends.cudnn.benchmark,
              torch.backends.cudnn.deterministic)
    set_deterministic(enabled)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = before[2], before[3]


@contextlib.contextmanager
def distinct_indices() -> Iterator[None]:
    """Deterministic kernels off for the body: for a ``scatter_`` or ``index_put_`` whose indices
    never repeat.

    With deterministic algorithms on, PyTorch sorts the indices of every ``scatter_``,
    ``index_put_`` and ``index_copy_`` on CUDA, so that two writes to one element always land in the
    same order. Writes to distinct elements have no order to fix: the plain kernel gives the same
    bits, without the sort (a radix sort and about twenty kernels per call). The engine's writes are
    such: one slot per row, into the KV cache and into each row's record. The caller vouches for the
    indices; nothing here checks them.

    >>> with deterministic():
    ...     with distinct_indices():  # row 0 writes column 2, row 1 column 0
    ...         print(torch.are_deterministic_algorithms_enabled(),
    ...               torch.zeros(2, 3).scatter_(1, torch.tensor([[2], [0]]), 1.0).tolist())
    ...     print(torch.are_deterministic_algorithms_enabled())
    False [[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]
    True
    """
    # traced: compile_for_capture runs the whole call with the mode off already
    if torch.compiler.is_compiling():
        yield  # (and asking for the mode here would break the traced graph in two)
        return
    before = (torch.are_deterministic_algorithms_enabled(),
              torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(False)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


# compilations of one function before dynamo gives up on it (its default: 8)
FUSED_RECOMPILE_LIMIT = 64


def compile_for_capture(fn: Callable) -> Callable:
    """``fn`` compiled by ``torch.compile`` (fused Triton kernels), to be warmed up and then
    captured in a CUDA graph, as the engine's fused step is. The first calls compile; they must come
    before the capture.

    The compiler guards a compiled function on the object it is bound to, so every engine and
    sampling setting compiles once: the limit is raised so that it does not fall back to the
    uncompiled function after eight. Inductor's hint to use TF32 for float32 matmuls is silenced,
    not followed (it would change the numbers).

    The compiled calls run with deterministic algorithms off, as :func:`distinct_indices`' body
    does: with them on, Inductor hands every ``index_put_`` and ``scatter_`` back to ATen's sorting
    kernel. So ``fn``'s indexed writes must each go to distinct elements, and it must not accumulate
    into a tensor by index (``index_add_``, ``scatter_add_``). The engine's step is such a function:
    one slot per row in the KV cache and in each row's record.
    """
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, FUSED_RECOMPILE_LIMIT)
    compiled = torch.compile(fn, dynamic=False)

    def run(*args, **kwargs):
        with warnings.catch_warnings(), distinct_indices():
            warnings.filterwarnings("ignore", message="TensorFloat32 tensor cores")
            return compiled(*args, **kwargs)
    return run


def to_device(data, device: torch.device | str, dtype: torch.dtype | None = None) -> Tensor:
    """``data`` (a host tensor, or what ``torch.tensor`` takes) as a tensor on ``device``, queued
    without waiting for the device.

    A plain ``.to("cuda")`` or ``copy_`` from ordinary host memory makes the host wait until the
    device has run everything queued before the copy (PyTorch synchronises the stream after it), so
    a loop that uploads a few numbers between kernels leaves the device idle while the host catches
    up. Here the data goes through page-locked memory and the copy is queued like a kernel
    (``non_blocking``); the host moves on. A host tensor that is page-locked already is read when
    the copy runs: do not change it afterwards.
    """
    host = data if isinstance(data, Tensor) else torch.tensor(data, dtype=dtype)
    if dtype is not None:
        host = host.to(dtype)
    if torch.device(device).type != "cuda" or host.device.type != "cpu":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def host_copies(tensors: Sequence[Tensor]) -> Callable[[], list[Tensor]]:
    """Start copying ``tensors`` to the host; the function returned waits for these copies alone
    (the device work queued after them runs on) and returns the host tensors.

    So the host can read a result while the device already works on the next step::

        wait = host_copies([tokens, lengths])
        launch_next_kernels()
        tokens, lengths = wait()      # waits for the two copies, not for the kernels
    """
    tensors = list(tensors)
    if not any(t.is_cuda for t in tensors):
        return lambda: [t.cpu() for t in tensors]
    # into page-locked memory, in stream order
    copies = [t.to("cpu", non_blocking=True) for t in tensors]
    done = torch.cuda.Event()
    done.record()

    def wait() -> list[Tensor]:
        done.synchronize()
        return copies
    return wait


def set_deterministic(enabled: bool = True) -> None:
    """Deterministic kernels on (or off) for the rest of the process."""
    torch.use_deterministic_algorithms(enabled)
    torch.backends.cudnn.benchmark = not enabled
    torch.backends.cudnn.deterministic = enabled
    # Deterministic mode also fills every new uninitialised tensor with NaN, so that reading one
    # shows. The lab never reads memory it has not written, and the fill is a kernel per allocation.
    torch.utils.deterministic.fill_uninitialized_memory = False


def setup(scale: str = "auto", device: str = "auto", seed: int = 0,
          verbose: bool = True) -> Runtime:
    """Resolve a notebook's parameters into a :class:`Runtime`, seed everything, turn on
    deterministic kernels, print why.

    On a CPU it also sets torch to ``$HALLUC_THREADS`` threads (default 1).
    """
    dev, reason = choose_device(device)
    resolved = resolve_scale(scale, dev)
    seed_everything(seed)
    set_deterministic(True)
    if dev.type == "cpu":
        # The lab's tensors are small: one CPU thread is as fast as several, and on a busy machine
        # threads that wait for each other made small steps up to ten times slower (2-core VM).
        threads = os.environ.get(ENV_THREADS, "1")
        if not threads.isdigit() or int(threads) < 1:
            raise ValueError(f"${ENV_THREADS} must be a positive integer, got {threads!r}")
        torch.set_num_threads(int(threads))
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    rt = Runtime(device=dev, dtype=dtype, scale=resolved, seed=seed,
                 reason=reason + (" · auto scale" if scale == "auto" else ""))
    if verbose:
        print(rt.describe())
    return rt
