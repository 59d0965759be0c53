"""Abstaining below a confidence threshold: the baseline a take-back must beat.

A model that can take a token back hallucinates less only if it beats the plainest way of saying
less: answer greedily, and say ``<abstain>`` instead whenever the model's own probability of its
answer is below a threshold t (selective prediction: Chow 1970; Geifman & El-Yaniv 2017). Raising
t trades correct answers for fewer wrong ones; under the penalised score C − λW
(:func:`~halluc_lab.evaluation.scoring.lam_for_target`) an answer pays when P(correct) > λ/(1 + λ),
so a calibrated model would pick t near that.

* :func:`greedy_with_confidence` runs the model: each greedy answer and its probability under the
  model, the product of its tokens' probabilities (at temperature 1, ``<eos>`` included).
* :func:`abstain_below` scores the answers with those below t replaced by ``<abstain>``, by the
  task's own verifier (a leading ``<abstain>`` is an abstention, never a right answer).
* :func:`best_threshold` picks t on answers the evaluation shares nothing with (the learning
  part), maximising the mean of C − λW; the evaluation then applies that t unchanged. Picking it on
  the evaluated prompts themselves would flatter the baseline. :func:`best_cut` is its sweep, on
  rewards already known (chapter 10's fair test reads them from cached records).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from halluc_lab.evaluation.evaluate import _eval_mode, answer_budget
from halluc_lab.evaluation.scoring import AnswerScores, score_answers
from halluc_lab.generation.engine import generate
from halluc_lab.generation.sampling import GREEDY
from halluc_lab.model.tokenizer import ABSTAIN, Tokenizer
from halluc_lab.tasks.base import Example, Task


@torch.no_grad()
def greedy_with_confidence(model: torch.nn.Module, tok: Tokenizer, examples: Sequence[Example],
                           dtype: torch.dtype | None = None) -> tuple[list[str], list[float]]:
    """Each example's greedy answer (stopped at ``<eos>``, :func:`answer_budget` tokens at most) and
    its probability under the model: exp(Σ log π(token | context)) over the answer's tokens."""
    if not examples:
        raise ValueError("examples must hold at least one Example")
    with _eval_mode(model):
        ids = [[tok.bos_id, *tok.encode(e.prompt)] for e in examples]
        res = generate(model, ids, answer_budget(examples), sampling=GREEDY,
                       stop_tokens=(tok.eos_id,), dtype=dtype)
    texts = [tok.decode(t) for t in res.token_lists()]
    confidence = res.logprobs.sum(dim=1).exp().tolist()  # logprobs are 0 past each row's end
    return texts, confidence


def _check(prompts: Sequence[str], completions: Sequence[str], confidence: Sequence[float]) -> None:
    if not len(prompts) == len(completions) == len(confidence):
        raise ValueError(f"prompts, completions and confidence must have one length, got "
                         f"{len(prompts)}, {len(completions)} and {len(confidence)}")
    bad = [c for c in confidence if not (isinstance(c, (int, float)) and 0.0 <= c <= 1.0)]
    if bad:
        raise ValueError(f"confidence must be probabilities in [0, 1], got {bad[:3]}")


def abstain_below(task: Task, prompts: Sequence[str], completions: Sequence[str],
                  confidence: Sequence[float], t: float) -> AnswerScores:
    """The answers scored by the task's verifier, each whose confidence is below ``t`` replaced by
    ``<abstain>`` (``t`` = 0: every answer stands; ``t`` > 1: none does)."""
    _check(prompts, completions, confidence)
    if isinstance(t, bool) or not isinstance(t, (int, float)) or math.isnan(t) or t < 0:
        raise ValueError(f"t must be a number >= 0, got {t!r}")
    said = [c if p >= t else ABSTAIN for c, p in zip(completions, confidence)]
    return score_answers(task, list(prompts), said)


def best_threshold(task: Task, prompts: Sequence[str], completions: Sequence[str],
                   confidence: Sequence[float], lam: float) -> float:
    """The threshold whose :func:`abstain_below` has the highest mean C − λW on these answers (the
    lowest such t on a tie: abstain no more than it pays): each answer judged twice, as said and
    as ``<abstain>``, then :func:`best_cut`."""
    _check(prompts, completions, confidence)
    said = score_answers(task, list(prompts), list(completions)).rewards(lam)
    withheld = score_answers(task, list(prompts), [ABSTAIN] * len(prompts)).rewards(lam)
    return best_cut(said, withheld, confidence)


def best_cut(said: Sequence[float], withheld: Sequence[float],
             confidence: Sequence[float]) -> float:
    """The threshold t maximising Σ (withheld where confidence < t, else said): each answer's
    reward as said and as an abstention, and its confidence. Candidates are 0 and each answer's
    own confidence, the only places the sum can change, swept in order; the lowest on a tie.

    >>> best_cut([1.0, -3.0, 1.0], [0.0, 0.0, 0.0], [0.9, 0.2, 0.5])
    0.5
    """
    if not len(said) == len(withheld) == len(confidence):
        raise ValueError(f"said, withheld and confidence must have one length, got {len(said)}, "
                         f"{len(withheld)} and {len(confidence)}")
    order = sorted(range(len(said)), key=lambda i: confidence[i])
    total, best, best_t, k = float(sum(said)), None, 0.0, 0
    for t in sorted({0.0, *map(float, confidence)}):
        while k < len(order) and confidence[order[k]] < t:  # these now abstain
            total += withheld[order[k]] - said[order[k]]
            k += 1
        if best is None or total > best + 1e-12:
            best, best_t = total, t
    return best_t
