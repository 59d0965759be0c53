"""Same seed, same device type, same code: the same bits (ARCHITECTURE.md §3).

A short recipe chain (pre-training, then SFT with scheduled sampling, which samples during training)
is trained from an empty cache in two separate processes; their weights, losses and a greedy
evaluation must agree to the last bit. On CPU this runs in CI; on a GPU (deterministic kernels,
bf16 autocast, the captured training step) it is marked ``gpu``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import dataclasses, hashlib, json, sys
import torch
from halluc_lab import recipes
from halluc_lab.evaluation.evaluate import complete
from halluc_lab.recipes.cache import load_recipe

device = sys.argv[1]
dtype = torch.bfloat16 if device == "cuda" else torch.float32

def short(r):
    steps = 24
    parent = None if r.parent is None else short(r.parent)
    train = dataclasses.replace(r.train, steps=steps, warmup_steps=2, checkpoint_every=8,
                                log_every=4)
    return dataclasses.replace(r, parent=parent, train=train)

trained = load_recipe(short(recipes.get("arithmetic-sft-scheduled", "smoke")), device, dtype)
h = hashlib.sha256()
for name, t in sorted(trained.model.state_dict().items()):
    h.update(name.encode() + t.detach().float().cpu().numpy().tobytes())
prompts = [e.prompt for e in trained.task.examples("heldout", 32, seed=0)]
outs = complete(trained.model, trained.tokenizer, prompts, 6)
print(json.dumps({"weights": h.hexdigest(), "loss": trained.history.loss, "outs": outs}))
"""


def _run(device: str, cache: Path) -> dict:
    env = {**os.environ, "HALLUC_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, device], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _check_two_processes_agree(device: str, tmp_path: Path) -> None:
    first, second = _run(device, tmp_path / "a"), _run(device, tmp_path / "b")
    assert first["loss"] == second["loss"], "the training losses differ between two identical runs"
    assert first["weights"] == second["weights"], "the trained weights differ between two runs"
    assert first["outs"] == second["outs"], "greedy completions differ between two identical runs"


@pytest.mark.slow
def test_two_processes_train_the_same_bits_on_cpu(tmp_path):
    _check_two_processes_agree("cpu", tmp_path)


@pytest.mark.gpu
def test_two_processes_train_the_same_bits_on_cuda(tmp_path):
    _check_two_processes_agree("cuda", tmp_path)
