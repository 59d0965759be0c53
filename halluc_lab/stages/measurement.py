"""Measuring post-trained models against the model they are compared with, and the sentences that
report the comparison.

Chapters 8 and 9. Every method of chapter 9 (DPO, RSFT, PPO on the verifier or on a learned reward)
is measured the same way on a fixed set of distinct held-out prompts (:func:`measure`): the greedy
answer's outcome, and over N answers at τ = 1 — samples of the policy itself, the distribution the
KL-regularised objective is about — the shares of correct, abstained and wrong answers, the
gold reward (+1 / 0 / −1), the KL to the reference estimated by Σ_t log π(y_t|·)/π_ref(y_t|·)
averaged over the samples (an unbiased estimate of the sequence-level KL), and, where there is
one, a learned reward model's score of the same answers. :func:`implicit_reward_accuracy` asks
whether DPO's implicit reward β log π/π_ref ranks gold pairs the right way round.

The chapters' summary sentences are built here from the numbers, so that a re-run with other seeds
rewrites them: :func:`backspace_headline` (chapter 8: backspace SFT against clean SFT) and
:func:`proxy_and_gold` (chapter 9: RLHF's proxy reward against the gold one). The verdict clauses
inside them are :func:`halluc_lab.evaluation.stats.said`'s.

Kept out of the stage modules on purpose: nothing here changes a trained model's bits, so no
recipe's cache key covers it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from halluc_lab.evaluation.evaluate import CORRECT, WRONG, free_run, model_device, score_answers
from halluc_lab.evaluation.stats import Interval
from halluc_lab.model.tokenizer import Tokenizer
from halluc_lab.stages import reward_model
from halluc_lab.stages.preference import pair_logps, sample_groups
from halluc_lab.tasks.base import Example, Task
from halluc_lab.training.data import Batch, rollout_batch
from halluc_lab.training.losses import sequence_logprobs

CHUNK = 512  # rows per forward pass


@torch.no_grad()
def completion_logps(model: nn.Module, prompts: Sequence[Sequence[int]],
                     completions: Sequence[Sequence[int]], pad_id: int,
                     chunk: int = CHUNK) -> torch.Tensor:
    """``(N,)`` float32 on the CPU: Σ_t log π(y_t | x, y_<t) of each completion given its prompt,
    ``chunk`` rows a forward pass on the model's device."""
    if len(prompts) != len(completions) or not prompts:
        raise ValueError(f"prompts and completions must be non-empty and of one length, got "
                         f"{len(prompts)} and {len(completions)}")
    device = model_device(model)
    out = []
    for i in range(0, len(prompts), chunk):
        b = rollout_batch(prompts[i:i + chunk], completions[i:i + chunk], pad_id).to(device)
        out.append(sequence_logprobs(model(b.input_ids), b.labels).float().cpu())
    return torch.cat(out)


def measure(policy: nn.Module, reference: nn.Module, tok: Tokenizer, task: Task,
            examples: Sequence[Example], samples: int, *, seed: int,
            proxy: reward_model.RewardModel | None = None) -> dict[str, list[float]]:
    """One policy on held-out ``examples``, per prompt in their order: "greedy correct" and "greedy
    wrong" (1.0 or 0.0), and over ``samples`` answers at τ = 1 (drawn under ``seed``) the shares
    "correct", "abstained" and "wrong", the "gold reward" (their mean verifier reward) and the "KL"
    to ``reference`` (the mean of Σ_t log π/π_ref); with a ``proxy`` reward model, first its mean
    score of the same answers, "proxy reward"."""
    greedy = score_answers(task, [e.prompt for e in examples], free_run(policy, tok, examples))
    g = sample_groups(policy, tok, task, examples, samples, seed=seed)
    flat_p = [list(p) for p in g.prompts for _ in range(samples)]
    flat_c = [list(c) for cs in g.completions for c in cs]
    pad = tok.pad_id
    kl = (completion_logps(policy, flat_p, flat_c, pad)
          - completion_logps(reference, flat_p, flat_c, pad)).view(-1, samples)  # (P, samples)
    r = g.rewards  # (prompts, samples)
    out = {}
    if proxy is not None:
        proxy_scores = reward_model.score(proxy, flat_p, flat_c, pad).view(-1, samples)
        out["proxy reward"] = proxy_scores.mean(1).tolist()
    return out | {"greedy correct": greedy.indicator(CORRECT),
                  "greedy wrong": greedy.indicator(WRONG),
                  "correct": (r == 1).float().mean(1).tolist(),
                  "abstained": (r == 0).float().mean(1).tolist(),
                  "wrong": (r == -1).float().mean(1).tolist(), "gold reward": r.mean(1).tolist(),
                  "KL": kl.mean(1).tolist()}


def implicit_reward_accuracy(policy: nn.Module, reference: nn.Module, pairs: Batch) -> float:
    """Share of the pair rows (chosen, rejected) whose implicit reward β log π/π_ref ranks the
    chosen answer strictly higher (β > 0 leaves the order alone); a tie counts as wrong."""
    rows = pairs.to(model_device(policy))
    with torch.no_grad():
        d = pair_logps(policy, rows) - pair_logps(reference, rows)  # (P, 2) log π/π_ref
    return float((d[:, 0] > d[:, 1]).float().mean())


# -- the chapters' summary sentences ---------------------------------------------------------------
def backspace_headline(tasks: Sequence[str], diff: Mapping[tuple, Interval],
                       verdicts: Mapping[tuple, str], controls: Mapping[str, str]) -> str:
    """Chapter 8's headline on backspace SFT: ``diff`` and ``verdicts`` are keyed (task, variant,
    baseline, score) with scores "em_greedy" and "em_sample"; ``tasks`` those with a backspace
    model; ``controls`` maps a task to its matched-compute control where it has one. Where every
    task's two intervals against clean SFT lie below zero it says so in one sentence; otherwise
    each task's two verdicts; then each verdict against a matched-compute control."""
    ems = ("em_greedy", "em_sample")
    lowered = [t for t in tasks if all(diff[(t, "backspace", "clean", n)].high < 0 for n in ems)]
    if tasks and lowered == list(tasks):
        text = ("Backspace SFT lowered exact match on every task it was tried on ("
                + ", ".join(tasks) + "), greedy and at τ = 1: the intervals of the paired "
                "differences against clean SFT lie below zero.")
    else:
        text = "Backspace SFT against clean SFT: " + "; ".join(
            f"{t}: " + ", ".join(verdicts[(t, "backspace", "clean", n)] for n in ems)
            for t in tasks) + "."
    for t in tasks:
        if t in controls:
            text += (f" {t} against its matched-compute control: "
                     + ", ".join(verdicts[(t, "backspace", controls[t], n)] for n in ems) + ".")
    return text


def proxy_and_gold(proxy: Interval, gold: Interval, verdicts: tuple[str, str],
                   abstained: tuple[float, float], kl: float) -> str:
    """Chapter 9's summary line on RLHF's two rewards: the verdicts on the proxy and on the gold
    reward against SFT (``verdicts``), the share of abstentions before and after (``abstained``)
    and the KL reached; where the proxy rose and the gold reward did not, that the reward model's
    optimum is not the verifier's."""
    text = (f"* RLHF's proxy and the gold reward: {verdicts[0]}; {verdicts[1]}; its share of "
            f"abstentions went from {abstained[0]:.3f} to {abstained[1]:.3f}, "
            f"at a KL of {kl:.2f} nats.")
    if proxy.low > 0 and gold.low <= 0:
        text += " The reward model's optimum is not the verifier's."
    return text
