"""Chapter 10's fair test, measured: what each trained arm contributes, computed once per model.

The fair test (:mod:`halluc_lab.tasks.dead_ends`; its arms in the recipe registry) compares 8 seeds
× 7 worlds × up to five trained models, each read several ways. :class:`DeadEndsMeasure` measures
one trained model on fixed, distinct held-out graphs and returns plain data, a *record*;
:func:`halluc_lab.recipes.measured` caches it beside the model, so the records can be computed
where the chains train (one process per chain, on the GPU) and read back without a model. Every
comparison of the chapter is a function of the records:

* **greedy**, with ``<bksp>`` allowed and masked (the same weights): per graph the outcome
  (:data:`RIGHT` 1, :data:`ABSTAIN` 0, :data:`WRONG` −1, so C − λW is a sum), the tokens the answer
  spent (``<eos>`` included), whether it erased, whether its first step was right;
* **samples** at τ = 1, ``samples`` per graph, with their outcomes, tokens and the check the model
  could run on its own answer (:meth:`DeadEnds.reaches_goal`): :func:`best_of_n` picks N so that
  the N samples spend another arm's tokens per answer, as ``evaluate.best_of_n_matched`` does;
* the greedy answer's **probability** under the model, on the evaluation graphs and on a disjoint
  *learning part*: :func:`threshold_abstention` picks t on the learning part
  (``abstention.best_cut``) and abstains below it on the evaluation graphs;
* **teacher forced**, the first step and the look-ups after it: does the look-up form?
* the training history's per-round series (RLVR's reward and ``<bksp>`` rate).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from halluc_lab.evaluation.abstention import best_cut, greedy_with_confidence
from halluc_lab.evaluation.evaluate import (answer_budget, complete, distinct_examples,
                                            model_device, teacher_forced)
from halluc_lab.evaluation.scoring import (ABSTAINED, CORRECT, answer_tokens, erasures,
                                           score_answers)
from halluc_lab.generation.sampling import SamplingParams
from halluc_lab.tasks.base import check_count, completion_symbols, make_task

RIGHT, ABSTAIN, WRONG = 1, 0, -1  # outcome codes: C − λW of a code c is c where c ≥ 0, else −λ
_CODE = {CORRECT: RIGHT, ABSTAINED: ABSTAIN}


@dataclass(frozen=True)
class DeadEndsMeasure:
    """Measure one trained dead_ends model (a :class:`~halluc_lab.recipes.cache.Trained`): the
    record the module docstring lists. The graphs are the task's held-out split, distinct, drawn
    from ``graph_seed`` (the same graphs for every arm and seed of a world: the contrasts pair them
    graph by graph) outside the task's learning part (:meth:`Task.learning_part`, from which RL
    draws its prompts), and the learning part is ``n_learn`` graphs inside it: they pick the
    abstention threshold, as the pre-registration says, and nothing is evaluated on them."""

    n_eval: int = 1000
    n_learn: int = 500
    samples: int = 4  # τ = 1 samples per graph, for best-of-N
    graph_seed: int = 10_000

    def __post_init__(self):
        for name in ("n_eval", "n_learn", "samples"):
            check_count(name, getattr(self, name), 1)
        check_count("graph_seed", self.graph_seed, 0)

    def graphs(self, task) -> tuple[list, list]:
        """(evaluation graphs, learning part): distinct held-out examples outside and inside the
        task's learning part, in the order drawn. Drawn once per process for a task's config (a
        chapter measures every arm and seed of a world on the same graphs)."""
        evaluation, learning = _graphs(self, task.config)
        return list(evaluation), list(learning)

    @torch.no_grad()
    def __call__(self, trained) -> dict:
        model, tok, task = trained.model, trained.tokenizer, trained.task
        evaluation, learning = self.graphs(task)
        budget = answer_budget(evaluation)
        prompts = [e.prompt for e in evaluation]
        greedy, confidence = greedy_with_confidence(model, tok, evaluation)
        learn_said, learn_confidence = greedy_with_confidence(model, tok, learning)
        masked = complete(model, tok, prompts, budget, allow_bksp=False)
        g = torch.Generator(model_device(model)).manual_seed(self.graph_seed + trained.recipe.seed)
        drawn = complete(model, tok, [p for p in prompts for _ in range(self.samples)], budget,
                         sampling=SamplingParams(temperature=1.0), generator=g)
        tf = teacher_forced(model, tok, evaluation)  # a row: centre, first node, look-ups, <eos>
        looked = [x for row in tf.correct for x in row[2:-1]]
        k = self.samples
        return {
            "greedy": _answers(task, evaluation, greedy),
            "masked": _answers(task, evaluation, masked),
            "confidence": confidence,
            "learning": {"outcome": codes(task, [e.prompt for e in learning], learn_said),
                         "confidence": learn_confidence},
            "samples": {"outcome": [codes(task, prompts, drawn[j::k]) for j in range(k)],
                        "tokens": [[answer_tokens(a) for a in drawn[j::k]] for j in range(k)],
                        "check": [[task.reaches_goal(p, a) for p, a in zip(prompts, drawn[j::k])]
                                  for j in range(k)]},
            "teacher_forced": {"first": float(np.mean([row[1] for row in tf.correct])),
                               "look_ups": float(np.mean(looked)) if looked else float("nan")},
            "history": dict(trained.history.metrics),
        }


@lru_cache(maxsize=None)
def _graphs(measure: DeadEndsMeasure, config) -> tuple[tuple, tuple]:
    """:meth:`DeadEndsMeasure.graphs` drawn once per process for a measure and a task's config (a
    config's type names its task), as tuples of immutable examples."""
    task = make_task(config)
    drawn = distinct_examples(task, "heldout", 3 * (measure.n_eval + measure.n_learn),
                              seed=measure.graph_seed)
    evaluation = [e for e in drawn if not task.learning_part(e.prompt)][:measure.n_eval]
    learning = [e for e in drawn if task.learning_part(e.prompt)][:measure.n_learn]
    if len(evaluation) < measure.n_eval or len(learning) < measure.n_learn:
        raise ValueError(f"the task's held-out split gave {len(evaluation)} graphs to evaluate "
                         f"and {len(learning)} in the learning part, fewer than n_eval = "
                         f"{measure.n_eval} and n_learn = {measure.n_learn}")
    return tuple(evaluation), tuple(learning)


