"""One decode step of chapter 10's model: greedy, sampled, and with the backspace controller, graph-replayed.

The model has the shape of the ``kb_walk`` recipes at full scale (4 layers × 256, 8 query and 4 KV heads;
random weights: the timing does not depend on training), bf16 autocast, deterministic algorithms on (as the
book runs). For each number of positions per row (the engine's cache) and batch, the same prompts (kb_walk
prompts of 10–11 tokens, repeated to fill the batch) are started with:

- *greedy*: :class:`halluc_lab.generation.engine_core.Engine`, argmax;
- *sampled*: the same engine, τ = 1;
- *keep* and *erase*: :class:`halluc_lab.generation.backtrack.BacktrackEngine` at τ = 1, a sampled ``<bksp>`` taking back
  the row's last token inside the step, with the token left in the context or the KV cache rolled back.

A row's time per step is the mean over all steps of a batch after three untimed ones (the first captures the
graph); *erase / greedy* is the ratio of tokens per second (each step emits one token a row). Also printed:
kernels per step, counted by the profiler. The issue's target: erase at ≥ 0.9× greedy tokens/s at batch ≥ 64.

Needs a CUDA GPU. ``python benchmarks/controller_step.py [--json out.json]``
"""

from __future__ import annotations

import argparse
import sys

import torch
from common import environment, write_json

from halluc_lab import recipes
from halluc_lab.generation.backtrack import BacktrackEngine
from halluc_lab.device import deterministic
from halluc_lab.generation.engine_core import Engine
from halluc_lab.generation.sampling import SamplingParams
from halluc_lab.model.transformer import Transformer
from halluc_lab.stages.preference import preference_examples
from halluc_lab.tasks import make_task

POSITIONS, BATCHES = (64, 192), (64, 512)
KINDS = ("greedy", "sampled", "keep", "erase")


def engine(kind: str, model: Transformer, batch: int, positions: int, bksp_id: int) -> tuple[Engine, SamplingParams]:
    """An engine of one kind and the sampling it steps with."""
    if kind in ("greedy", "sampled"):
        return Engine(model, batch, positions, dtype=torch.bfloat16), SamplingParams(greedy=kind == "greedy")
    return (BacktrackEngine(model, batch, positions, bksp_id=bksp_id, context=kind, dtype=torch.bfloat16),
            SamplingParams())


def step_ms(eng: Engine, params: SamplingParams, prompts: list[list[int]], steps: int) -> float:
    """Mean milliseconds of one replayed step over ``steps`` steps, after three untimed ones."""
    eng.start(prompts, steps + 3, params, generator=torch.Generator(eng.device).manual_seed(0))
    for _ in range(3):
        eng.step()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        eng.step()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / steps


def kernels_per_step(eng: Engine, params: SamplingParams, prompts: list[list[int]]) -> float:
    """CUDA kernels (and copies) one replayed step launches, as the profiler counts them over four steps."""
    eng.start(prompts, 8, params, generator=torch.Generator(eng.device).manual_seed(0))
    eng.step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(4):
            eng.step()
        torch.cuda.synchronize()
    return sum(e.device_type == torch.autograd.DeviceType.CUDA for e in prof.events()) / 4


def main(argv: list[str]) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default="", help="also write the results to this JSON file")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("controller_step.py needs a CUDA GPU")
    device = torch.device("cuda")
    recipe = recipes.get("kb_walk-sft-clean", "full")
    task = make_task(recipe.task)
    tok = task.tokenizer()
    prompts = [[tok.bos_id, *tok.encode(e.prompt)] for e in preference_examples(task, 64, seed=0)]
    env = environment(device)
    print(f"{env['device']}, torch {env['torch']}, {env['date']}: ms per replayed step (kernels per step)")
    print("| positions | batch | " + " | ".join(KINDS) + " | erase / greedy tokens/s |")
    print("|---|---|" + "---|" * (len(KINDS) + 1))
    rows = []
    with deterministic(), torch.no_grad():
        model = Transformer(recipe.model, seed=0).to(device)
        for positions in POSITIONS:
            for batch in BATCHES:
                rows_prompts = [prompts[i % len(prompts)] for i in range(batch)]
                row = {"positions": positions, "batch": batch}
                for kind in KINDS:
                    eng, params = engine(kind, model, batch, positions, tok.bksp_id)
                    row[kind] = step_ms(eng, params, rows_prompts, positions - 16)
                    row[kind + " kernels"] = kernels_per_step(eng, params, rows_prompts)
                    del eng
                row["erase / greedy"] = row["greedy"] / row["erase"]
                rows.append(row)
                cells = " | ".join(f"{row[k]:.3f} ms ({row[k + ' kernels']:.0f})" for k in KINDS)
                print(f"| {positions} | {batch} | {cells} | {row['erase / greedy']:.3f} |", flush=True)
    payload = {"benchmark": "controller_step", **env, "model": str(recipe.model), "rows": rows}
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main(sys.argv[1:])
