"""RLVR: one iteration (rollouts + update) of the lab's GRPO against TRL's GRPOTrainer, one run.

Both sides start from the same weights (the lab's model, converted with ``hf_convert`` to
``LlamaForCausalLM``), learn from the same prompts and are paid by the same reward. The weights have the
shape of the ``kb_walk-sft-clean`` recipe (``--scale full``: 4 layers × 256; ``smoke``: 2 × 64; every
kb_walk recipe of a scale shares it) and are random: the timing does not depend on training. The prompts
are those the ``kb_walk-rlvr-bksp`` recipe stage learns from (``preference_examples`` with its seed); the
rounds are its ``RLVRConfig``'s (``full``: 64 prompts × G = 8 samples = 512 rollouts; ``smoke``: 16 × 8),
the rate its (constant), and so is the reward: the kb_walk verifier with abstention,
:class:`halluc_lab.stages.reward_model.VerifierReward` with λ = 3 on token ids (+1 right, 0 abstained, −3 wrong,
judged on the text the ``<bksp>`` tokens leave). bf16 autocast on CUDA for both sides, fp32 on the CPU.

The same iteration on both sides: G samples of each prompt at temperature 1 (no top-k, no top-p), at most
the prompts' answer budget (:func:`halluc_lab.evaluation.evaluate.answer_budget`) new tokens, a row stopping at
``<eos>``; advantages A = (r − mean of the group) / std of the group (the sample std, Bessel's n − 1, on
both sides; the lab adds 1e-6, TRL 1e-4); then ONE optimizer step on the whole batch (AdamW β = (0.9,
0.999), no weight decay, clipping 1.0) of GRPO's loss, −min(ρA, clip(ρ, 1 − ε, 1 + ε)A) per token, ε = 0.2,
averaged over each completion's own tokens and then over the completions (Shao et al. 2024), β = 0 (no KL
term: the RLVR recipes' setting and TRL's default).

- *lab*: :func:`halluc_lab.stages.rlvr.rlvr` with :class:`~halluc_lab.training.rlvr_losses.GRPO` (which normalises per sequence
  that way: :func:`halluc_lab.training.rlvr_losses.grpo_loss`), ``context="keep"``, ``allow_bksp=True``, deterministic
  kernels and ``autocast_dtype``, as the recipe stage runs it. Rollouts come from the backspace controller
  (:func:`halluc_lab.generation.backtrack.rollout`: one prefill per prompt copied to its G rows, a sampled ``<bksp>``
  taking back the last token inside the decode step, a CUDA graph of that step on CUDA, and of the prefill
  once its batch shape has come twice); the update is eager.
  On CUDA it is timed three times: as the recipe stage runs it; with ``fused_decode=True`` (the decode step
  compiled by ``torch.compile`` before its graph is captured: fewer kernels); and with ``captured_update=True``
  as well (each optimizer step, the policy's forward and backward passes, clipping and AdamW, one CUDA graph
  on rows of a fixed width). Both options give other low bits, so they are not the settings the book's
  chapters train with; the first iteration, a warm-up, compiles and captures.
  With one minibatch π_old is the step's own log-probs, detached (no extra forward), but the round still
  scores the reference once (no gradient): the KL to it is measured every round, β = 0 or not.
- *TRL*: ``GRPOTrainer`` with ``loss_type="grpo"`` (TRL's default is ``"dapo"``, a token-level average over
  the batch; ``"grpo"`` is the per-sequence average above), ``scale_rewards="group"`` (its default: the
  group's std, as the lab's ``GRPO().scale_advantages``), ``beta=0.0`` (so it loads no reference model),
  ``epsilon=0.2``, ``num_generations=G``, ``per_device_train_batch_size`` = all P × G completions,
  ``steps_per_generation=1``, ``gradient_accumulation_steps=1``, ``num_iterations=1`` (one step per
  generation batch, so it skips the π_old forward pass too), ``max_completion_length`` = the answer budget,
  ``temperature=1.0``, ``top_p=1.0``, ``top_k=0``. Changed from TRL's defaults so it is not slowed by what
  the lab does not do: ``gradient_checkpointing=False`` (TRL's default is True); logging, saving and
  progress bars off; otherwise as ``preference.py``'s ``trl_common`` (constant rate, no warm-up, fused AdamW
  on CUDA). It generates with transformers' ``generate`` (dynamic cache, no vLLM), each prompt repeated G
  times (G prefills), and its kernels are left non-deterministic (its default). ``<bksp>`` is an ordinary
  token to TRL, and stays in the context, as ``context="keep"`` leaves it in the lab's: the same weights
  sample from the same distributions on both sides; the lab's controller only keeps the book of what a
  ``<bksp>`` erases. TRL hands a reward function the completions as text decoded with
  ``skip_special_tokens=True``, which drops ``<abstain>`` and ``<bksp>`` and would change the verdict, so
  the reward function takes the ``completion_ids`` TRL also passes, as the lab's does (prompts: TRL's
  tokenizer adds the ``<bos>``, checked before the run).

An iteration's time: between consecutive calls of the reward function (one per rollout batch: the update
of one iteration and the rollouts of the next); the median after the warm-up. ``--clock free`` (the default)
stamps each call as it comes. Each side waits for its device at least once an iteration on its own (to read
its rollouts), so the host never runs more than an iteration ahead, and the gaps are the iterations of the
loop as it runs. ``--clock synced`` synchronises the device before each stamp, as runs 1–15 of the results
page did; that wait is itself part of what is timed, and it costs the lab more than TRL. With the update
captured, the lab queues the reference's scoring of the rollouts before it calls the reward, so that the
device scores while the host judges; a synchronised stamp makes the host wait for the scoring first.
For the lab the rollouts alone are also timed on one round's batch (the fastest of a few calls): as in the
iteration, and, with no stop token (every row emits the whole budget, as ``decode.py`` counts), against
the engine's greedy :func:`halluc_lab.generation.engine.generate` on the same rows.

On a CPU shared with other work the figures swing by several times from run to run (every small op waits
for its slowest thread); ``--threads 1`` steadies them.

Targets (the issue): lab ≥ 10× TRL's RL iteration; rollouts with ``<bksp>`` sampled at ≥ 0.9× the engine's
greedy tokens/s at batch ≥ 64. Timings are never asserted.

TRL is not a dependency of the project (nor of CI): install it beside the environment, naming with
``--no-deps`` what the environment lacks (else pip puts a second torch into the target), e.g. on the
project's CPU environment::

    pip install --no-deps --target /tmp/trlsite trl==1.16.0 accelerate==1.15.0 datasets==5.0.0 \\
        dill==0.4.1 multiprocess==0.70.19 pandas pyarrow xxhash
    PYTHONPATH=/tmp/trlsite python benchmarks/rlvr.py --device cpu --scale smoke --out _build/bench/rlvr_cpu.json

On the GPU machine (torch 2.11, transformers 5.17, accelerate, pandas, pyarrow, xxhash present; no
network) the wheels kept in ``.whl-trl/`` (trl, datasets, dill, multiprocess; git-ignored locally)
install with::

    pip install -q --no-index --no-deps --target /tmp/site .whl-trl/*.whl && export PYTHONPATH=/tmp/site:$PWD
    python benchmarks/rlvr.py --out _build/bench/rlvr.json      # CUDA: full scale
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import sys
import tempfile
import warnings

import torch

from common import attempt, best_time, environment, ratio, setup, write_json
from halluc_lab import recipes
from halluc_lab.generation.backtrack import rollout
from halluc_lab.device import deterministic
from halluc_lab.generation.engine import generate
from halluc_lab.generation.sampling import GREEDY
from halluc_lab.evaluation.evaluate import answer_budget
from halluc_lab.model.hf_convert import save_pretrained
from halluc_lab.model.transformer import Transformer
from halluc_lab.stages.preference import preference_examples
from halluc_lab.stages.reward_model import VerifierReward
from halluc_lab.stages.rlvr import RLVRConfig, rlvr
from halluc_lab.training.rlvr_losses import GRPO
from halluc_lab.tasks import make_task
from preference import TASK, Clock, print_markdown, quiet_train, trl_common

RECIPE = f"{TASK}-rlvr-bksp"


def ticking(verifier: VerifierReward, clock: Clock, lengths: list[int], tok=None):
    """The reward function of either side: the clock ticks at each call (an iteration's boundary), the
    completions' lengths are kept. The lab passes token ids; TRL (``tok`` given) prompt texts, which get
    their ``<bos>`` back, and ``completion_ids`` by name (its decoded ``completions`` would lack the
    special tokens)."""

    def kb_walk_verifier(prompts, completion_ids, **kw):
        clock.tick()
        lengths.extend(len(c) for c in completion_ids)
        ids = prompts if tok is None else [[tok.bos_id, *tok.encode(p)] for p in prompts]
        return verifier(ids, [list(c) for c in completion_ids])

    return kb_walk_verifier


def summary(clock: Clock, lengths: list[int], warmup: int, cfg: RLVRConfig) -> dict:
    """The clock's summary and the mean completion length, once each call is seen to have scored one
    iteration's whole batch (P × G completions): else the side would time other work."""
    batch = cfg.prompts_per_iteration * cfg.samples_per_prompt
    if len(lengths) != batch * len(clock.stamps):
        raise RuntimeError(f"{len(lengths)} completions over {len(clock.stamps)} reward calls, not {batch} a call")
    return clock.summary(warmup, mean_completion=sum(lengths) / len(lengths), reward_calls=len(clock.stamps))


# -- the lab ------------------------------------------------------------------------------------------
def lab_rl(model, tok, verifier, prompts: list[tuple[int, ...]], cfg: RLVRConfig, device, dtype, warmup: int,
           iterations: int, synced: bool) -> dict:
    """Time per iteration of the lab's RLVR with GRPO (between reward calls; ``synced``: the device synchronised
    at each), with the mean completion length."""
    policy = copy.deepcopy(model).to(device).train()
    reference = copy.deepcopy(policy).eval().requires_grad_(False)
    clock, lengths, before = Clock(device, synced), [], dynamo_counts()
    with deterministic():  # as the recipe stage runs it
        rlvr(policy, reference, prompts, ticking(verifier, clock, lengths),
             dataclasses.replace(cfg, iterations=warmup + iterations + 1), GRPO(), tok=tok, seed=0,
             autocast_dtype=dtype)
    after = dynamo_counts()
    return summary(clock, lengths, warmup, cfg) | {
        "dynamo": {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}}


def dynamo_counts() -> dict[str, int]:
    """torch.compile's counters (graphs compiled, frames, graph breaks, ...) as flat numbers: a fused arm's
    record shows whether its step compiled, and how often."""
    from torch._dynamo.utils import counters

    return {f"{group}.{name}": n for group, values in counters.items() for name, n in values.items()
            if isinstance(n, int)}


def lab_rollouts(model, tok, prompts: list[tuple[int, ...]], cfg: RLVRConfig, device, dtype,
                 repeats: int) -> list[dict]:
    """One round's rollouts alone (as the iteration draws them, then the whole budget in every row) and the
    engine's greedy generation of the same rows: the fastest of ``repeats`` calls each; on CUDA also with the
    fused decode step."""
    model = copy.deepcopy(model).to(device).eval()
    batch, G, M = prompts[:cfg.prompts_per_iteration], cfg.samples_per_prompt, cfg.max_new_tokens
    generator = torch.Generator(device).manual_seed(0)

    def draws_of(fused: bool, label: str) -> dict:
        return {
            f"rollout{label} (as in the iteration)": lambda: rollout(
                model, batch, M, bksp_id=tok.bksp_id, context=cfg.context, allow_bksp=cfg.allow_bksp,
                stop_tokens=(tok.eos_id,), generator=generator, dtype=dtype, n_samples=G, fused=fused),
            f"rollout{label}, whole budget": lambda: rollout(
                model, batch, M, bksp_id=tok.bksp_id, context=cfg.context, allow_bksp=cfg.allow_bksp,
                generator=generator, dtype=dtype, n_samples=G, fused=fused),
            f"greedy generate{label}, whole budget": lambda: generate(
                model, batch, M, sampling=GREEDY, dtype=dtype, n_samples=G, fused=fused)}

    draws = draws_of(False, "") | (draws_of(True, ", fused") if device.type == "cuda" else {})
    rows = []
    with deterministic():
        for what, draw in draws.items():
            seconds = best_time(draw, device, repeats)
            tokens = int(draw().lengths.sum())  # one more draw: what a call emits (the same budget, other samples)
            rows.append({"what": what, "rows": len(batch) * G, "ms": 1000 * seconds, "tokens": tokens,
                         "tok/s": tokens / seconds})
    return rows


def lab_arms(cfg: RLVRConfig, device) -> dict[str, RLVRConfig]:
    """The lab's settings to time, by the suffix of their row: as the recipe runs, and on CUDA with the decode
    step fused (``fused_decode``: compiled before its graph is captured), then with the update captured as well
    (``captured_update``: each optimizer step one CUDA graph)."""
    if device.type != "cuda":
        return {"": cfg}
    return {"": cfg, ", fused decode": dataclasses.replace(cfg, fused_decode=True),
            ", fused decode + captured update": dataclasses.replace(cfg, fused_decode=True, captured_update=True)}


# -- TRL ----------------------------------------------------------------------------------------------
def trl_rl(trl, hf_dir: str, tok, verifier, prompts: list[str], cfg: RLVRConfig, device, warmup: int,
           iterations: int, synced: bool) -> dict:
    """Time per iteration of TRL's GRPOTrainer (between reward calls; ``synced``: the device synchronised at
    each), with the mean completion length."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    hf_tok = tok.to_hf()
    for p in prompts[:64]:  # TRL tokenises the prompt texts itself: the ids must be the lab's
        if hf_tok(text=p)["input_ids"] != [tok.bos_id, *tok.encode(p)]:
            raise RuntimeError(f"TRL's tokenizer reads {p!r} as {hf_tok(text=p)['input_ids']}, not as the lab's ids")
    clock, lengths = Clock(device, synced), []
    batch = cfg.prompts_per_iteration * cfg.samples_per_prompt // cfg.minibatches  # completions an optimizer step
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    with tempfile.TemporaryDirectory() as out:
        args = trl.GRPOConfig(**trl_common(
            out, device, per_device_train_batch_size=batch,
            gradient_accumulation_steps=1, steps_per_generation=cfg.minibatches, num_iterations=1,
            num_generations=cfg.samples_per_prompt, max_completion_length=cfg.max_new_tokens, temperature=1.0,
            top_p=1.0, top_k=0, learning_rate=cfg.lr, adam_beta1=0.9, adam_beta2=0.999, max_grad_norm=cfg.grad_clip,
            beta=cfg.beta, epsilon=GRPO().clip, loss_type="grpo", scale_rewards="group",
            max_steps=(warmup + iterations + 1) * cfg.minibatches))
        trainer = trl.GRPOTrainer(model=model, reward_funcs=ticking(verifier, clock, lengths, tok=tok), args=args,
                                  train_dataset=Dataset.from_dict({"prompt": prompts}), processing_class=hf_tok)
        quiet_train(trainer)
    return summary(clock, lengths, warmup, cfg)


def import_trl():
    """TRL, datasets and transformers, imported with nothing to download and no progress bars, notices or
    warnings about the settings chosen here."""
    for key in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TQDM_DISABLE", "HALLUC_BATCH"):  # read on import
        os.environ.setdefault(key, "1")
    try:
        import datasets
        import transformers
        import trl
    except ImportError:
        sys.exit("benchmarks/rlvr.py needs TRL 1.16 (with accelerate and datasets), which is not a dependency of "
                 "the project: install it beside the environment as the script's docstring says")
    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    return trl, datasets


# -- the run ------------------------------------------------------------------------------------------
OPTIONS = {  # flags: argparse's keywords
    ("--device",): {"default": "auto", "help": "auto (cuda if available), cpu or cuda"},
    ("--scale",): {"default": "auto", "choices": ["auto", "smoke", "full"],
                  "help": "the kb_walk recipes' shape and rounds; auto: full on CUDA, smoke elsewhere"},
    ("--iterations",): {"type": int, "default": 0, "help": "timed iterations per side (0: 6, 4 at smoke scale)"},
    ("--warmup",): {"type": int, "default": 0, "help": "untimed iterations first (0: 3, 2 at smoke scale)"},
    ("--quick",): {"action": "store_true", "help": "1 warm-up and 2 timed iterations: a smoke check"},
    ("--clock",): {"default": "free", "choices": ["free", "synced"],
                  "help": "free: stamp each reward call as it comes; synced: synchronise the device first (runs 1-15)"},
    ("--threads",): {"type": int, "default": 0, "help": "torch CPU threads (0 = torch's default)"},
    ("--out", "--json"): {"dest": "json", "default": "", "help": "also write the results to this JSON file"},
}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flags, options in OPTIONS.items():
        p.add_argument(*flags, **options)
    args = p.parse_args(argv)
    if min(args.iterations, args.warmup) < 0:
        p.error("--iterations and --warmup must not be negative (0: the default)")
    trl, datasets = import_trl()
    device, dtype = setup(args)
    scale = args.scale if args.scale != "auto" else ("full" if device.type == "cuda" else "smoke")
    warmup, iterations = (1, 2) if args.quick else (args.warmup or (2 if scale == "smoke" else 3),
                                                     args.iterations or (4 if scale == "smoke" else 6))

    shape, rl = recipes.get(f"{TASK}-sft-clean", scale), recipes.get(RECIPE, scale)
    task = make_task(rl.task)
    tok = task.tokenizer()
    examples = preference_examples(task, rl.stage.n_prompts, seed=rl.seed)  # the recipe stage's prompts
    cfg = dataclasses.replace(rl.stage.config, lr=rl.train.lr, max_new_tokens=answer_budget(examples))
    verifier = VerifierReward(task, tok, rl.stage.lam, rl.stage.bksp_cost)
    torch.manual_seed(0)
    model = Transformer(shape.model, seed=0)  # random weights: the timing does not depend on training
    ids = [(tok.bos_id, *tok.encode(e.prompt)) for e in examples]

    with tempfile.TemporaryDirectory() as hf_dir:  # the same weights for TRL, as a Hugging Face folder
        save_pretrained(model, hf_dir, bos_token_id=tok.bos_id, eos_token_id=tok.eos_id, pad_token_id=tok.pad_id)
        synced = args.clock == "synced"
        labs = {what: attempt(lambda: lab_rl(model, tok, verifier, ids, arm, device, dtype, warmup, iterations,
                                             synced), name=f"lab {what}")
                for what, arm in lab_arms(cfg, device).items()}
        peer = attempt(lambda: trl_rl(trl, hf_dir, tok, verifier, [e.prompt for e in examples], cfg, device, warmup,
                                      iterations, synced), name="TRL GRPO")
    repeats = max(5, iterations)
    draws = attempt(lambda: lab_rollouts(model, tok, ids, cfg, device, dtype, repeats), name="lab rollouts")

    env = {**environment(device), "trl": trl.__version__, "datasets": datasets.__version__}
    get = lambda r, k: r[k] if isinstance(r, dict) else r  # a failed side's entry is its error
    rows = [{"what": f"RL iteration{what}", "lab ms": get(lab, "ms"), "TRL ms": get(peer, "ms"),
             "lab /s": get(lab, "per_s"), "TRL /s": get(peer, "per_s"),
             "lab/TRL": ratio(get(peer, "ms"), get(lab, "ms")), "timed": get(lab, "n"), "lab": lab, "trl": peer}
            for what, lab in labs.items()]
    lab = labs[""]
    N = cfg.prompts_per_iteration * cfg.samples_per_prompt
    precision = "fp32" if dtype == torch.float32 else "bf16 autocast"
    print_markdown(f"{RECIPE} {scale} ({shape.model.n_layers} × {shape.model.hidden_size}), {precision}, median ms "
                   f"per iteration after {warmup} warm-up, clock {args.clock} — {env['device']}, torch {env['torch']}, "
                   f"transformers {env['transformers']}, trl {env['trl']}, {env['date']}",
                   rows, ["what", "lab ms", "TRL ms", "lab /s", "TRL /s", "lab/TRL", "timed"])
    mean_len = lambda r: f"{r['mean_completion']:.1f}" if isinstance(r, dict) else "n/a"
    print(f"\n{cfg.prompts_per_iteration} prompts × {cfg.samples_per_prompt} samples = {N} rollouts, ≤ "
          f"{cfg.max_new_tokens} new tokens, one GRPO step an iteration; mean completion {mean_len(lab)} tokens "
          f"(lab), {mean_len(peer)} (TRL)")
    lines = []
    for row in rows:
        if isinstance(row["lab/TRL"], float):
            lines.append(f"{row['what']}: lab/TRL = {row['lab/TRL']:.2f} (target ≥ 10) "
                         f"{'met' if row['lab/TRL'] >= 10 else 'NOT met'}")
    if isinstance(draws, list):
        for d in draws:  # of the iteration that draws them: fused rollouts of the fused arm's
            arm = labs.get(", fused decode + captured update") if ", fused" in d["what"] else lab
            d["share of iteration"] = ratio(d["ms"], get(arm, "ms"))
        print_markdown(f"the lab's rollouts alone, one round's {N} rows (the fastest of {repeats} calls)",
                       draws, ["what", "rows", "ms", "tokens", "tok/s", "share of iteration"])
        if isinstance(lab, dict):  # measured apart: on a busy CPU the share can even pass 1
            print(f"\nthe lab's rollouts alone take {draws[0]['ms'] / lab['ms']:.0%} of its iteration; the rest: "
                  f"scoring the rollouts with the reference and the policy, the reward, the update")
        for k in range(0, len(draws), 3):  # each kind of step: its whole-budget rollouts against its greedy ones
            speed = ratio(draws[k + 1]["tok/s"], draws[k + 2]["tok/s"])
            if isinstance(speed, float):
                lines.append(f"{draws[k + 1]['what']} / {draws[k + 2]['what']}, tokens/s at batch {N} = {speed:.3f} "
                             f"(target ≥ 0.9 at batch ≥ 64) {'met' if speed >= 0.9 else 'NOT met'}")
    print("\n" + "\n".join(lines))
    payload = {"benchmark": "rlvr", **env, "scale": scale, "task": TASK, "recipe": RECIPE,
               "model": dataclasses.asdict(shape.model), "rlvr": dataclasses.asdict(cfg) | {"iterations": iterations},
               "lam": rl.stage.lam, "warmup": warmup, "clock": args.clock, "rows": rows, "rollouts": draws,
               "targets": lines}
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main(sys.argv[1:])