def codes(task, prompts: Sequence[str], answers: Sequence[str]) -> list[int]:
    """Each answer's outcome code by the task's verifier: 1 right, 0 abstained, −1 wrong."""
    return [_CODE.get(o, WRONG) for o in score_answers(task, list(prompts), list(answers)).outcomes]


def _answers(task, examples, answers: Sequence[str]) -> dict:
    """Outcome, tokens, erased and first-step-right of each answer (the first step read from the
    answer as written after its erasures)."""
    golds = [e.completion.split() for e in examples]
    firsts = [completion_symbols(a)[1:2] == g[1:2] for a, g in zip(answers, golds)]
    return {"outcome": codes(task, [e.prompt for e in examples], answers),
            "tokens": [answer_tokens(a) for a in answers],
            "erased": [bool(erasures(e.completion, a)) for e, a in zip(examples, answers)],
            "first": firsts}


# -- reading records -------------------------------------------------------------------------------
def score(outcome, lam: float) -> np.ndarray:
    """C − λW per answer from outcome codes (any shape): +1, 0, −λ."""
    o = np.asarray(outcome, dtype=float)
    return np.where(o < 0, -float(lam), o)


def grid(records: Sequence[Mapping], read) -> np.ndarray:
    """(seeds, graphs) float array: ``read(record)`` of each seed's record, in order."""
    rows = [np.asarray(read(r), dtype=float) for r in records]
    if not rows or len({r.shape for r in rows}) != 1:
        raise ValueError(f"records must be non-empty and measured on the same graphs, got "
                         f"shapes {[r.shape for r in rows]}")
    return np.stack(rows)


@dataclass(frozen=True)
class BestOf:
    """Best-of-N read from a record's samples: N, and per graph the picked answer's outcome code
    and the tokens all N samples spent."""

    n: int
    outcome: np.ndarray
    tokens: np.ndarray


def best_of_n(record: Mapping, target_tokens: float) -> BestOf:
    """Best-of-N from ``record``'s τ = 1 samples: N = round(target / a sample's mean tokens),
    1 to the samples drawn, the first of a graph's N samples that passes the model's own check
    picked (else its first), every one of the N counted as spent."""
    s = record["samples"]
    tokens = np.asarray(s["tokens"], dtype=float)  # (samples, graphs)
    if not (np.isfinite(target_tokens) and target_tokens > 0):
        raise ValueError(f"target_tokens must be a finite number > 0, got {target_tokens!r}")
    n = int(min(len(tokens), max(1, round(target_tokens / tokens.mean()))))
    check, outcome = np.asarray(s["check"][:n], dtype=bool), np.asarray(s["outcome"][:n])
    pick = np.where(check.any(0), check.argmax(0), 0)
    return BestOf(n, outcome[pick, np.arange(outcome.shape[1])], tokens[:n].sum(0))


def threshold_abstention(record: Mapping, lam: float) -> tuple[float, np.ndarray]:
    """``(t, outcome codes)``: t chosen on the learning part to maximise C − λW
    (:func:`halluc_lab.evaluation.abstention.best_cut`), then every greedy answer of the evaluation
    graphs whose probability is below t replaced by an abstention."""
    learn = record["learning"]
    said = score(learn["outcome"], lam)
    t = best_cut(said, np.zeros_like(said), learn["confidence"])
    outcome = np.asarray(record["greedy"]["outcome"])
    return t, np.where(np.asarray(record["confidence"]) < t, ABSTAIN, outcome)
