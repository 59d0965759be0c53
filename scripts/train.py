"""Train one recipe (its parents first) into the recipe cache, on one device or several (torchrun).

    python scripts/train.py arithmetic-sft-clean --scale smoke               # one process
    torchrun --nproc_per_node=2 scripts/train.py kb_walk-rlvr --scale full   # two GPUs here

The device is the library's choice (``halluc_lab.device.choose_device``): ``$HALLUC_DEVICE`` if
set (cpu, cuda or mps), else CUDA, then MPS, then the CPU. ``--scale full`` on a CPU takes long
(pre-training alone about 50 minutes): it prints how many steps the chain trains and asks for
``--yes``. Ctrl-C stops with exit code 130; the same command then resumes from the last
checkpoint (saved about every quarter of a recipe's run).

Under torchrun each process takes the GPU of its local rank (the CPU with gloo where there is
none, or where ``HALLUC_DEVICE=cpu``), every recipe of the chain trains with its global batch
shared out over the processes (DistributedDataParallel), and rank 0 alone prints and writes the
cache. A notebook then finds the model in the cache (``$HALLUC_CACHE``). README "Running on
several GPUs" has the commands for several machines.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from halluc_lab import recipes  # noqa: E402
from halluc_lab.training import distributed
from halluc_lab.device import choose_device, resolve_scale, setup  # noqa: E402

INTERRUPTED = 130  # the shell's code for a process stopped by SIGINT


def chain_steps(recipe) -> int:
    """Optimizer steps of the recipe and its parents (a cached parent is not trained again)."""
    return recipe.train.steps + (0 if recipe.parent is None else chain_steps(recipe.parent))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("recipe", nargs="?",
                        help="a recipe name, e.g. arithmetic-sft-clean (--list shows them all)")
    parser.add_argument("--scale", choices=("auto", "smoke", "full"), default="auto",
                        help="auto: full on a GPU, smoke elsewhere")
    parser.add_argument("--seed", type=int, default=None,
                        help="train the chain under this seed (default: the registry's)")
    parser.add_argument("--yes", action="store_true", help="train at --scale full on a CPU")
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
    try:
        device, _ = choose_device()  # $HALLUC_DEVICE, checked, else the best device found
    except ValueError as err:
        parser.error(str(err))
    recipe = recipes.get(args.recipe, resolve_scale(args.scale, device))
    if args.seed is not None:
        recipe = recipes.with_seed(recipe, args.seed)
    if recipe.scale == "full" and device.type == "cpu" and not args.yes:
        parser.error(f"{recipe.name} at scale full trains up to {chain_steps(recipe):,} steps over "
                     "its chain; on a CPU that takes hours (pre-training alone about 50 minutes): "
                     "pass --yes to go on, or --scale smoke")
    seed = recipe.pretraining.seed  # the chain's seed, as --seed sets it; its recipes' draws follow
    distributed.start(None if device.type == "cuda" else "gloo")
    try:
        rt = setup(args.scale, seed=seed, verbose=distributed.is_main())
        start = time.perf_counter()
        trained = recipes.load(recipe, rt, verbose=True)
        ranks = distributed.world_size()
        rates = trained.history.tokens_per_s  # logged by the plain loop; rollout stages log none
        rate = f", last logged {rates[-1]:,.0f} tokens/s" if rates and trained.trained_now else ""
        distributed.print0(f"{recipe.name} ({rt.scale}, seed {seed}) is in the cache as "
                           f"{os.path.basename(trained.path)}: {time.perf_counter() - start:.1f} s "
                           f"on {ranks} process{'es' if ranks > 1 else ''}{rate}")
    except KeyboardInterrupt:
        print(f"\ninterrupted: {recipe.name} is not in the cache yet; the same command resumes it "
              "from its last checkpoint", file=sys.stderr)
        return INTERRUPTED
    finally:
        distributed.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
