"""Several GPUs of one machine against one: pre-training throughput, an RLVR iteration, and seeds spread out.

Three measurements, each run with PyTorch's own distributed engine (``torchrun``, NCCL, DDP) through the
lab's loops, in one invocation on one machine:

- *pre-training*: tokens/s of :func:`halluc_lab.training.train.train` on a model large enough not to be
  launch-bound (16 layers × 1024, 16 heads, vocabulary 8,192: 277 M parameters, bf16 autocast, eager step,
  deterministic kernels as every lab run), with the same global batch (64 rows × 512 tokens) on 1, 2, …
  GPUs: each rank takes its contiguous share of the rows, in micro-batches of 16 rows. Random tokens; the
  median rate of the steps after the warm-up. Scaling efficiency = rate on N / (N × rate on 1).
- *RLVR*: milliseconds per iteration of :func:`halluc_lab.stages.rlvr.rlvr` (rollouts, gathering, one GRPO step) at
  the ``kb_walk-rlvr-bksp`` recipe's full-scale shape and round (64 prompts × G = 8) with random weights, on
  1 and 2 GPUs: each rank rolls out half the prompts. The lab's model is small, so its steps are
  launch-bound and halving a batch saves little: this shows how much.
- *seeds*: :func:`halluc_lab.recipes.prefetch` training several seeds' chains from an empty cache, all at
  once on one GPU against the same processes spread one per GPU.

    python benchmarks/distributed.py --gpus 1,2,4 --json _build/bench/distributed.json   # needs CUDA GPUs

Timings are never asserted; the README's "Running on several GPUs" and book/results/training.md carry them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from common import environment, print_table, synchronize, write_json  # noqa: E402
from halluc_lab import recipes  # noqa: E402
from halluc_lab.training import distributed
from halluc_lab.training.data import Batch  # noqa: E402
from halluc_lab.evaluation.evaluate import answer_budget  # noqa: E402
from halluc_lab.model.config import ModelConfig  # noqa: E402
from halluc_lab.model.transformer import Transformer  # noqa: E402
from halluc_lab.stages.preference import preference_examples  # noqa: E402
from halluc_lab.stages.reward_model import VerifierReward  # noqa: E402
from halluc_lab.stages.rlvr import rlvr  # noqa: E402
from halluc_lab.training.rlvr_losses import GRPO  # noqa: E402
from halluc_lab.tasks import make_task  # noqa: E402
from halluc_lab.training.train import TrainConfig, train  # noqa: E402

LARGE = ModelConfig(vocab_size=8192, hidden_size=1024, n_layers=16, n_heads=16, max_positions=512)
ROWS, SEQ, MICRO = 64, 512, 16  # the global batch, and the rows of one micro-batch
RL_RECIPE = "kb_walk-rlvr-bksp"


# -- workers: what each process of a torchrun run does --------------------------------------------------
def pretrain_worker(steps: int, warmup: int, weak: bool = False) -> dict:
    """Tokens/s of the plain loop; ``weak``: ROWS rows per GPU (the global batch grows with the GPUs)."""
    device = distributed.start()
    ranks = distributed.world_size()
    model = Transformer(LARGE, seed=0).to(device)
    rows = ROWS * ranks if weak else ROWS

    def data(step: int) -> Batch:  # the global batch of a step, the same on every rank
        ids = torch.randint(0, LARGE.vocab_size, (rows, SEQ), generator=torch.Generator().manual_seed(step))
        return Batch(ids, ids.clone())

    # The loop syncs with the host once per log window: rates are window means, the warm-up one window.
    cfg = TrainConfig(steps=warmup + steps, lr=3e-4, warmup_steps=1, accum_steps=rows // ranks // MICRO,
                      weight_decay=0.0, log_every=warmup)
    hist = train(model, data, cfg, autocast_dtype=torch.bfloat16, cuda_graph=False, desc=f"pre-training × {ranks}")
    return {"gpus": ranks, "rows": rows, "tokens/s": statistics.median(hist.tokens_per_s[warmup:]), "loss": hist.loss,
            "params M": sum(p.numel() for p in model.parameters()) / 1e6,
            "peak GiB": torch.cuda.max_memory_allocated(device) / 2**30}


def rlvr_worker(steps: int, warmup: int) -> dict:
    device = distributed.start()
    rl = recipes.get(RL_RECIPE, "full")
    task = make_task(rl.task)
    tok = task.tokenizer()
    examples = preference_examples(task, rl.stage.n_prompts, seed=rl.seed)
    cfg = dataclasses.replace(rl.stage.config, lr=rl.train.lr, max_new_tokens=answer_budget(examples),
                              iterations=warmup + steps + 1)
    policy = Transformer(rl.model, seed=0).to(device)
    reference = Transformer(rl.model, seed=0).to(device).requires_grad_(False)
    verifier, stamps = VerifierReward(task, tok, rl.stage.lam, rl.stage.bksp_cost), []

    def reward(prompts, completions, **kw):  # called once an iteration, between its rollouts and its update
        synchronize(device)
        stamps.append(time.perf_counter())
        return verifier(prompts, completions)

    rlvr(policy, reference, [(tok.bos_id, *tok.encode(e.prompt)) for e in examples], reward, cfg, GRPO(), tok=tok,
         seed=0, autocast_dtype=torch.bfloat16, desc=f"rlvr × {distributed.world_size()}")
    gaps = [b - a for a, b in zip(stamps, stamps[1:])][warmup:]
    return {"gpus": distributed.world_size(), "ms": 1000 * statistics.median(gaps), "timed": len(gaps),
            "rollouts": cfg.prompts_per_iteration * cfg.samples_per_prompt}


def seeds_worker(names: list[str], seeds: int) -> dict:
    chains = [recipes.with_seed(recipes.get(n, "full"), s) for n in names for s in range(seeds)]
    with tempfile.TemporaryDirectory() as cache:
        os.environ["HALLUC_CACHE"] = cache
        start = time.perf_counter()
        recipes.prefetch(chains, "cuda", torch.bfloat16)
        seconds = time.perf_counter() - start
    return {"gpus": torch.cuda.device_count(), "chains": len(chains), "s": seconds}


WORKERS = {"pretrain": pretrain_worker, "pretrain-weak": lambda steps, warmup: pretrain_worker(steps, warmup, True),
           "rlvr": rlvr_worker}


# -- the driver -----------------------------------------------------------------------------------------
def launch(args: list[str], gpus: int, env: dict | None = None) -> dict:
    """Run this script's worker on ``gpus`` processes (torchrun) and return rank 0's result."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={gpus}",
               __file__, "--worker", *args, "--result", out.name]
        done = subprocess.run(cmd, env={**os.environ, **(env or {}), "HALLUC_BATCH": "1"}, capture_output=True,
                              text=True)
        if done.returncode:
            raise RuntimeError(f"{' '.join(args)} on {gpus} GPU(s) failed:\n{done.stderr[-4000:]}")
        with open(out.name) as f:
            return json.load(f)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpus", default="1,2", help="comma-separated GPU counts for pre-training (RLVR: 1 and 2)")
    p.add_argument("--steps", type=int, default=10, help="timed steps (pre-training) or iterations (RLVR)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (pre-training: also the log window)")
    p.add_argument("--seed-recipes", default="kb_walk-rlvr-bksp,arithmetic-rlvr-bksp",
                   help="chains trained at once for the seeds measurement ('' skips it)")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--skip", default="", help="comma-separated: pretrain, pretrain-weak, rlvr, seeds")
    p.add_argument("--json", default="")
    p.add_argument("--worker", default="", help=argparse.SUPPRESS)
    p.add_argument("--result", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:  # one process of a torchrun run
        try:
            if args.worker == "seeds":
                result = seeds_worker(args.seed_recipes.split(","), args.seeds)
            else:
                result = WORKERS[args.worker](args.steps, args.warmup)
            if distributed.is_main():
                with open(args.result, "w") as f:
                    json.dump(result, f)
        finally:
            distributed.stop()
        return {}
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU (one or more)")
    gpus = [int(g) for g in args.gpus.split(",")]
    if max(gpus) > torch.cuda.device_count():
        p.error(f"--gpus asks for {max(gpus)} GPUs; this machine has {torch.cuda.device_count()}")
    skip, common = set(args.skip.split(",")), ["--steps", str(args.steps), "--warmup", str(args.warmup)]
    env = environment(torch.device("cuda"))
    payload = {"benchmark": "distributed", **env, "gpus_on_machine": torch.cuda.device_count()}
    for mode, batch in (("pretrain", f"the same global batch, {ROWS} × {SEQ} tokens"),
                        ("pretrain-weak", f"{ROWS} × {SEQ} tokens per GPU")):
        if mode in skip:
            continue
        rows = [launch([mode, *common], g) for g in gpus]
        for r in rows:
            r["speed-up"] = r["tokens/s"] / rows[0]["tokens/s"]
            r["efficiency"] = r["speed-up"] / (r["gpus"] / rows[0]["gpus"])
            r["final loss"] = r["loss"][-1]
        print_table(f"pre-training {rows[0]['params M']:.0f} M parameters, {batch}, bf16 — {env['device']}, torch "
                    f"{env['torch']}, {env['date']}", rows,
                    ["gpus", "rows", "tokens/s", "speed-up", "efficiency", "final loss", "peak GiB"])
        payload[mode] = rows
        write_json(args.json, payload)
    if "rlvr" not in skip and torch.cuda.device_count() >= 2:
        rows = [launch(["rlvr", *common], g) for g in (1, 2)]
        for r in rows:
            r["speed-up"] = rows[0]["ms"] / r["ms"]
        print_table(f"RLVR iteration, {RL_RECIPE} full-scale shape, {rows[0]['rollouts']} rollouts, GRPO, median ms",
                    rows, ["gpus", "ms", "speed-up", "timed"])
        payload["rlvr"] = rows
        write_json(args.json, payload)
    if "seeds" not in skip and args.seed_recipes and torch.cuda.device_count() >= 2:
        worker = ["seeds", "--seed-recipes", args.seed_recipes, "--seeds", str(args.seeds)]
        one = launch(worker, 1, env={"CUDA_VISIBLE_DEVICES": "0"})
        spread = launch(worker, 1)
        rows = [{"arm": "all at once on 1 GPU", **one}, {"arm": f"one process per chain over {spread['gpus']} GPUs",
                                                           **spread}]
        for r in rows:
            r["speed-up"] = one["s"] / r["s"]
        print_table(f"{one['chains']} chains ({args.seed_recipes} × {args.seeds} seeds, full) from an empty cache",
                    rows, ["arm", "gpus", "chains", "s", "speed-up"])
        payload["seeds"] = rows
        write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main(sys.argv[1:])
