"""Seeds per minute: a chapter's chains trained for S seeds at once, against one seed alone, from empty caches.

A training step of the lab's models is launch-bound on a GPU (the host's kernel launches, not the GPU's
arithmetic, set its time), so one process leaves the GPU mostly idle and several processes fill it. For each
S this trains every named recipe's whole chain (pre-training included) under seeds 0 .. S−1 into a fresh cache,
S processes at once (`recipes.prefetch`), and reports the wall time, seeds per minute and, on CUDA, the GPU's
mean utilisation sampled every half second. S = 1 is the one-seed baseline, in the same run.

    python benchmarks/seeds.py --recipes kb_walk-sft-clean kb_walk-rlvr --seeds 1 4 8 --json _build/bench/seeds.json
    python benchmarks/seeds.py --scale smoke --seeds 1 2          # the code path on a CPU, in seconds

``--mps`` times every S a second time with the processes as clients of a private CUDA MPS daemon
(``halluc_lab.shared_gpu``), whose kernels then run side by side instead of taking turns, and says
whether the trained weights are bit-identical to the run without it.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from common import environment, print_table, write_json
from halluc_lab import recipes
from halluc_lab.shared_gpu import mps_service


class Utilisation:
    """The GPU's utilisation, sampled by ``nvidia-smi`` every ``every`` seconds while in use (None without it)."""

    def __init__(self, every: float = 0.5):
        self.every, self.samples, self._stop = every, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                                     capture_output=True, text=True, timeout=5).stdout.split()
                self.samples.append(sum(float(x) for x in out) / max(len(out), 1))
            except (OSError, ValueError, subprocess.SubprocessError):
                return
            self._stop.wait(self.every)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    @property
    def mean(self) -> float | None:
        return sum(self.samples) / len(self.samples) if self.samples else None


def weights_digest(cache: str) -> str:
    """One hash over every trained model's weights in a cache, in the order of their paths."""
    h = hashlib.sha256()
    for path in sorted(Path(cache).rglob("model.safetensors")):
        h.update(str(path.relative_to(cache)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def timed(names: list[str], scale: str, n_seeds: int, device: torch.device, dtype: torch.dtype,
          mps: bool = False) -> dict:
    """Train every chain of ``names`` under seeds 0 .. n_seeds−1 into a fresh cache, ``n_seeds`` processes at once
    on CUDA (one on a CPU, where processes would share two cores); under a private MPS daemon if ``mps``."""
    chains = [recipes.with_seed(recipes.get(n, scale), s) for n in names for s in range(n_seeds)]
    processes = n_seeds if device.type == "cuda" else 1
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory(prefix="mps-") as daemon:
        old = os.environ.get("HALLUC_CACHE")
        os.environ["HALLUC_CACHE"] = cache
        try:
            with mps_service(Path(daemon)) if mps else nullcontext(), Utilisation() as gpu:
                start = time.perf_counter()
                recipes.prefetch(chains, device, dtype, processes=processes)
                seconds = time.perf_counter() - start
        finally:
            if old is None:
                os.environ.pop("HALLUC_CACHE")
            else:
                os.environ["HALLUC_CACHE"] = old
        digest = weights_digest(cache)
    return {"seeds": n_seeds, "MPS": mps, "processes": processes, "seconds": seconds,
            "seeds per minute": 60 * n_seeds / seconds, "GPU busy %": gpu.mean if device.type == "cuda" else None,
            "weights": digest[:12]}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipes", nargs="+", default=["kb_walk-sft-clean"], help="recipe names (each a whole chain)")
    p.add_argument("--scale", default="full", choices=["smoke", "full"])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 4, 8], help="the seed counts S to time")
    p.add_argument("--mps", action="store_true", help="time every S under a private CUDA MPS daemon too")
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    unknown = [n for n in args.recipes if n not in recipes.NAMES]
    if unknown or any(s < 1 for s in args.seeds):
        p.error(f"unknown recipes {unknown}" if unknown else f"--seeds must be >= 1, got {args.seeds}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.mps and device.type != "cuda":
        p.error("--mps needs a CUDA GPU")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rows = []
    for s in args.seeds:
        for mps in (False, True) if args.mps else (False,):
            print(f"S = {s}{', MPS' * mps}: training {len(args.recipes)} chains × {s} seeds …", flush=True)
            rows.append(timed(args.recipes, args.scale, s, device, dtype, mps))
    base = rows[0]["seeds per minute"]
    plain = {row["seeds"]: row for row in rows if not row["MPS"]}
    for row in rows:
        row["× one at a time"] = row["seeds per minute"] / base
        if args.mps:  # the same weights as the same S without MPS: the service changed the schedule, not the sums
            row["same weights"] = row["weights"] == plain[row["seeds"]]["weights"]
    env = environment(device)
    print_table(f"Seeds of {', '.join(args.recipes)} ({args.scale}) from empty caches — {env['device']}, "
                f"torch {env['torch']}, {env['date']}", rows, list(rows[0]))
    payload = {"benchmark": "seeds", **env, "recipes": args.recipes, "scale": args.scale, "rows": rows}
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main(sys.argv[1:])
