"""Preference and RL training: the lab's DPO step and PPO iteration against TRL's DPO and RLOO trainers, one run.

Both sides start from the same weights (the lab's model, converted with ``hf_convert`` to
``LlamaForCausalLM``) and the same data from the kb_walk task: the shape of the
``kb_walk-sft-clean`` recipe (``--scale full``: 4 layers × 256; ``smoke``: 2 × 64), random weights
(the timing does not depend on training). bf16 autocast on CUDA for both sides, fp32 on the CPU.

**DPO step.** Pairs: ``sample_groups`` draws two completions of each train prompt from the model,
the verifier's better one is chosen (ties: the first); a completion the answer budget cut off gets
the ``<eos>`` that TRL would append, so both sides train on the same token ids (checked after TRL
tokenises the text). Batch, β and learning rate are the ``kb_walk-dpo`` recipe's.

- *lab*: :class:`halluc_lab.training.step.CapturedStep` on CUDA (:class:`~halluc_lab.training.step.EagerStep` on the
  CPU), as :func:`halluc_lab.training.train.train` runs it — deterministic kernels, fused capturable AdamW,
  clipping 1.0 — with :class:`halluc_lab.stages.preference.DPOLoss` on pair rows
  (:func:`~halluc_lab.stages.preference_data.pair_rows`) drawn by :func:`halluc_lab.training.data.batches`; reference
  log-probs from :func:`~halluc_lab.stages.preference.precompute_reference_logps`, once, before timing.
- *TRL*: ``DPOTrainer`` with ``loss_type=["sigmoid"]``, ``precompute_ref_log_probs=True`` (the
  reference also runs once, at init, untimed), the same AdamW (β₂ 0.95, no weight decay, clipping
  1.0, constant rate), its default fused optimizer and padding collator. Changed from TRL's defaults
  so it is not slowed by what the lab does not do: ``gradient_checkpointing=False`` (TRL's default is
  True), logging, saving and progress bars off. Its kernels are left non-deterministic (its default).

A step's time: between consecutive optimizer steps (TRL: a callback at each step's end), the device
synchronised, the batch's gathering or collation included; the median after the warm-up steps.

**RL iteration** (rollouts + update). TRL 1.16 has no PPO trainer; RLOO is the closest to the
lab's :func:`halluc_lab.stages.rlhf.ppo`: like it, RLOO subtracts β × Σ_t (log π − log π_ref) (the
k1 KL estimate) from the reward, recomputes π_old's log-probs with a forward pass, and optimises the
clipped ratio objective over several passes of minibatches; it only replaces the value model and GAE
by the leave-one-out baseline (so it does less work per iteration than PPO). GRPO puts the KL in the
loss instead and defaults to β = 0. Same iteration shape on both sides: ``PPOConfig``'s prompts per
iteration, samples per prompt, max new tokens, stop at ``<eos>``, temperature 1, and epochs ×
minibatches optimizer steps (RLOO: ``num_iterations`` × ``steps_per_generation``), same learning rate,
β = ``kl_coef``, ε = ``clip``. The reward is the kb_walk verifier on both sides:
:class:`halluc_lab.stages.reward_model.VerifierReward` on the token ids. TRL hands a reward function the
completions as text decoded with ``skip_special_tokens=True``, which drops ``<abstain>`` and
``<bksp>`` and would change the verdict, so its reward function decodes the ``completion_ids`` TRL
also passes with the lab's tokenizer. TRL generates with transformers' ``generate`` (dynamic cache,
no vLLM); the lab with its engine (a CUDA graph of the decode step on CUDA), and replays the round's
scoring and each minibatch update as CUDA graphs, under bf16 autocast (``ppo(..., autocast_dtype=)``) with
deterministic kernels, as its recipe stage runs. An iteration's time: between consecutive calls of the reward function (one per
rollout batch: the update of one iteration and the rollouts of the next); the median after warm-up.

Targets (the issue): lab ≥ 2× TRL's DPO step, ≥ 5× its RL iteration. Timings are never asserted.

TRL is not a dependency of the project (nor of CI): install it beside the environment, naming with
``--no-deps`` what the environment lacks (else pip puts a second torch into the target), e.g. on the
project's CPU environment::

    pip install --no-deps --target /tmp/trlsite trl==1.16.0 accelerate==1.15.0 datasets==5.0.0 \
        dill==0.4.1 multiprocess==0.70.19 pandas pyarrow xxhash
    PYTHONPATH=/tmp/trlsite python benchmarks/preference.py --device cpu --scale smoke --out _build/bench/pref_cpu.json

datasets 5.0.0 is the newest that accepts huggingface_hub < 2 (the GPU image has 1.33). On the GPU
machine (torch 2.11, transformers 5.17, accelerate, pandas, pyarrow, xxhash present; no network) the
wheels kept in ``.whl-trl/`` (trl, datasets, dill, multiprocess; git-ignored locally) install with::

    pip install -q --no-index --no-deps --target /tmp/site .whl-trl/*.whl && export PYTHONPATH=/tmp/site:$PWD
    python benchmarks/preference.py --out _build/bench/preference.json      # CUDA: full scale
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import statistics
import sys
import tempfile
import time
import warnings

import torch

from common import attempt, environment, fmt, ratio, synchronize, write_json
from halluc_lab import recipes
from halluc_lab.training.data import batches
from halluc_lab.device import deterministic
from halluc_lab.model.hf_convert import save_pretrained
from halluc_lab.model.transformer import Transformer
from halluc_lab.stages.preference import DPOLoss, PreferencePairs, VerifierReward, precompute_reference_logps, sample_groups
from halluc_lab.stages.reward_model import RewardModel
from halluc_lab.stages.rlhf import PPOConfig, ppo
from halluc_lab.training.step import CapturedStep, EagerStep, autocast, make_optimizer
from halluc_lab.tasks import make_task
from halluc_lab.training.train import TrainConfig

TASK = "kb_walk"


class Clock:
    """Timestamps (the device synchronised first, unless ``synchronized=False``); ``summary(skip)`` times the gaps
    after the first ``skip``."""

    def __init__(self, device: torch.device, synchronized: bool = True):
        self.device, self.synchronized, self.stamps = device, synchronized, []

    def tick(self) -> None:
        if self.synchronized:
            synchronize(self.device)
        self.stamps.append(time.perf_counter())

    def summary(self, skip: int, **extra) -> dict:
        """Median milliseconds and rate per second of the gaps after the first ``skip`` (warm-up)."""
        gaps = [b - a for a, b in zip(self.stamps, self.stamps[1:])][skip:]
        if not gaps:
            raise RuntimeError(f"{len(self.stamps)} timestamps, {skip} warm-up gaps: nothing left to time")
        ms = 1000 * statistics.median(gaps)
        return {"ms": ms, "per_s": 1000 / ms, "n": len(gaps), "min_ms": 1000 * min(gaps),
                "max_ms": 1000 * max(gaps), "each_ms": [round(1000 * g, 2) for g in gaps], **extra}


# -- data ---------------------------------------------------------------------------------------------
def dpo_pairs(model, tok, task, n_prompts: int, seed: int) -> PreferencePairs:
    """One pair per train prompt from two of the model's samples, the verifier's better one chosen (ties:
    the first), each completion ending in ``<eos>`` (TRL appends it to a completion that lacks it)."""
    examples = task.examples("train", n_prompts, seed=seed)
    groups = sample_groups(model, tok, task, examples, n_samples=2, seed=seed)
    with_eos = lambda c: tuple(c) if c and c[-1] == tok.eos_id else (*c, tok.eos_id)
    chosen, rejected = [], []
    for (a, b), (ra, rb) in zip(groups.completions, groups.rewards.tolist()):
        first, second = (a, b) if ra >= rb else (b, a)
        chosen.append(with_eos(first))
        rejected.append(with_eos(second))
    return PreferencePairs(groups.prompts, tuple(chosen), tuple(rejected), (True,) * len(chosen), tok.pad_id)


# -- the lab ------------------------------------------------------------------------------------------
def lab_dpo(model, pairs: PreferencePairs, batch_size: int, beta: float, lr: float, device, dtype,
            warmup: int, steps: int) -> dict:
    """Time per optimizer step of the lab's DPO, as ``train.train`` runs it."""
    model = copy.deepcopy(model).to(device).train()
    with autocast(device, dtype):
        pairs = precompute_reference_logps(model, pairs)  # the starting model is the reference: once, untimed
    loss = DPOLoss(beta, pairs.reference.to(device))
    data = batches(pairs.rows().to(device), batch_size, seed=0)
    graphed = device.type == "cuda"
    clock = Clock(device)
    with deterministic():  # as train.train runs every step
        opt = make_optimizer(model, TrainConfig(lr=lr, weight_decay=0.0), capturable=graphed)
        step = (CapturedStep if graphed else EagerStep)(model, opt, grad_clip=1.0, accum_steps=1, loss=loss,
                                                        autocast_dtype=dtype)
        clock.tick()
        for i in range(warmup + steps):
            step(data(i), lr)
            clock.tick()
    return clock.summary(warmup, step="CapturedStep (CUDA graph)" if graphed else "EagerStep")


