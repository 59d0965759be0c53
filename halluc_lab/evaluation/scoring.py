"""Judging answers against the task's verifier: correct, wrong or abstained; Ross & Bagnell's
mistakes; what ``<bksp>`` took back. Pure functions of the text: no model is run here.

Chapters 7–12 score every model's answers this way (ARCHITECTURE.md §8), and the RL rewards of
chapters 9–10 use the same +1 / 0 / −λ. Each answer is correct, wrong or abstained; the
hallucination rate is the share of wrong answers; the penalised score C − λW with λ = t/(1 − t)
rewards answering only when P(correct) > t (Kalai et al. 2025, "Why language models hallucinate").
:func:`mistakes` counts Ross & Bagnell's cost (000 §7.2); :func:`backspace_use` counts what
``<bksp>`` took back (000 §7.3). :mod:`halluc_lab.evaluation.evaluate`, which runs the models, re-exports
these names.

What a task means by "right" is always the task's own verifier: :meth:`Task.reward` (exact match
with :meth:`Task.gold` after ``<bksp>`` erasures), :meth:`Task.claims` and
:meth:`Task.abstention_warranted`; nothing here branches on which task it is.

Departures and choices:

- An answer counts as abstained when it says ``<abstain>``, is not the gold answer, and everything
  it said before ``<abstain>`` agrees with the gold answer (:meth:`Task.reward` scores it so). An
  answer that states a wrong step and then abstains has hallucinated that step: it is wrong. Where
  the gold answer itself abstains (a knowledge-base chain through a fact-less pair), saying exactly
  it is correct; abstaining earlier on such a chain is an abstention.
- The hallucination rate is the share of wrong answers among *all* answers (ARCHITECTURE.md §8), not
  among those that did not abstain.
- :func:`backspace_use` judges a written token right or wrong when it is written (is the answer so
  far, with it, a start of the gold answer?), so a token after a wrong one is wrong too, and a
  ``<bksp>`` that removes it removed a wrong token.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from halluc_lab.tasks.base import ABSTAINED, SUPPORTED, Task
from halluc_lab.model.tokenizer import BKSP, BOS, EOS, PAD

CORRECT, WRONG = "correct", "wrong"  # answer outcomes, with ABSTAINED ("abstained") of the claim statuses
OUTCOMES = (CORRECT, WRONG, ABSTAINED)

__all__ = ["CORRECT", "WRONG", "ABSTAINED", "OUTCOMES", "lam_for_target", "AnswerScores", "score_answers", "mistakes",
           "mistakes_after_first", "erasures", "BackspaceUse", "backspace_use", "written_tokens",
           "answer_tokens", "pick_first", "oracle_check"]


# -- answer outcomes with an abstain option (ARCHITECTURE.md §8) --------------------------------------------
def lam_for_target(t: float) -> float:
    """The penalty λ = t / (1 − t) for a wrong answer that makes answering pay only when
    P(correct) > t: p − λ(1 − p) > 0 exactly when p > t.

    >>> lam_for_target(0.5), lam_for_target(0.75)
    (1.0, 3.0)
    """
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0.0 <= t < 1.0:
        raise ValueError(f"t must be a confidence target in [0, 1), got {t!r}")
    return t / (1.0 - t)


def _check_lam(lam: float) -> None:
    if isinstance(lam, bool) or not isinstance(lam, (int, float)) or not (math.isfinite(lam) and lam >= 0):
        raise ValueError(f"lam must be a finite number >= 0 (the penalty of a wrong answer), got {lam!r}")


@dataclass(frozen=True)
class AnswerScores:
    """The outcome of each answer — :data:`CORRECT`, :data:`WRONG` or :data:`ABSTAINED` — in prompt
    order, so two models scored on the same prompts can be paired answer by answer."""

    prompts: tuple[str, ...]  # the prompts, in order
    outcomes: tuple[str, ...]  # one outcome per prompt

    def __post_init__(self):
        if len(self.prompts) != len(self.outcomes) or not self.outcomes:
            raise ValueError(f"prompts and outcomes must be non-empty and of one length, got "
                             f"{len(self.prompts)} and {len(self.outcomes)}")
        if bad := set(self.outcomes) - set(OUTCOMES):
            raise ValueError(f"outcomes must be in {OUTCOMES}, got {sorted(bad)}")

    @property
    def n(self) -> int:
        return len(self.outcomes)

    def count(self, outcome: str) -> int:
        """How many answers have this outcome."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, got {outcome!r}")
        return self.outcomes.count(outcome)

    def indicator(self, outcome: str) -> list[float]:
        """Per answer, in prompt order: 1.0 where it has this outcome, else 0.0 (what
        :func:`halluc_lab.evaluation.stats.bootstrap_mean` and ``paired_difference`` take)."""
        self.count(outcome)  # checks the name
        return [float(o == outcome) for o in self.outcomes]

    correct_rate = property(lambda self: self.count(CORRECT) / self.n, doc="Share of correct answers.")
    wrong_rate = property(lambda self: self.count(WRONG) / self.n, doc="Share of wrong answers.")
    abstain_rate = property(lambda self: self.count(ABSTAINED) / self.n, doc="Share of abstentions.")
    hallucination_rate = property(lambda self: self.wrong_rate,
                                  doc="Share of wrong answers among all answers (ARCHITECTURE.md §8).")

    def rewards(self, lam: float) -> tuple[float, ...]:
        """Per answer: +1 correct, 0 abstained, −λ wrong (the RL reward of the same scoring)."""
        _check_lam(lam)
        value = {CORRECT: 1.0, ABSTAINED: 0.0, WRONG: -float(lam)}
        return tuple(value[o] for o in self.outcomes)

    def penalised_score(self, lam: float) -> float:
        """(C − λW) / n: the mean of :meth:`rewards`."""
        _check_lam(lam)
        return self.correct_rate - lam * self.wrong_rate


