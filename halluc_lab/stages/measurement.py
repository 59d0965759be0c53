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

The chapters' sentences that read these numbers are built here, so that a re-run with other seeds
rewrites them. Chapter 8: :func:`masking_said` (the completion-only and the full-sequence loss
before and after SFT), :func:`scheduled_loss_said` (the scheduled-sampling loss curves),
:func:`knowable_said` and :func:`carries_said` (where kb_walk's and arithmetic's errors sit by
answer length), :func:`recovery_said` (recovery after a forced error), :func:`path_star_said`
(which picture of Bachmann & Nagarajan's the path-star models show), :func:`backspace_headline`
(backspace SFT against clean SFT), :func:`cluster_bootstrap_said` (its exercise on
`<bksp>` precision). Chapter 9: :func:`toy_landing_said` (where the toy prompt's
methods land) and :func:`proxy_and_gold` (RLHF's proxy reward against the gold one). The verdict
clauses inside them are :func:`halluc_lab.evaluation.stats.said`'s.

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


def masking_said(moved: Mapping[str, tuple[float, float]]) -> str:
    """Chapter 8's reading of SFT's two losses on held-out examples: ``moved`` maps a task to how
    far fine-tuning lowered (completion-only loss, full-sequence loss). Where every task's
    full-sequence loss fell less (or rose), that is the case for completion-only masking;
    otherwise the tasks where it fell as much are named."""
    rose = [t for t, (_, whole) in moved.items() if whole < 0]
    if all(whole < only for only, whole in moved.values()):
        return ("In every task the full-sequence loss falls less than the completion loss"
                + (f", and for {', '.join(rose)} it rises" if rose else "")
                + ": the fine-tuned model stops modelling prompts. That is the case for masking: "
                "the prompt is context, not data to imitate.")
    return ("The full-sequence loss falls as much as the completion loss for "
            + ", ".join(t for t, (only, whole) in moved.items() if whole >= only) + ".")


LOOKUP_FORMED = 0.9  # a seed's model "has the look-up" when it gets this share of those steps right


def path_star_said(lookups: Sequence[float], firsts: Sequence[float], seeds: Sequence[int], *,
                   lookup: float, first: float, ends: tuple[float, float], chance: float,
                   em: float) -> str:
    """Chapter 8's reading of path-star under teacher forcing: each seed's accuracy on the look-up
    steps (``lookups``) and on the first step off the centre (``firsts``); over the ``seeds``, the
    mean accuracy on those steps (``lookup``, ``first``), on the start and the goal (``ends``),
    and the greedy exact match (``em``); ``chance`` is 1/degree. Which of Bachmann & Nagarajan's
    pictures the numbers show decides the sentence; every seed's values follow it."""
    if not lookups or len(lookups) != len(firsts) or len(lookups) != len(seeds):
        raise ValueError(f"lookups, firsts and seeds must be non-empty and of one length, got "
                         f"{len(lookups)}, {len(firsts)} and {len(seeds)}")
    formed = sum(x >= LOOKUP_FORMED for x in lookups)
    if min(lookups) >= LOOKUP_FORMED and abs(first - chance) <= 0.15:
        text = (f"This is the failure Bachmann & Nagarajan describe. Given the true path so far, "
                f"the clean models get the look-up steps right {lookup:.0%} of the time and the "
                f"first step {first:.0%}, near a coin flip ({chance:.0%}); their greedy exact "
                f"match is {em:.2f}. Teacher forcing never made them plan: the look-up scores "
                "every step after the first, so the loss gives no reason to work out the first "
                "one.")
    elif max(lookups) < LOOKUP_FORMED:
        text = (f"These models have not learned the look-up: given the true path so far they copy "
                f"the start and the goal from the query ({ends[0]:.0%} and {ends[1]:.0%} right), "
                f"but get the steps between right only {lookup:.0%} of the time and the first "
                f"step {first:.0%} (greedy exact match {em:.2f}). Bachmann & Nagarajan's picture "
                f"— every step after the first right, the first at {chance:.0%} — did not form.")
    elif min(lookups) >= LOOKUP_FORMED:
        text = (f"The look-up steps are right {lookup:.0%} of the time and the first step "
                f"{first:.0%}, well away from 1/degree = {chance:.0%} (greedy exact match "
                f"{em:.2f}).")
    else:
        text = (f"The look-up formed in {formed} of {len(seeds)} seeds, so the means above mix "
                f"models that have it with models that do not (greedy exact match {em:.2f} on "
                "average).")
    per_seed = (" Seed by seed (" + ", ".join(map(str, seeds)) + "), the clean model gets the "
                "look-up steps right " + ", ".join(f"{x:.0%}" for x in lookups)
                + " of the time, and the first step " + ", ".join(f"{x:.0%}" for x in firsts) + ".")
    return (text + f" The look-up (90% of its steps right or more) formed in {formed} of "
            f"{len(seeds)} seeds of the whole chain." + per_seed)


def scheduled_loss_said(rises: Mapping[str, float]) -> str:
    """Chapter 8's note on the scheduled-sampling loss curves: ``rises`` maps a task to how far its
    smoothed training loss ends above its lowest point (0.1: 10% above). A rise of more than 2%
    gets the caveat that the corruption's ramp alone can cause it; no curve, no note."""
    if not rises:
        return ""
    parts = [f"{t}: its smoothed loss ends {r:.0%} above its lowest point" if r > 0.02
             else f"{t}: its smoothed loss ends within 2% of its lowest point"
             for t, r in rises.items()]
    caveat = ("Such a rise can come from the corruption rate's ramp alone, without a model that "
              "got worse; the loss cannot tell the two apart, and the evaluation below scores "
              "every model on clean prompts.")
    return ("The scheduled-sampling curves, whose inputs are corrupted ever more often: "
            + "; ".join(parts) + ". " + (caveat if max(rises.values()) > 0.02 else ""))


def recovery_said(recovery: Mapping[tuple[str, str], float],
                  path_star: Sequence[float] | None = None) -> str:
    """Chapter 8's reading of recovery after a forced error: ``recovery`` maps (task, variant) to
    the share of answers that still end right (mean over the forced positions); ``path_star``, the
    path-star backspace model's share at positions 0, 1 and 2, where there is one. A model without
    `<bksp>` "never" ends right only when its share is exactly 0."""
    no_bksp = max(x for (_, v), x in recovery.items() if v != "backspace")
    never = ("never" if no_bksp == 0 else
             f"in at most {no_bksp:.0%} of the answers (mean over the positions)")
    text = (f"Without `<bksp>` a model ends right after a forced error {never}: it cannot take the "
            "token back. The backspace models end right in "
            + ", ".join(f"{x:.0%} ({t})" for (t, v), x in recovery.items() if v == "backspace")
            + ".")
    if path_star is not None:
        r0, r1, r2 = path_star
        text += (" On path-star the three positions differ. Position 0 is the start node, which "
                 "the query names, and the backspace model ends right after a wrong one "
                 f"{r0:.0%} of the time. Position 1 is the first step, and the forced token is the "
                 "other arm's first node, which a model that does not plan cannot tell from the "
                 f"right one: {r1:.0%}. Position 2 is the other arm's second node, which does not "
                 "follow the previous node in the edge list, so the look-up could notice it; "
                 f"greedily the model ends right {r2:.0%} of the time.")
    return text


def toy_landing_said(trained: Mapping[str, float], best_of_n: Sequence[float], ns: Sequence[int],
                     *, exact: float, limit: float, disagreements: int) -> str:
    """Chapter 9's reading of where the toy prompt's methods land: ``trained`` maps each trained
    method to its total-variation distance from π*; ``best_of_n`` is best-of-N's at each N of
    ``ns``; ``exact`` how close the methods come without finite samples (DPO's expected loss, the
    soft rule's exact picks at the largest N); ``limit`` best-of-N's distance as N → ∞;
    ``disagreements`` the toy part's disagreements with the documents."""
    if not trained or len(best_of_n) != len(ns) or not ns:
        raise ValueError(f"need trained methods and one best-of-N distance per N, got "
                         f"{len(trained)} methods, {len(best_of_n)} distances and {len(ns)} N")
    k = min(range(len(ns)), key=lambda i: best_of_n[i])  # the first N of the smallest distance
    closer = max(trained.values()) < best_of_n[k]
    return (f"DPO, RSFT with the soft rule and PPO end {min(trained.values()):.4f}–"
            f"{max(trained.values()):.4f} from $\\pi^*$ in total variation, "
            + ("each closer than best-of-$N$ comes at any $N$" if closer else
               "not all of them closer than best-of-$N$ at its best $N$")
            + f" (its closest: {best_of_n[k]:.3f} at $N$ = {ns[k]}). What is left between them and "
            "$\\pi^*$ comes from finite samples — of pairs, picks and rollouts: without it, DPO's "
            "expected loss and the soft rule's exact pick distribution come to within "
            f"{exact:.4f} of $\\pi^*$ (the soft rule's at $N$ = {ns[-1]}). Best-of-$N$'s distance "
            f"does not shrink with more samples; it tends to {limit:.3f}. This part's tables "
            f"disagree with the documents in {disagreements} place{'s' * (disagreements != 1)} "
            "(see the errata).")


def _two(xs: Sequence[float]) -> str:
    return ", ".join(f"{x:.2f}" for x in xs)


def knowable_said(known: Sequence[float], em_known: Sequence[float],
                  em_other: Sequence[float]) -> str:
    """Chapter 8's note on kb_walk's errors by answer length: by number of hops, the share of
    knowable held-out chains and the greedy exact match on them and on the others. Where the
    knowable chains are nearly always right (0.95 or more at every length), the fall with length
    is read as missing knowledge; otherwise as part missing knowledge, part compounding."""
    return ("**kb_walk.** Call a held-out chain *knowable* when every fact it looks up is a common "
            "fact (or a fact-less pair the model saw answered with `<abstain>` in training). By "
            f"number of hops, the share of knowable chains is {_two(known)}; greedy exact match is "
            f"{_two(em_known)} on the knowable chains and {_two(em_other)} on the others. "
            + ("On the chains it can know the model is nearly always right at every length, so "
               "the fall of accuracy with length is mostly missing knowledge — a longer chain is "
               "likelier to meet a rare fact or a pair never seen — rather than errors compounding."
               if min(em_known) >= 0.95 else
               "Even on the chains it can know, accuracy falls with length: part of the fall is "
               "missing knowledge (a longer chain is likelier to meet a rare fact or a pair never "
               "seen), part is errors compounding."))


def carries_said(shortest: int, longest: int, carries: tuple[float, float], share: float,
                 token_acc: Sequence[float]) -> str:
    """Chapter 8's note on arithmetic's errors by answer length: ``shortest`` single-digit sums in
    the held-out split, the ``longest`` sums' digits, the mean carries of the longest sums and of
    those one digit shorter, their ``share`` of the training examples, and the teacher-forced
    token accuracy by length. Errors "sit in the longest sums" when the longest's accuracy is more
    than 0.05 below every shorter length's."""
    concentrated = token_acc[-1] < min(token_acc[:-1]) - 0.05
    return (f"**arithmetic.** The shortest answers are single-digit sums: the held-out split has "
            f"only {shortest} of them (the others are train problems), and the evaluation set "
            f"holds all of them, so that point measures {shortest} problems. The longest sums "
            f"({longest} digits) carry {carries[0]:.1f} times on average against "
            f"{carries[1]:.1f} for {longest - 1}-digit sums, make up {share:.0%} of the training "
            "examples, and are written most significant digit first, so the model must settle "
            "every carry before it writes the first digit. Teacher-forced token accuracy by "
            f"length is {_two(token_acc)}: "
            + ("the errors sit in the longest sums rather than spreading evenly over tokens."
               if concentrated else
               "this model errs at every length, not only in the longest sums."))


def cluster_bootstrap_said(erasures: int, wrong_erased: int, answers_erasing: int, answers: int,
                           library: float, wilson: Interval, cluster: Sequence[float]) -> str:
    """Chapter 8's exercise on `<bksp>` precision: ``wrong_erased`` of ``erasures`` took back a
    wrong token, in ``answers_erasing`` of ``answers`` answers (``library``: what
    ``evaluate.backspace_use`` says); the Wilson interval against the cluster bootstrap's over
    answers. The cluster interval more than 5% wider says the erasures of one answer go together;
    within 5% says no sign of it; narrower, that they are alike less often than independent ones."""
    if erasures < 1:
        raise ValueError(f"erasures must be at least 1 (there is no precision without one), got "
                         f"{erasures}")
    wide = (cluster[1] - cluster[0]) / (wilson.high - wilson.low)
    text = (f"{erasures} erasures in {answers_erasing} of {answers} answers; precision "
            f"{wrong_erased / erasures:.3f} (`backspace_use` says {library:.3f}). Wilson: "
            f"[{wilson.low:.3f}, {wilson.high:.3f}]; cluster bootstrap over answers: "
            f"[{cluster[0]:.3f}, {cluster[1]:.3f}], {wide:.2f} times as wide. ")
    if wide > 1.05:
        return text + ("Resampling answers widens the interval: the erasures of one answer go "
                       "together, and the Wilson interval counts them as more evidence than they "
                       "are.")
    if wide >= 0.95:
        return text + (f"Here the two widths are within 5% of each other: at "
                       f"{erasures / answers_erasing:.1f} erasures per answer that erases, this "
                       "run shows no sign that the erasures of one answer go together.")
    return text + ("Here the cluster interval is the narrower one: within an answer the erasures "
                   "are alike less often than independent ones would be.")