def lab_rl(model, tok, task, prompts: list[str], cfg: PPOConfig, device, dtype, warmup: int,
           iterations: int) -> dict:
    """Time per iteration of the lab's PPO (between reward calls), with the mean completion length."""
    policy = copy.deepcopy(model).to(device).train()
    reference = copy.deepcopy(policy).eval()
    value = RewardModel.from_lm(policy)
    verifier, clock, lengths = VerifierReward(task, tok), Clock(device), []

    def reward(prompt_ids, completion_ids):
        clock.tick()
        lengths.extend(len(c) for c in completion_ids)
        return verifier(prompt_ids, completion_ids)

    ids = [[tok.bos_id, *tok.encode(p)] for p in prompts]
    with deterministic():  # as the PPO recipe stage runs it
        ppo(policy, reference, value, ids, reward, dataclasses.replace(cfg, iterations=warmup + iterations + 1),
            pad_id=tok.pad_id, seed=0, stop_tokens=(tok.eos_id,), autocast_dtype=dtype)
    return clock.summary(warmup, mean_completion=sum(lengths) / len(lengths))


# -- TRL ----------------------------------------------------------------------------------------------
def trl_common(out_dir: str, device, **kw) -> dict:
    """Training arguments both TRL trainers share: the lab's optimisation, nothing logged or saved."""
    cuda = device.type == "cuda"
    return dict(output_dir=out_dir, bf16=cuda, use_cpu=not cuda, optim="adamw_torch_fused" if cuda else "adamw_torch",
                lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, gradient_checkpointing=False,
                report_to="none", logging_strategy="no", save_strategy="no", disable_tqdm=True, seed=0,
                dataloader_num_workers=0, **kw)