def score_answers(task: Task, prompts: Sequence[str], completions: Sequence[str]) -> AnswerScores:
    """Score each completion with the task's verifier: correct when it says exactly the gold answer
    (after ``<bksp>`` erasures; a gold answer that abstains included), abstained when it says
    ``<abstain>`` after nothing but a start of the gold answer, else wrong.

    >>> from halluc_lab.tasks import Arithmetic
    >>> s = score_answers(Arithmetic(), ["1 + 1 ="] * 3, ["2", "3", "<abstain>"])
    >>> s.outcomes, s.penalised_score(lam_for_target(0.5))
    (('correct', 'wrong', 'abstained'), 0.0)
    """
    if len(prompts) != len(completions):
        raise ValueError(f"prompts and completions must have the same length, got {len(prompts)} "
                         f"and {len(completions)}")
    if len(prompts) == 0:
        raise ValueError("prompts must hold at least one prompt")
    # The task's own reward with three distinct values: RL rewards and these outcomes cannot drift apart.
    marks = task.reward(prompts, completions, correct_reward=1.0, abstain_reward=0.0, wrong_reward=-1.0)
    name = {1.0: CORRECT, 0.0: ABSTAINED, -1.0: WRONG}
    return AnswerScores(tuple(prompts), tuple(name[m] for m in marks))


# -- best-of-N: one answer picked from N samples ----------------------------------------------
def answer_tokens(completion: str) -> int:
    """Tokens an answer used as the model wrote it: every symbol up to its ``<eos>``, which counts,
    take-backs included; padding and a leading ``<bos>`` do not.

    >>> answer_tokens("0 3 <bksp> 4 <eos> <pad>")
    5
    """
    n = 0
    for p in completion.split():
        if p in (PAD, BOS):
            continue
        n += 1
        if p == EOS:
            break
    return n


def pick_first(prompts: Sequence[str], groups: Sequence[Sequence[str]],
               check: Callable[[str, str], bool]) -> list[str]:
    """Per prompt, the first of its samples that passes ``check(prompt, completion)``, else its
    first sample: best-of-N selection by a check (the task's own, which a model could run on its
    output, or the verifier's, an upper bound: :func:`oracle_check`).

    >>> pick_first(["p", "q"], [["a", "b"], ["c", "d"]], lambda p, c: c in "bx")
    ['b', 'c']
    """
    if len(prompts) != len(groups) or any(len(g) == 0 for g in groups):
        raise ValueError(f"groups must hold one non-empty list of samples per prompt, got "
                         f"{len(groups)} groups for {len(prompts)} prompts")
    return [next((c for c in g if check(p, c)), g[0]) for p, g in zip(prompts, groups)]


def oracle_check(task: Task) -> Callable[[str, str], bool]:
    """The verifier as a best-of-N check: whether a completion is exactly the gold answer (an upper
    bound, as no model can run it on its own output)."""
    return lambda prompt, completion: task.reward([prompt], [completion])[0] == 1.0


# -- mistakes: Ross & Bagnell's cost (000 §7.2) --------------------------------------------------
def mistakes(task: Task, prompts: Sequence[str], completions: Sequence[str]) -> list[int]:
    """Ross & Bagnell's cost of each answer (000 §7.2): the steps where it does what the expert would
    not do *in the state the answer itself reached*, plus the gold steps it never wrote.

    A step is one of the task's claims; it costs 1 unless the world supports it, or it abstains where
    the task says abstaining is warranted there (:meth:`Task.abstention_warranted`).
    """
    if len(prompts) != len(completions):
        raise ValueError(f"prompts and completions must have the same length, got {len(prompts)} "
                         f"and {len(completions)}")
    out = []
    for p, c in zip(prompts, completions):
        said = task.claims(p, c)
        bad = sum(not (x.status == SUPPORTED or (x.status == ABSTAINED and task.abstention_warranted(p, c, x)))
                  for x in said)
        out.append(bad + max(0, len(task.claims(p, task.gold(p))) - len(said)))
    return out


def mistakes_after_first(task: Task, prompts: Sequence[str], completions: Sequence[str]) -> list[int]:
    """Per answer, the :func:`mistakes` after its first one (0 for an answer with none): what an
    error costs downstream, the cost scheduled sampling (002) and backtracking (000 §7.3) promise to cut."""
    return [max(m - 1, 0) for m in mistakes(task, prompts, completions)]


