"""Training-step throughput: the lab's model against ``LlamaForCausalLM``, same weights, one run.

Every variant runs optimizer steps of next-token cross-entropy on one fixed batch: forward under
bf16 autocast (CUDA; fp32 on CPU), cross-entropy on float32 logits, backward, AdamW (fused on
CUDA). Tokens/s counts batch × sequence length per step.

- *lab* and *hf*: the same plain loop (forward, loss, backward, step, zero_grad), kernel by kernel.
- *det*: the same with deterministic kernels (``halluc_lab.device.deterministic``), as every
  training run of the book now uses (ARCHITECTURE.md §3).
- *lab graph det*: the lab's own training step as :func:`halluc_lab.training.train.train` runs it on a GPU —
  :class:`halluc_lab.training.step.CapturedStep` (accumulation, gradient clipping, capturable fused AdamW,
  replayed as one CUDA graph), deterministic kernels on.

Targets: the lab's plain loop ≥ 1.3× *hf*; with determinism on, the lab's step as it trains
(*lab graph det*) ≥ 2× *hf det*.

    python benchmarks/train_step.py --sizes tiny,small --batches 32 --seq 256 --json _build/bench/train.json
"""

from __future__ import annotations

import contextlib
import sys

import torch
import torch.nn.functional as F

from common import attempt, best_time, environment, model_config, parser, print_table, ratio, setup, write_json
from halluc_lab.training.data import Batch
from halluc_lab.device import deterministic
from halluc_lab.model.hf_convert import to_hf
from halluc_lab.model.transformer import Transformer
from halluc_lab.training.step import CapturedStep, NextTokenLoss, make_optimizer
from halluc_lab.training.train import TrainConfig


def plain_loop(forward, params, x, y, device, dtype, steps):
    """A closure running ``steps`` optimizer steps of next-token cross-entropy, op by op."""
    fused = {"fused": True} if device.type == "cuda" else {}
    opt = torch.optim.AdamW(params, lr=1e-4, **fused)
    autocast = (torch.autocast(device.type, dtype=dtype) if dtype != torch.float32
                else contextlib.nullcontext())

    def run():
        for _ in range(steps):
            with autocast:
                logits = forward(x)  # (B, T, V)
            loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    return run


def captured_loop(model, data, dtype, steps):
    """A closure running ``steps`` replays of the lab's captured training step."""
    opt = make_optimizer(model, TrainConfig(lr=1e-4, weight_decay=0.0), capturable=True)
    step = CapturedStep(model, opt, grad_clip=1.0, accum_steps=1, loss=NextTokenLoss(), autocast_dtype=dtype)
    batch = Batch(data, torch.cat([torch.full_like(data[:, :1], -100), data[:, 1:]], 1))

    def run():
        for _ in range(steps):
            step(batch, 1e-4)
    return run


def measure(size: str, B: int, T: int, device, dtype, steps: int, compile_: bool) -> dict:
    lab = Transformer(model_config(size), seed=0)
    hf = to_hf(lab).train().to(device)
    lab = lab.to(device).train()
    V = lab.config.vocab_size
    data = torch.randint(0, V, (B, T + 1), generator=torch.Generator().manual_seed(0)).to(device)
    x, y = data[:, :-1], data[:, 1:]
    lab_fwd = torch.compile(lab) if compile_ else lab
    hf_fwd = torch.compile(hf) if compile_ else hf
    row = {"size": size, "batch": B, "seq": T}

    def timed(make):
        run = make()
        run()  # warm-up: kernels, capture, optimizer state
        return B * T * steps / best_time(run, device, 2)

    variants = {"lab": lambda: plain_loop(lab_fwd, list(lab.parameters()), x, y, device, dtype, steps),
                "hf": lambda: plain_loop(lambda ids: hf_fwd(input_ids=ids).logits, list(hf.parameters()), x, y,
                                         device, dtype, steps)}
    for name, make in variants.items():
        with deterministic(False):
            row[f"{name} tok/s"] = attempt(lambda: timed(make))
        with deterministic(True):
            row[f"{name} det tok/s"] = attempt(lambda: timed(make))
    if device.type == "cuda":
        with deterministic(True):
            row["lab graph det tok/s"] = attempt(lambda: timed(lambda: captured_loop(lab, data, dtype, steps)))
    row["lab/hf"] = ratio(row["lab tok/s"], row["hf tok/s"])
    row["det cost"] = ratio(row["lab tok/s"], row["lab det tok/s"])
    row["graph det/hf det"] = ratio(row.get("lab graph det tok/s", "n/a"), row["hf det tok/s"])
    return row


def main(argv=None) -> dict:
    p = parser(__doc__.splitlines()[0], batches="32")
    p.add_argument("--seq", type=int, default=256, help="sequence length")
    p.add_argument("--steps", type=int, default=10, help="optimizer steps per timed run")
    p.add_argument("--compile", action="store_true", help="torch.compile both models in the plain loops")
    args = p.parse_args(argv)
    device, dtype = setup(args)
    steps, T = (2, min(args.seq, 64)) if args.quick else (args.steps, args.seq)
    rows = [measure(size, int(B), T, device, dtype, steps, args.compile)
            for size in args.sizes.split(",") for B in args.batches.split(",")]
    env = environment(device)
    precision = "fp32" if dtype == torch.float32 else f"{str(dtype).removeprefix('torch.')} autocast"
    print_table(f"training step, {precision}, AdamW{' (fused)' if device.type == 'cuda' else ''}"
                f"{', torch.compile' if args.compile else ''} — {env['device']}, torch {env['torch']}, "
                f"transformers {env['transformers']}, {env['date']}",
                rows, ["size", "batch", "seq", "lab tok/s", "hf tok/s", "lab/hf", "lab det tok/s", "hf det tok/s",
                       "det cost", "lab graph det tok/s", "graph det/hf det"])
    lines = []
    for r in rows:
        if isinstance(r["lab/hf"], float):
            lines.append(f"{r['size']} batch {r['batch']}: lab/hf = {r['lab/hf']:.2f} (target ≥ 1.3) "
                         f"{'met' if r['lab/hf'] >= 1.3 else 'NOT met'}")
        if isinstance(r["graph det/hf det"], float):
            lines.append(f"{r['size']} batch {r['batch']}: lab graph det / hf det = {r['graph det/hf det']:.2f} "
                         f"(target ≥ 2) {'met' if r['graph det/hf det'] >= 2 else 'NOT met'}")
    print("\n".join(lines))
    payload = {"benchmark": "train_step", **env, "compile": args.compile, "rows": rows, "targets": lines}
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main(sys.argv[1:])
