"""Decode throughput: the lab's engine against Hugging Face ``generate``, same weights, one run.

For each size and batch: a 32-token prompt per row and 256 new tokens (bf16 on CUDA, fp32 on CPU).

- lab: ``halluc_lab.generation.engine.generate`` greedy (a CUDA graph of the decode step on GPU);
- lab top-p+rb: the engine sampling with top-p 0.9 while a quarter of the rows roll back 1–3
  tokens every 16 steps (the backspace path); tokens/s counts every token emitted;
- hf: ``LlamaForCausalLM.generate`` greedy with its default (dynamic) cache;
- hf static: the same with ``cache_implementation="static"`` (CUDA only unless --static-on-cpu);
- step ms: one decode step of the lab's engine, eager and graph-replayed (CUDA only).

Targets (brief): batch 1 ≥ 50× hf; batch 64 ≥ 2.5× hf static; top-p+rb within 15% of lab
greedy; on CPU at least hf's speed at batches 1 and 8.

    python benchmarks/decode.py --sizes tiny --batches 1,64 --json _build/bench/decode.json
"""

from __future__ import annotations

import random
import sys

import torch

from common import attempt, best_time, environment, model_config, parser, print_table, ratio, setup, write_json
from halluc_lab.generation.engine import SamplingParams, engine_for, generate
from halluc_lab.generation.engine_core import Engine
from halluc_lab.model.hf_convert import to_hf
from halluc_lab.model.transformer import Transformer

PROMPT = 32


def lab_greedy(model, prompts, new):
    return lambda: generate(model, prompts, new, sampling=SamplingParams(greedy=True))


def lab_top_p_with_rollbacks(model, prompts, new, device, every=16, seed=0):
    """Top-p sampling for ``new`` steps; every ``every`` steps a quarter of the rows take back 1–3 tokens."""
    B = len(prompts)
    eng = engine_for(model, B, PROMPT + new + 64)
    params = SamplingParams(top_p=0.9)

    def run():
        rng = random.Random(seed)
        eng.start(prompts, new + 64, params, generator=torch.Generator(device).manual_seed(seed))
        held = [0] * B  # tokens each row holds, known on the host: no row stops (no stop tokens)
        for step in range(1, new + 1):
            eng.step()
            held = [h + 1 for h in held]
            if every and step % every == 0:
                rows = rng.sample(range(B), max(1, B // 4))
                counts = [rng.randint(1, min(3, held[r])) for r in rows]
                eng.rollback(rows, counts)
                for r, c in zip(rows, counts):
                    held[r] -= c
        eng.result()
    return run


def hf_generate(hf, x, new, static):
    extra = {"cache_implementation": "static"} if static else {}
    mask = torch.ones_like(x)

    def run():
        with torch.no_grad():
            hf.generate(x, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                        pad_token_id=0, **extra)
    return run


def step_ms(model, prompts, graph: bool, steps: int) -> float:
    """Milliseconds per decode step of an engine, eager or graph-replayed."""
    eng = Engine(model, len(prompts), PROMPT + steps + 8, cuda_graph=graph)
    eng.start(prompts, steps + 4, SamplingParams(greedy=True))
    eng.step()  # captures the graph, if any
    device = eng.device

    def run():
        for _ in range(steps):
            eng.step()
    return 1e3 * best_time(run, device, 1) / steps


def measure(size: str, B: int, device, dtype, new: int, static: bool) -> dict:
    model = Transformer(model_config(size), seed=0).eval()
    hf = to_hf(model).to(device, dtype)
    model = model.to(device, dtype)
    x = torch.randint(0, model.config.vocab_size, (B, PROMPT), generator=torch.Generator().manual_seed(B))
    prompts, xd = x.tolist(), x.to(device)
    tokens = B * new

    def throughput(fn, warm, repeats):
        warm()
        return tokens / best_time(fn, device, repeats)

    row = {"size": size, "batch": B}
    row["lab tok/s"] = attempt(lambda: throughput(lab_greedy(model, prompts, new),
                                                  lab_greedy(model, prompts, new), 3))
    sampled = lab_top_p_with_rollbacks(model, prompts, new, device)
    row["lab top-p+rb tok/s"] = attempt(lambda: throughput(sampled, sampled, 3))
    row["hf tok/s"] = attempt(lambda: throughput(hf_generate(hf, xd, new, False), hf_generate(hf, xd, 8, False), 1))
    row["hf static tok/s"] = (attempt(lambda: throughput(hf_generate(hf, xd, new, True),
                                                         hf_generate(hf, xd, new, True), 1))
                              if static else "skipped")
    if device.type == "cuda":
        row["eager step ms"] = attempt(lambda: step_ms(model, prompts, False, 16))
        row["graph step ms"] = attempt(lambda: step_ms(model, prompts, True, 64))
    row["lab/hf"] = ratio(row["lab tok/s"], row["hf tok/s"])
    row["lab/hf static"] = ratio(row["lab tok/s"], row["hf static tok/s"])
    row["top-p+rb/lab"] = ratio(row["lab top-p+rb tok/s"], row["lab tok/s"])
    return row


def targets(rows: list[dict], device) -> list[str]:
    """The brief's targets, each with its measured value and whether it is met."""
    out = []
    for r in rows:
        checks = [("top-p+rb/lab", 0.85)]
        if device.type == "cuda":
            checks += [("lab/hf", 50.0)] if r["batch"] == 1 else []
            checks += [("lab/hf static", 2.5)] if r["batch"] == 64 else []
        elif r["batch"] in (1, 8):
            checks += [("lab/hf", 1.0)]
        for key, bar in checks:
            value = r[key]
            ok = isinstance(value, float) and value >= bar
            shown = f"{value:.2f}" if isinstance(value, float) else value
            out.append(f"{r['size']} batch {r['batch']}: {key} = {shown} (target ≥ {bar}) {'met' if ok else 'NOT met'}")
    return out


def main(argv=None) -> dict:
    p = parser(__doc__.splitlines()[0], batches="1,64")
    p.add_argument("--static-on-cpu", action="store_true", help="also time HF's static cache on the CPU")
    p.add_argument("--no-static", action="store_true", help="skip HF's static cache (its compile takes a while)")
    args = p.parse_args(argv)
    device, dtype = setup(args)
    new = 32 if args.quick else 256
    static = not args.no_static and (device.type == "cuda" or args.static_on_cpu)
    rows = [measure(size, int(B), device, dtype, new, static)
            for size in args.sizes.split(",") for B in args.batches.split(",")]
    env = environment(device)
    columns = ["size", "batch", "lab tok/s", "lab top-p+rb tok/s", "hf tok/s", "hf static tok/s",
               "lab/hf", "lab/hf static", "top-p+rb/lab"]
    columns += ["eager step ms", "graph step ms"] if device.type == "cuda" else []
    print_table(f"decode, prompt {PROMPT}, {new} new tokens, {str(dtype).removeprefix('torch.')} — {env['device']}, "
                f"torch {env['torch']}, transformers {env['transformers']}, {env['date']}", rows, columns)
    lines = targets(rows, device)
    print("\n".join(lines))
    payload = {"benchmark": "decode", **env, "prompt": PROMPT, "new_tokens": new, "rows": rows, "targets": lines}
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main(sys.argv[1:])