# -- what <bksp> takes back (000 §7.3) -----------------------------------------------------------------
def _walk(gold: str, completion: str) -> tuple[list[bool], list[list[bool]], list[str]]:
    """One answer read token by token: per erasure, whether the token it removed was wrong; per written
    token, [wrong when written, erased later]; and the symbols the answer finally says."""
    want, said, erased = gold.split(), [], []  # said: (symbol, its [wrong, erased] record) per kept token
    records: list[list[bool]] = []
    for w in completion.split():
        if w == EOS:
            break
        if w == BKSP:
            if said:  # a <bksp> at an empty answer removes nothing
                _, rec = said.pop()
                rec[1] = True
                erased.append(rec[0])
        elif w not in (PAD, BOS):
            rec = [[x for x, _ in said] + [w] != want[:len(said) + 1], False]
            records.append(rec)
            said.append((w, rec))
    return erased, records, [x for x, _ in said]


def erasures(gold: str, completion: str) -> list[bool]:
    """For each ``<bksp>`` that erases something: True if it took back a right symbol (the text
    before the erasure, the erased symbol included, was a prefix of the gold completion).

    >>> erasures("4 6", "4 7 <bksp> 6 <bksp> 6 <eos>")
    [False, True]
    """
    return [not wrong for wrong in _walk(gold, completion)[0]]


@dataclass(frozen=True)
class BackspaceUse:
    """What ``<bksp>`` took back in a set of answers, judged against their gold answers (000 §7.3).

    A written token (a symbol other than ``<bksp>``, before ``<eos>``) is *wrong* when, at the point it
    was written, the answer so far (after the erasures before it) with the token appended is not a start
    of the gold answer; so a token written after a wrong one is wrong too. An *erasure* is a ``<bksp>``
    that removed a token (one at an empty answer removes nothing and is not counted).

    - precision = erasures that removed a wrong token / erasures: how often an erasure was warranted;
    - recall = wrong tokens that a later ``<bksp>`` removed / wrong tokens written: how many mistakes
      were taken back.

    Both are None where their denominator is 0 (no erasure; no wrong token).
    """

    answers: int  # answers read
    wrong: int  # tokens that were wrong when written
    wrong_erased: int  # of those, removed by a later <bksp>
    erasures: int  # <bksp> tokens that removed a token
    erased_wrong: int  # of those, the ones that removed a wrong token
    answers_erasing: int  # answers with at least one erasure
    right_after_erasure: int  # answers with at least one erasure that end with exactly the gold answer

    precision = property(lambda self: self.erased_wrong / self.erasures if self.erasures else None,
                         doc="Share of erasures that removed a wrong token (None without erasures).")
    recall = property(lambda self: self.wrong_erased / self.wrong if self.wrong else None,
                      doc="Share of wrong tokens that were erased (None without wrong tokens).")
    erasing_rate = property(lambda self: self.answers_erasing / self.answers,
                            doc="Share of answers that erased at least one token.")
    right_after_erasure_rate = property(lambda self: self.right_after_erasure / self.answers,
                                        doc="Share of all answers that erased a token and still end right.")


def backspace_use(golds: Sequence[str], completions: Sequence[str]) -> BackspaceUse:
    """Count what the completions' ``<bksp>`` tokens took back (:class:`BackspaceUse` defines the terms).

    >>> u = backspace_use(["4 6", "4 6"], ["4 7 <bksp> 6 <eos>", "4 <bksp> 5 6 <eos>"])
    >>> u.precision, u.recall, u.right_after_erasure_rate
    (0.5, 0.3333333333333333, 0.5)
    """
    if len(golds) != len(completions) or not golds:
        raise ValueError(f"golds and completions must be non-empty and of one length, got {len(golds)} "
                         f"and {len(completions)}")
    wrong = wrong_erased = n_erasures = erased_wrong = erasing = right = 0
    for g, c in zip(golds, completions):
        erased, records, final = _walk(g, c)
        wrong += sum(w for w, _ in records)
        wrong_erased += sum(w and e for w, e in records)
        n_erasures += len(erased)
        erased_wrong += sum(erased)
        erasing += bool(erased)
        right += bool(erased) and final == g.split()
    return BackspaceUse(len(golds), wrong, wrong_erased, n_erasures, erased_wrong, erasing, right)


def written_tokens(completions: Sequence[str]) -> int:
    """How many tokens the completions wrote: every symbol before ``<eos>`` but ``<bksp>`` and
    ``<pad>``, erased ones included (the base against which :class:`BackspaceUse`'s wrong tokens are
    a rate).

    >>> written_tokens(["4 7 <bksp> 6 <eos> 9", "5"])
    4
    """
    if isinstance(completions, str):
        raise TypeError("completions must be a sequence of completion strings, not one string")
    total = 0
    for c in completions:
        words = c.split()
        words = words[:words.index(EOS)] if EOS in words else words
        total += sum(w not in (BKSP, PAD) for w in words)
    return total
