"""Train and measure chapter 10's fair test (notebooks/10b_fair_test.ipynb) under some seeds.

Every arm of every world (``halluc_lab.book.take_back``) is trained under each seed, its whole
chain, and measured once; the records land in the cache (``$HALLUC_CACHE/measured``) beside the
models, where the chapter reads them. Running the seeds of a chapter in parts, on one machine or
one GPU model, then the chapter, gives the chapter's run without training anything twice:

    python scripts/fair_test.py --scale full --seeds 0 1 2 3
    python scripts/fair_test.py --scale full --seeds 4 5 6 7
    papermill notebooks/10b_fair_test.ipynb out.ipynb -p scale full

Prints the time of the SFT arms and of the RL arms, then, per world and arm, the exact match of
the greedy answers under each seed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from halluc_lab.book import take_back  # noqa: E402
from halluc_lab.device import setup  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", default="full", choices=sorted(take_back.MEASURE))
    p.add_argument("--seeds", type=int, nargs="+", required=True)
    p.add_argument("--no-rl", action="store_true", help="the SFT arms alone (no RLVR run)")
    args = p.parse_args(argv)
    if any(s < 0 for s in args.seeds) or len(set(args.seeds)) != len(args.seeds):
        p.error("--seeds must be distinct ints >= 0")
    rt = setup(scale=args.scale, seed=args.seeds[0], verbose=False)
    measure, start = take_back.MEASURE[args.scale], time.perf_counter()
    records = take_back.train_and_measure(args.seeds, rt, measure, with_rl=False)
    print(f"SFT arms: {len(records)} records, seeds {args.seeds}, "
          f"{time.perf_counter() - start:.0f} s", flush=True)
    if not args.no_rl:  # the SFT records are cached now: this trains and measures the RL arms
        rl_start = time.perf_counter()
        records = take_back.train_and_measure(args.seeds, rt, measure)
        print(f"RL arms: {len(records)} records in all, {time.perf_counter() - rl_start:.0f} s")
    for world in take_back.WORLDS:
        for label in take_back.arms(take_back.WORLDS[world]):
            if (world, label, args.seeds[0]) not in records:
                continue
            em = take_back.right(take_back.outcomes(records, world, label, args.seeds)).mean(1)
            print(f"{world:6} {label:32} " + " ".join(f"{x:.2f}" for x in em)
                  + f"  mean {np.mean(em):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
