"""Shared pieces of the benchmark scripts: model sizes, the command line, timing, tables, JSON.

Every benchmark builds the same weights for the lab and its peer, times both in one run, and
prints the lab's figure, the peer's figure and their ratio (ARCHITECTURE.md §5). Timings are never
asserted in tests; they are recorded in book/results/engine.md with the device and the date.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch

from halluc_lab.model.config import ModelConfig

T = TypeVar("T")

# The two sizes of the brief: tiny (hidden 128, 4 layers, 4 heads, 2 KV heads, vocab 512) and small.
SIZES = {
    "tiny": dict(vocab_size=512, hidden_size=128, n_layers=4, n_heads=4, n_kv_heads=2),
    "small": dict(vocab_size=512, hidden_size=512, n_layers=8, n_heads=8, n_kv_heads=4),
}


def model_config(size: str) -> ModelConfig:
    """The lab's config for a named size (untied head, SwiGLU width 4·d, room for 1024 positions)."""
    return ModelConfig(**SIZES[size], max_positions=1024, tie_embeddings=False)


def parser(description: str, batches: str) -> argparse.ArgumentParser:
    """The options every benchmark takes."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu or cuda")
    p.add_argument("--sizes", default="tiny,small", help="comma-separated: tiny, small")
    p.add_argument("--batches", default=batches, help="comma-separated batch sizes")
    p.add_argument("--quick", action="store_true", help="fewer tokens/steps: a smoke check of the script")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    p.add_argument("--json", default="", help="also write the results to this JSON file")
    return p


def setup(args: argparse.Namespace) -> tuple[torch.device, torch.dtype]:
    """Device and dtype from the options: bf16 on CUDA, fp32 on CPU (as the brief asks)."""
    if args.threads:
        torch.set_num_threads(args.threads)
    name = args.device
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    return device, (torch.bfloat16 if device.type == "cuda" else torch.float32)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_time(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """The fastest of ``repeats`` timed calls of ``fn`` (seconds), the device synchronised around each."""
    best = float("inf")
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best


def attempt(fn: Callable[[], T], name: str = "") -> T | str:
    """Run a measurement; a peer that fails (an API missing on this version) gives its error instead.
    With a ``name``, the failure's traceback also goes to stderr under it."""
    try:
        return fn()
    except Exception as error:  # noqa: BLE001 - a failing peer must not stop the other measurements
        if name:
            print(f"\n{name} failed:", file=sys.stderr)
            traceback.print_exc()
        first = str(error).splitlines()[0][:80] if str(error) else ""
        return f"failed: {type(error).__name__}: {first}"


def ratio(a: float | str, b: float | str) -> float | str:
    return a / b if isinstance(a, float) and isinstance(b, float) and b > 0 else "n/a"


def fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.2f}" if value < 100 else f"{value:,.0f}"
    return str(value)


def print_table(title: str, rows: list[dict], columns: list[str]) -> None:
    """A compact fixed-width table."""
    cells = [[fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    print(f"\n{title}")
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths)))
    for row in cells:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths)))


def environment(device: torch.device) -> dict:
    """What the figures were measured on."""
    import transformers

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    return {"device": name, "torch": torch.__version__, "transformers": transformers.__version__,
            "date": datetime.date.today().isoformat()}


def write_json(path: str, payload: dict) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(payload, indent=2))
        print(f"\nwrote {path}")
