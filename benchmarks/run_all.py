"""Every benchmark that matters, in one call (about 4 minutes on one H100).

Decode: tiny at batches 1 and 64 against HF generate with its dynamic and its static cache;
small at batches 1 and 64 against the dynamic cache only (the static cache's compile is slow). On CUDA,
chapter 10's decode step with and without the backspace controller (controller_step.py).
Training step: tiny and small at batch 32 × 256 tokens. BM25 indexing and querying against bm25s and
rank-bm25 (CPU). DPO step and RL iterations (PPO, RLVR) against TRL (kb_walk,
the recipes' shape), when TRL is installed (it is not a dependency: see preference.py). On a machine
with several GPUs, one GPU against two (and four) for pre-training, RLVR and spread seeds
(distributed.py). JSON files go to ``--out``.

    python benchmarks/run_all.py --out _build/bench
    python benchmarks/run_all.py --quick   # a smoke check of the scripts (CPU: under a minute)
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

import torch

import bm25
import controller_step
import decode
import distributed
import preference
import rlvr
import train_step


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="_build/bench", help="folder for the JSON results")
    p.add_argument("--device", default="auto")
    p.add_argument("--quick", action="store_true",
                   help="tiny model, few tokens: checks the scripts run")
    p.add_argument("--threads", default="0", help="torch CPU threads (0 = default)")
    args = p.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)  # each table as it is printed, through a pipe too
    out, quick = Path(args.out), args.quick
    common = ["--device", args.device, "--threads", args.threads] + (["--quick"] if quick else [])
    gpus = torch.cuda.device_count()
    steps = [("decode, tiny model", lambda: decode.main(common + [
        "--sizes", "tiny", "--batches", "1,8" if quick else "1,64",
        "--json", str(out / "decode_tiny.json")]))]  # (what is announced, the call)
    if not quick:
        steps.append(("decode, small model", lambda: decode.main(common + [
            "--sizes", "small", "--batches", "1,64", "--no-static",
            "--json", str(out / "decode_small.json")])))
    if torch.cuda.is_available() and not quick:
        steps.append(("the backspace controller's decode step", lambda: controller_step.main(
            ["--json", str(out / "controller_step.json")])))
    steps.append(("training step", lambda: train_step.main(common + [
        "--sizes", "tiny" if quick else "tiny,small", "--batches", "8" if quick else "32",
        "--json", str(out / "train_step.json")])))
    steps.append(("BM25", lambda: bm25.main(
        (["--quick"] if quick else []) + ["--json", str(out / "bm25.json")])))
    skipped = []
    if importlib.util.find_spec("trl") is None:
        skipped.append("preference, rlvr: skipped, TRL is not installed "
                       "(benchmarks/preference.py says how)")
    else:
        steps.append(("DPO step against TRL", lambda: preference.main(
            common + ["--json", str(out / "preference.json")])))
        steps.append(("RL iterations against TRL", lambda: rlvr.main(
            common + ["--json", str(out / "rlvr.json")])))
    if gpus < 2 or quick:
        skipped.append("distributed: skipped, it needs at least two CUDA GPUs "
                       "(and is no smoke check)")
    else:
        steps.append(("one GPU against several", lambda: distributed.main([
            "--gpus", ",".join(str(g) for g in (1, 2, 4) if g <= gpus),
            "--json", str(out / "distributed.json")])))
    start = time.perf_counter()
    for n, (what, run) in enumerate(steps, 1):  # a CPU runs for minutes: say what runs now
        print(f"\n[{n}/{len(steps)}] {what} (at {time.perf_counter() - start:.0f} s)", flush=True)
        run()
    for line in skipped:
        print(f"\n{line}")
    print(f"\nall benchmarks: {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
