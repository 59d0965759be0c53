"""Train one recipe (its parents first) into the recipe cache: on one device, or on several with torchrun.

    python scripts/train.py arithmetic-sft --scale smoke                    # one process
    torchrun --nproc_per_node=2 scripts/train.py kb_walk-rlvr --scale full   # two GPUs of this machine

Under torchrun each process takes the GPU of its local rank (the CPU with gloo where there is none), every
recipe of the chain trains with its global batch shared out over the processes (DistributedDataParallel),
and rank 0 alone prints and writes the cache. A notebook then finds the model in the cache
(``$HALLUC_CACHE``). README "Running on several GPUs" has the commands for several machines.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from halluc_lab import distributed, recipe_cache, recipes  # noqa: E402
from halluc_lab.device import setup  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("recipe", help="a recipe name, e.g. arithmetic-sft (--list shows them all)", nargs="?")
    parser.add_argument("--scale", choices=("auto", "smoke", "full"), default="auto",
                        help="auto: full on a GPU, smoke elsewhere")
    parser.add_argument("--seed", type=int, default=None, help="train the chain under this seed (default: the registry's)")
    parser.add_argument("--list", action="store_true", help="print the recipe names and exit")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(recipes.NAMES))
        return 0
    if args.recipe is None:
        parser.error("name a recipe (--list shows them)")
    if args.recipe not in recipes.NAMES:
        parser.error(f"unknown recipe {args.recipe!r}; --list shows the names")
    if args.seed is not None and args.seed < 0:
        parser.error(f"--seed must be >= 0, got {args.seed}")
    device = distributed.start()
    try:
        rt = setup(args.scale, device.type, verbose=distributed.is_main())
        recipe = recipes.get(args.recipe, rt.scale)
        if args.seed is not None:
            recipe = recipe_cache.with_seed(recipe, args.seed)
        start = time.perf_counter()
        trained = recipes.load(recipe, rt, verbose=True)
        ranks = distributed.world_size()
        rates = trained.history.tokens_per_s  # logged by the plain loop; a stage of rollouts logs none
        rate = f", last logged {rates[-1]:,.0f} tokens/s" if rates and trained.trained_now else ""
        distributed.print0(f"{recipe.name} ({rt.scale}, seed {recipe.seed}) is in the cache as "
                           f"{os.path.basename(trained.path)}: {time.perf_counter() - start:.1f} s on {ranks} "
                           f"process{'es' if ranks > 1 else ''}{rate}")
    finally:
        distributed.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
