"""Size chapter 10's fair test before it runs: does the clean look-up form on dead_ends?

Pre-trains the registry's clean ``dead_ends_*-pretrain`` recipes (one per k) under one seed, several
at once on a GPU, and scores held-out graphs by teacher forcing: the first step (the one decision,
which arm; near 1/degree without search) and the look-ups after it (each node the child of the one
before). The fair test needs look-ups of at least 0.9 in the clean arms, so that taking a token back
is not confounded with learning the look-up. Only clean arms are scored here: the contrasts
themselves are for the pre-registered full run.

    python scripts/pilot_dead_ends.py --scale full --seed 0
    python scripts/pilot_dead_ends.py --scale full --degree 3 --nodes 30 --steps 12000  # deeper
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from halluc_lab import recipes  # noqa: E402
from halluc_lab.device import setup  # noqa: E402
from halluc_lab.evaluation.evaluate import distinct_examples, teacher_forced  # noqa: E402

CLEAN = ("dead_ends_k1", "dead_ends_k2", "dead_ends_k4", "dead_ends_never")


def variant(
    name: str, scale: str, seed: int, degree: int | None, nodes: int | None, steps: int | None
):
    """The registry's pre-training recipe of ``name`` under ``seed``, its world and steps changed if
    asked."""
    r = recipes.get(f"{name}-pretrain", scale)
    world = dataclasses.replace(
        r.task, **{k: v for k, v in (("degree", degree), ("n_nodes", nodes)) if v}
    )
    if world != r.task or steps:
        suffix = f"-d{world.degree}n{world.n_nodes}s{steps or r.train.steps}"
        vocab = recipes.make_task(world).tokenizer().vocab_size
        r = dataclasses.replace(
            r,
            name=r.name + suffix,
            task=world,
            model=dataclasses.replace(r.model, vocab_size=vocab),
            train=dataclasses.replace(r.train, steps=steps or r.train.steps),
        )
    return recipes.with_seed(r, seed)


def score(trained, n_eval: int, seed: int) -> dict:
    """Teacher-forced accuracy of the first step and of the look-ups after it, on distinct held-out
    graphs."""
    examples = distinct_examples(trained.task, "heldout", n_eval, seed=10_000 + seed)
    tf = teacher_forced(trained.model, trained.tokenizer, examples)
    first = [row[1] for row in tf.correct]  # row: centre, first node, the nodes after it, <eos>
    lookups = [x for row in tf.correct for x in row[2:-1]]
    return {
        "examples": len(examples),
        "first step": sum(first) / len(first),
        "look-up": sum(lookups) / max(len(lookups), 1),
        "whole answer": sum(tf.all_correct) / len(examples),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", default="full", choices=["smoke", "full"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--degree", type=int, default=None, help="arms at the centre (default: the registry's)"
    )
    p.add_argument("--nodes", type=int, default=None, help="node labels (default: the registry's)")
    p.add_argument(
        "--steps", type=int, default=None, help="pre-training steps (default: the registry's)"
    )
    p.add_argument("--n-eval", type=int, default=1000)
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    if args.seed < 0 or args.n_eval < 1:
        p.error("--seed must be >= 0 and --n-eval >= 1")
    rt = setup(scale=args.scale, seed=args.seed, verbose=False)
    chains = [variant(n, args.scale, args.seed, args.degree, args.nodes, args.steps) for n in CLEAN]
    device = torch.cuda.get_device_name(rt.device) if rt.device.type == "cuda" else rt.device.type
    print(f"clean dead_ends pre-training, seed {args.seed}, {args.scale}, {device}", flush=True)
    start = time.perf_counter()
    recipes.prefetch(chains, rt.device, rt.dtype)
    seconds = time.perf_counter() - start
    print(f"{seconds:.0f} s to train {len(chains)} recipes at once", flush=True)
    rows = []
    for name, r in zip(CLEAN, chains):
        trained = recipes.load(r, rt)
        row = {"world": name, "degree": r.task.degree, "nodes": r.task.n_nodes,
               "steps": r.train.steps, **score(trained, args.n_eval, args.seed)}
        rows.append(row)
        print("  ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                        for k, v in row.items()), flush=True)
    if args.json:
        Path(args.json).write_text(
            json.dumps({"device": device, "seconds": seconds, "rows": rows}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
