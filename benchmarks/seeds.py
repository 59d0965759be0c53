"""Several seeds at once: training N seeds of a recipe chain one after another against N processes at once.

A training step of the lab's models is launch-bound on a GPU (the host's kernel launches, not the GPU's
arithmetic, set its time), so one process leaves the GPU mostly idle and several processes fill it.
Each arm trains the whole chain (pre-training included) from an empty cache.

    python benchmarks/seeds.py --recipe arithmetic-sft-clean --scale full --seeds 3 --json _build/bench/seeds.json
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch

from common import environment, print_table, write_json
from halluc_lab import recipes


def timed_prefetch(chains, device, dtype, processes: int) -> float:
    """Seconds to train every chain into a fresh cache with ``processes`` at once."""
    with tempfile.TemporaryDirectory() as cache:
        os.environ["HALLUC_CACHE"] = cache
        start = time.perf_counter()
        recipes.prefetch(chains, device, dtype, processes=processes)
        return time.perf_counter() - start


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", default="arithmetic-sft-clean")
    p.add_argument("--scale", default="full", choices=["smoke", "full"])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    chains = [recipes.with_seed(recipes.get(args.recipe, args.scale), s) for s in range(args.seeds)]
    one_by_one = timed_prefetch(chains, device, dtype, processes=1)
    at_once = timed_prefetch(chains, device, dtype, processes=args.seeds)
    env = environment(device)
    row = {"recipe": args.recipe, "scale": args.scale, "seeds": args.seeds, "one after another s": one_by_one,
           "at once s": at_once, "speed-up": one_by_one / at_once}
    print_table(f"{args.seeds} seeds of {args.recipe} ({args.scale}) from empty caches — {env['device']}, "
                f"torch {env['torch']}, {env['date']}", [row], list(row))
    payload = {"benchmark": "seeds", **env, "rows": [row]}
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main(sys.argv[1:])
