"""Training-step throughput: the lab's model against ``LlamaForCausalLM``, same weights, one run.

Both sides run the same loop: forward under bf16 autocast (CUDA; fp32 on CPU), next-token
cross-entropy on float32 logits, backward, AdamW (fused on CUDA), zero_grad. Tokens/s counts
batch × sequence length per step. Target (brief): the lab at least 1.3× the peer's tokens/s.

    python benchmarks/train_step.py --sizes tiny,small --batches 32 --seq 256 --json _build/bench/train.json
"""

from __future__ import annotations

import contextlib
import sys

import torch
import torch.nn.functional as F

from common import attempt, best_time, environment, model_config, parser, print_table, ratio, setup, write_json
from halluc_lab.hf_convert import to_hf
from halluc_lab.model import Transformer


def train_loop(forward, params, x, y, device, dtype, steps):
    """A closure running ``steps`` optimizer steps of next-token cross-entropy."""
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


def measure(size: str, B: int, T: int, device, dtype, steps: int, compile_: bool) -> dict:
    lab = Transformer(model_config(size), seed=0)
    hf = to_hf(lab).train().to(device)
    lab = lab.to(device)
    V = lab.config.vocab_size
    data = torch.randint(0, V, (B, T + 1), generator=torch.Generator().manual_seed(0)).to(device)
    x, y = data[:, :-1], data[:, 1:]
    lab_fwd = torch.compile(lab) if compile_ else lab
    hf_fwd = torch.compile(hf) if compile_ else hf
    row = {"size": size, "batch": B, "seq": T}
    for name, forward, params in (("lab", lab_fwd, lab.parameters()),
                                  ("hf", lambda ids: hf_fwd(input_ids=ids).logits, hf.parameters())):
        def timed(forward=forward, params=params):
            run = train_loop(forward, list(params), x, y, device, dtype, steps)
            run()  # warm-up: kernels, autotuning, optimizer state
            return B * T * steps / best_time(run, device, 2)
        row[f"{name} tok/s"] = attempt(timed)
    row["lab/hf"] = ratio(row["lab tok/s"], row["hf tok/s"])
    return row


def main(argv=None) -> dict:
    p = parser(__doc__.splitlines()[0], batches="32")
    p.add_argument("--seq", type=int, default=256, help="sequence length")
    p.add_argument("--steps", type=int, default=10, help="optimizer steps per timed run")
    p.add_argument("--compile", action="store_true", help="torch.compile both models (same treatment)")
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
                rows, ["size", "batch", "seq", "lab tok/s", "hf tok/s", "lab/hf"])
    lines = [f"{r['size']} batch {r['batch']}: lab/hf = "
             f"{r['lab/hf']:.2f} (target ≥ 1.3) {'met' if r['lab/hf'] >= 1.3 else 'NOT met'}"
             if isinstance(r["lab/hf"], float) else f"{r['size']}: {r['lab/hf']}" for r in rows]
    print("\n".join(lines))
    payload = {"benchmark": "train_step", **env, "compile": args.compile, "rows": rows, "targets": lines}
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main(sys.argv[1:])