def quiet_train(trainer) -> None:
    """``trainer.train()`` without the metrics it prints at the end."""
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)
    trainer.train()


def trl_dpo(trl, hf_dir: str, tok, pairs: PreferencePairs, batch_size: int, beta: float, lr: float, device,
            warmup: int, steps: int) -> dict:
    """Time per optimizer step of TRL's DPOTrainer on the same pairs and weights."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback

    text = tok.decode
    data = Dataset.from_dict({"prompt": [text(p[1:]) for p in pairs.prompts],  # TRL's tokenizer adds the <bos>
                              "chosen": [" " + text(c) for c in pairs.chosen],  # TRL joins prompt + completion
                              "rejected": [" " + text(r) for r in pairs.rejected]})
    clock = Clock(device)

    class StepEnd(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            clock.tick()

        def on_step_end(self, args, state, control, **kw):
            clock.tick()

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    with tempfile.TemporaryDirectory() as out:
        args = trl.DPOConfig(**trl_common(out, device, per_device_train_batch_size=batch_size,
                                          max_steps=warmup + steps, learning_rate=lr, adam_beta2=0.95,
                                          max_grad_norm=1.0, beta=beta, loss_type=["sigmoid"],
                                          precompute_ref_log_probs=True, max_length=None))
        trainer = trl.DPOTrainer(model=model, args=args, train_dataset=data, processing_class=tok.to_hf(),
                                 callbacks=[StepEnd()])
        _check_same_pairs(trainer.train_dataset, pairs)
        quiet_train(trainer)
    return clock.summary(warmup)  # the first gap (a warm-up one) also holds the trainer's set-up


def _check_same_pairs(dataset, pairs: PreferencePairs) -> None:
    """The token ids TRL trains on must be the lab's, or the two sides would do different work."""
    got = (dataset["prompt_ids"], dataset["chosen_ids"], dataset["rejected_ids"])
    want = ([list(p) for p in pairs.prompts], [list(c) for c in pairs.chosen], [list(r) for r in pairs.rejected])
    for name, g, w in zip(("prompt", "chosen", "rejected"), got, want):
        g = [list(x) for x in g]
        if g != w:
            bad = next((i for i, (a, b) in enumerate(zip(g, w)) if a != b), min(len(g), len(w)))
            raise RuntimeError(f"TRL's {name} ids differ from the lab's at pair {bad} of {len(w)}: "
                               f"{g[bad] if bad < len(g) else None} against {w[bad] if bad < len(w) else None}")


