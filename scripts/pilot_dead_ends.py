"""Size chapter 10's fair test before it runs: does the clean look-up form on dead_ends, and how
long does a recipe take?

Pre-trains the registry's ``dead_ends_*-pretrain`` recipes (clean, and with ``--retry`` the retry
corpora too) under one seed, every variant asked for at once (one process per recipe on a GPU,
``recipes.prefetch``), and scores distinct held-out graphs:

* teacher forced: the first step (the one decision, which arm; near 1/degree without search), the
  look-ups after it (each node the child of the one before) and the whole answer. The fair test
  needs look-ups of at least 0.9 in the clean arms, so that taking a token back is not confounded
  with learning the look-up;
* free running, greedy: exact match, with ``<bksp>`` allowed and masked, the share of answers that
  erase, and the mean tokens per answer; for the clean arms best-of-N at τ = 1, N matched to the
  retry arm's tokens, selected by the task's own check (last node = goal) and by the verifier.

Each ``--variant`` is ``key=value`` pairs (``nodes``, ``length``, ``steps``, ``lr``, ``batch``, and
``retry=1`` for the retry corpora too); the registry's sizes when none is given. Seconds per recipe
are each recipe's training wall time while all of them ran at once.

    python scripts/pilot_dead_ends.py --scale full --seed 0 --variant retry=1
    python scripts/pilot_dead_ends.py --variant nodes=16,steps=3000 --variant nodes=20,steps=3000
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from halluc_lab import recipes  # noqa: E402
from halluc_lab.device import setup  # noqa: E402
from halluc_lab.evaluation.evaluate import (best_of_n_matched, complete, distinct_examples,  # noqa: E402
                                 teacher_forced)
from halluc_lab.evaluation.scoring import score_answers  # noqa: E402

CLEAN = ("dead_ends_k1", "dead_ends_k2", "dead_ends_k4", "dead_ends_never")
RETRY = ("dead_ends_k1_retry", "dead_ends_k2_retry", "dead_ends_k4_retry")
KEYS = {"nodes": int, "length": int, "steps": int, "lr": float, "batch": int, "retry": int}


def parse_variant(text: str) -> dict:
    """``nodes=16,steps=3000`` as a dict of the known keys, their values typed."""
    out = {}
    for part in filter(None, text.split(",")):
        k, _, v = part.partition("=")
        if k not in KEYS:
            raise ValueError(f"variant keys must be among {tuple(KEYS)}, got {k!r}")
        out[k] = KEYS[k](v)
    return out


def variant(name: str, scale: str, seed: int, change: dict):
    """The registry's pre-training recipe of ``name`` under ``seed``, changed as ``change`` asks."""
    r = recipes.get(f"{name}-pretrain", scale)
    world = dataclasses.replace(r.task, **{f: change[k] for k, f in (("nodes", "n_nodes"),
                                                                     ("length", "length"))
                                           if k in change})
    steps = change.get("steps", r.train.steps)
    train = dataclasses.replace(r.train, steps=steps, lr=change.get("lr", r.train.lr),
                                warmup_steps=min(100, steps // 10),
                                checkpoint_every=max(1, min(1000, steps // 4)))
    if change:
        tag = "".join(f"-{k}{v:g}" if isinstance(v, float) else f"-{k}{v}"
                      for k, v in sorted(change.items()))
        r = dataclasses.replace(
            r, name=r.name + tag, task=world, train=train,
            batch_size=change.get("batch", r.batch_size),
            model=dataclasses.replace(
                r.model, vocab_size=recipes.make_task(world).tokenizer().vocab_size))
    return recipes.with_seed(r, seed)


def tokens(completion: str) -> int:
    """Tokens an answer used, its ``<eos>`` included."""
    words = completion.split()
    return words.index("<eos>") + 1 if "<eos>" in words else len(words)


def score(trained, n_eval: int, seed: int, budget: int) -> dict:
    """Teacher-forced first step, look-ups and whole answer; greedy exact match with <bksp> allowed
    and masked, the share of answers that erase and the tokens per answer."""
    task, tok, model = trained.task, trained.tokenizer, trained.model
    examples = distinct_examples(task, "heldout", n_eval, seed=10_000 + seed)
    prompts = [e.prompt for e in examples]
    tf = teacher_forced(model, tok, examples)
    first = [row[1] for row in tf.correct]  # row: centre, first node, the nodes after it, <eos>
    lookups = [x for row in tf.correct for x in row[2:-1]]
    out = {"examples": len(examples), "tf first": sum(first) / len(first),
           "tf look-up": sum(lookups) / max(len(lookups), 1),
           "tf whole": sum(tf.all_correct) / len(examples)}
    for label, allow in (("greedy", True), ("masked", False)):
        answers = complete(model, tok, prompts, budget, allow_bksp=allow)
        s = score_answers(task, prompts, answers)
        out[f"{label} EM"] = s.count("correct") / s.n
        out[f"{label} tokens"] = sum(map(tokens, answers)) / len(answers)
        out[f"{label} erase"] = sum("<bksp>" in a.split() for a in answers) / len(answers)
    return out


def best_of(trained, n_eval: int, seed: int, budget: int, target_tokens: float) -> dict:
    """Best-of-N at τ = 1, N matched to ``target_tokens`` per answer, picked by the task's own check
    and by the verifier (an upper bound)."""
    task, tok, model = trained.task, trained.tokenizer, trained.model
    examples = distinct_examples(task, "heldout", n_eval, seed=10_000 + seed)
    g = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    res = best_of_n_matched(model, tok, task, [e.prompt for e in examples], budget,
                            target_tokens=target_tokens, check=task.reaches_goal, generator=g)
    return {"best-of N": res.n, "best-of tokens": res.tokens_per_answer,
            "best-of self EM": res.self_checked.count("correct") / res.self_checked.n,
            "best-of oracle EM": res.oracle.count("correct") / res.oracle.n}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", default="full", choices=["smoke", "full"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--variant", action="append", default=[], help="key=value,... (repeatable)")
    p.add_argument("--best-of", action="store_true", help="best-of-N for the clean arms")
    p.add_argument("--n-eval", type=int, default=1000)
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    if args.seed < 0 or args.n_eval < 1:
        p.error("--seed must be >= 0 and --n-eval >= 1")
    changes = [parse_variant(v) for v in args.variant] or [{}]
    rt = setup(scale=args.scale, seed=args.seed, verbose=False)
    sizes = [{k: v for k, v in c.items() if k != "retry"} for c in changes]
    chains = [(name, c, variant(name, args.scale, args.seed, size))
              for c, size in zip(changes, sizes)
              for name in CLEAN + (RETRY if c.get("retry") else ())]
    device = torch.cuda.get_device_name(rt.device) if rt.device.type == "cuda" else rt.device.type
    print(f"dead_ends pre-training, seed {args.seed}, {args.scale}, {device}, "
          f"{len(chains)} recipes at once", flush=True)
    start = time.perf_counter()
    recipes.prefetch([r for _, _, r in chains], rt.device, rt.dtype)
    seconds = time.perf_counter() - start
    print(f"{seconds:.0f} s to train {len(chains)} recipes at once", flush=True)
    rows = []
    for name, change, r in chains:
        trained = recipes.load(r, rt)
        budget = 2 * (r.task.length + 1) + 2 * r.task.length + 2  # a whole detour and the answer
        row = {"world": name, **change, "nodes": r.task.n_nodes, "length": r.task.length,
               "steps": r.train.steps, "seconds": trained.seconds,
               **score(trained, args.n_eval, args.seed, budget)}
        rows.append(row)
        print("  ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                        for k, v in row.items()), flush=True)
        write(args.json, device, seconds, rows)
    if args.best_of:
        for row, (name, change, r) in zip(rows, chains):
            twin = next((x for x in rows if x["world"] == name + "_retry"
                         and all(x.get(k) == v for k, v in change.items() if k != "retry")), None)
            if twin is None:
                continue
            trained = recipes.load(r, rt)
            budget = 2 * (r.task.length + 1) + 2 * r.task.length + 2
            row.update(best_of(trained, args.n_eval, args.seed, budget, twin["greedy tokens"]))
            print(name, change, {k: v for k, v in row.items() if k.startswith("best-of")},
                  flush=True)
            write(args.json, device, seconds, rows)
    return 0


def write(path: str, device: str, seconds: float, rows: list[dict]) -> None:
    """The results so far as JSON (each row as it is scored: a run cut off keeps what it had)."""
    if path:
        out = {"device": device, "seconds": seconds, "rows": rows}
        Path(path).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    sys.exit(main())