def trl_rl(trl, hf_dir: str, tok, task, prompts: list[str], cfg: PPOConfig, device, warmup: int,
           iterations: int) -> dict:
    """Time per iteration of TRL's RLOOTrainer (between reward calls), with the mean completion length."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    verifier, clock, lengths = VerifierReward(task, tok), Clock(device), []

    def kb_walk_verifier(prompts, completions, completion_ids, **kw):
        clock.tick()
        lengths.extend(len(c) for c in completion_ids)
        return verifier([[tok.bos_id, *tok.encode(p)] for p in prompts], [list(c) for c in completion_ids])

    rollouts = cfg.prompts_per_iteration * cfg.samples_per_prompt
    if rollouts % cfg.minibatches:
        raise ValueError(f"prompts × samples ({rollouts}) must split into {cfg.minibatches} minibatches")
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)  # the reference loads from hf_dir too
    with tempfile.TemporaryDirectory() as out:
        args = trl.RLOOConfig(**trl_common(
            out, device, per_device_train_batch_size=rollouts // cfg.minibatches, steps_per_generation=cfg.minibatches,
            num_generations=cfg.samples_per_prompt, num_iterations=cfg.epochs, max_completion_length=cfg.max_new_tokens,
            temperature=1.0, top_p=1.0, top_k=0, learning_rate=cfg.lr, max_grad_norm=cfg.grad_clip, beta=cfg.kl_coef,
            epsilon=cfg.clip, max_steps=(warmup + iterations + 1) * cfg.epochs * cfg.minibatches))
        trainer = trl.RLOOTrainer(model=model, reward_funcs=kb_walk_verifier, args=args,
                                  train_dataset=Dataset.from_dict({"prompt": prompts}), processing_class=tok.to_hf())
        quiet_train(trainer)
    return clock.summary(warmup, mean_completion=sum(lengths) / len(lengths))


# -- the run ------------------------------------------------------------------------------------------
def print_markdown(title: str, rows: list[dict], columns: list[str]) -> None:
    """A Markdown table (what book/results/ pages hold), under a title line."""
    print(f"\n{title}\n")
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for r in rows:
        print("| " + " | ".join(fmt(r.get(c, "")) for c in columns) + " |")


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu or cuda")
    p.add_argument("--scale", default="auto", choices=["auto", "smoke", "full"],
                   help="the kb_walk recipes' shape; auto: full (4 × 256) on CUDA, smoke (2 × 64) elsewhere")
    p.add_argument("--dpo-steps", type=int, default=20, help="timed DPO steps per side (after --warmup)")
    p.add_argument("--rl-iterations", type=int, default=6, help="timed RL iterations per side (after --warmup)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps (DPO) or iterations (RL) first, at least 1")
    p.add_argument("--quick", action="store_true", help="few steps and iterations: a smoke check of the script")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    p.add_argument("--out", "--json", dest="json", default="", help="also write the results to this JSON file")
    args = p.parse_args(argv)
    if min(args.dpo_steps, args.rl_iterations, args.warmup) < 1:
        p.error("--dpo-steps, --rl-iterations and --warmup must be at least 1")
    for key in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TQDM_DISABLE", "HALLUC_BATCH"):  # nothing to download,
        os.environ.setdefault(key, "1")  # no progress bars (the Hugging Face libraries read these on import, below)
    try:
        import trl
    except ImportError:
        sys.exit("benchmarks/preference.py needs TRL 1.16 (with accelerate and datasets), which is not a dependency "
                 "of the project: install it into a separate target and put that on PYTHONPATH, as the script's "
                 "docstring says (pip install --no-deps --target /tmp/trlsite trl==1.16.0 ...)")
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    for category in (UserWarning, FutureWarning):  # TRL's and transformers' notices about the settings chosen here
        warnings.filterwarnings("ignore", category=category)
    if args.threads:
        torch.set_num_threads(args.threads)
    name = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    scale = args.scale if args.scale != "auto" else ("full" if device.type == "cuda" else "smoke")
    warmup, dpo_steps, rl_iters = (1, 3, 2) if args.quick else (args.warmup, args.dpo_steps, args.rl_iterations)

    sft, dpo = recipes.get(f"{TASK}-sft-clean", scale), recipes.get(f"{TASK}-dpo", scale)
    task = make_task(sft.task)
    tok = task.tokenizer()
    torch.manual_seed(0)
    model = Transformer(sft.model, seed=0)  # random weights: the timing does not depend on training
    B, beta, lr = dpo.batch_size, dpo.stage.beta, dpo.train.lr
    pairs = dpo_pairs(copy.deepcopy(model).to(device), tok, task, n_prompts=4 * B, seed=0)
    cfg = PPOConfig()
    prompts = [e.prompt for e in task.examples("train", 16 * cfg.prompts_per_iteration, seed=1)]

    with tempfile.TemporaryDirectory() as hf_dir:  # the same weights for TRL, as a Hugging Face folder
        save_pretrained(model, hf_dir, bos_token_id=tok.bos_id, eos_token_id=tok.eos_id, pad_token_id=tok.pad_id)
        tok.save(hf_dir)
        results = {
            "DPO step": (attempt(lambda: lab_dpo(model, pairs, B, beta, lr, device, dtype, warmup, dpo_steps),
                                 name="lab DPO"),
                         attempt(lambda: trl_dpo(trl, hf_dir, tok, pairs, B, beta, lr, device, warmup, dpo_steps),
                                 name="TRL DPO")),
            "RL iteration": (attempt(lambda: lab_rl(model, tok, task, prompts, cfg, device, dtype, warmup, rl_iters),
                                     name="lab PPO"),
                             attempt(lambda: trl_rl(trl, hf_dir, tok, task, prompts, cfg, device, warmup, rl_iters),
                                     name="TRL RLOO"))}

    env = {**environment(device), "trl": trl.__version__, "datasets": datasets.__version__}
    get = lambda r, k: r[k] if isinstance(r, dict) else r  # a failed side's entry is its error
    rows = [{"what": what, "lab ms": get(lab, "ms"), "TRL ms": get(peer, "ms"), "lab /s": get(lab, "per_s"),
             "TRL /s": get(peer, "per_s"), "lab/TRL": ratio(get(peer, "ms"), get(lab, "ms")),
             "timed": get(lab, "n"), "lab": lab, "trl": peer} for what, (lab, peer) in results.items()]
    precision = "fp32" if dtype == torch.float32 else "bf16 autocast"
    print_markdown(f"{TASK} {scale} ({sft.model.n_layers} × {sft.model.hidden_size}), {precision}, median ms per "
                   f"DPO step / RL iteration after {warmup} warm-up — {env['device']}, torch {env['torch']}, "
                   f"transformers {env['transformers']}, trl {env['trl']}, {env['date']}",
                   rows, ["what", "lab ms", "TRL ms", "lab /s", "TRL /s", "lab/TRL", "timed"])
    lab_rl_r, trl_rl_r = results["RL iteration"]
    mean_len = lambda r: f"{r['mean_completion']:.1f}" if isinstance(r, dict) else "n/a"
    print(f"\nDPO: {B} pairs a step, lab rows of {pairs.rows().input_ids.shape[1]} tokens (a pair packed per row), "
          f"TRL rows padded per batch. RL: {cfg.prompts_per_iteration} prompts × {cfg.samples_per_prompt} samples, "
          f"≤ {cfg.max_new_tokens} new tokens, {cfg.epochs} × {cfg.minibatches} optimizer steps an iteration; "
          f"mean completion {mean_len(lab_rl_r)} tokens (lab), {mean_len(trl_rl_r)} (TRL)")
    lines = []
    for row, target in zip(rows, (2, 5)):
        if isinstance(row["lab/TRL"], float):
            lines.append(f"{row['what']}: lab/TRL = {row['lab/TRL']:.2f} (target ≥ {target}) "
                         f"{'met' if row['lab/TRL'] >= target else 'NOT met'}")
    print("\n".join(lines))
    payload = {"benchmark": "preference", **env, "scale": scale, "task": TASK, "model": dataclasses.asdict(sft.model),
               "dpo": {"pairs_per_step": B, "pairs": len(pairs), "lab_row_tokens": pairs.rows().input_ids.shape[1],
                       "beta": beta, "lr": lr},
               "rl": dataclasses.asdict(cfg) | {"iterations": rl_iters}, "warmup": warmup, "rows": rows,
               "targets": lines}
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main(sys.argv[1:])
