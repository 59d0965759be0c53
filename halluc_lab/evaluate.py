"""Evaluating a model: free running against teacher forcing, forced errors, and answers scored
with an abstain option.

Chapters 7–8 measure their models with it, and every later chapter that compares models
(9–11) does too. Sources: 000 §7.1 (exposure bias: teacher forcing against free running),
§7.2 (compounding errors; :func:`mistakes` counts Ross & Bagnell's cost), §7.3 (backtracking:
:func:`forced_error`, :func:`erasures`); 002 ("Training vs. Generation"). Answer scoring is
ARCHITECTURE.md §8: each answer is correct, wrong or abstained; the penalised score C − λW with
λ = t/(1 − t) rewards answering only when P(correct) > t (Kalai et al. 2025, "Why language models
hallucinate").

What a task means by "right" is always the task's own verifier: :meth:`Task.reward` (exact match
with :meth:`Task.gold` after ``<bksp>`` erasures), :meth:`Task.claims` and
:meth:`Task.abstention_warranted`. Nothing here branches on which task it is (:func:`fact_recall`
probes a knowledge base and takes a :class:`~halluc_lab.tasks.kb_walk.KBWalk`).

Departures and choices:

- An answer counts as abstained when it says ``<abstain>``, is not the gold answer, and everything
  it said before ``<abstain>`` agrees with the gold answer (:meth:`Task.reward` scores it so). An
  answer that states a wrong step and then abstains has hallucinated that step: it is wrong. Where
  the gold answer itself abstains (a knowledge-base chain through a fact-less pair), saying exactly
  it is correct; abstaining earlier on such a chain is an abstention.
- The hallucination rate is the share of wrong answers among *all* answers (ARCHITECTURE.md §8), not
  among those that did not abstain.
- :func:`forced_error` forces the error through the engine (the tokens before it are forced too, all
  marked as not sampled), so the model continues from a cache exactly as in free running.
"""

from __future__ import annotations

import contextlib
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from halluc_lab.data import IGNORE, Encoded, encode_example, pad
from halluc_lab.engine import SamplingParams, engine_for, generate
from halluc_lab.losses import causal_lm_loss
from halluc_lab.tasks.base import ABSTAINED, SUPPORTED, Example, Task
from halluc_lab.tasks.kb_walk import KBWalk
from halluc_lab.tokenizer import BKSP, EOS, Tokenizer

CORRECT, WRONG = "correct", "wrong"  # answer outcomes, with ABSTAINED ("abstained") of the claim statuses
OUTCOMES = (CORRECT, WRONG, ABSTAINED)
CHUNK = 512  # rows per forward pass or engine batch


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


@contextlib.contextmanager
def _eval_mode(model: torch.nn.Module):
    """The model in eval mode for the block, then back in the mode it was in."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _check_examples(examples: Sequence[Example]) -> None:
    if len(examples) == 0:
        raise ValueError("examples must hold at least one Example")


def answer_budget(examples: Sequence[Example]) -> int:
    """Tokens a free-running answer may use: twice the longest gold completion plus 4, room for a
    ``w <bksp>`` detour before every symbol and the ``<eos>``."""
    _check_examples(examples)
    return 2 * max(len(e.completion.split()) for e in examples) + 4


# -- free running (000 §7.1) -----------------------------------------------------------------------
def complete(model: torch.nn.Module, tok: Tokenizer, prompts: Sequence[str], max_new_tokens: int, *,
             greedy: bool = True, temperature: float = 1.0, generator: torch.Generator | None = None,
             dtype: torch.dtype | None = None, chunk: int = CHUNK) -> list[str]:
    """Free-running completions of ``<bos> prompt`` through :func:`halluc_lab.engine.generate`,
    stopped at ``<eos>`` (kept in the text), ``chunk`` prompts at a time."""
    out: list[str] = []
    with _eval_mode(model):
        for i in range(0, len(prompts), chunk):
            ids = [[tok.bos_id, *tok.encode(p)] for p in prompts[i:i + chunk]]
            res = generate(model, ids, max_new_tokens, greedy=greedy, temperature=temperature,
                           stop_tokens=(tok.eos_id,), generator=generator, dtype=dtype)
            out += [tok.decode(t) for t in res.token_lists()]
    return out


def free_run(model: torch.nn.Module, tok: Tokenizer, examples: Sequence[Example], *, greedy: bool = True,
             temperature: float = 1.0, generator: torch.Generator | None = None) -> list[str]:
    """The model's own answers to the examples' prompts, with :func:`answer_budget` tokens each:
    greedy, or sampled at ``temperature`` from ``generator`` (on the model's device)."""
    return complete(model, tok, [e.prompt for e in examples], answer_budget(examples), greedy=greedy,
                    temperature=temperature, generator=generator)


# -- teacher forcing (002) ---------------------------------------------------------------------------
@dataclass(frozen=True)
class TeacherForced:
    """Per completion token (``<eos>`` included), given the gold prefix: is the argmax right, and
    the log-probability of the gold token."""

    correct: list[list[bool]]  # one list per example
    logprobs: list[list[float]]  # log p_θ(y_t | x, y_<t), one list per example

    @property
    def token_accuracy(self) -> float:
        """Share of all completion tokens whose teacher-forced argmax is the gold token."""
        flat = [x for row in self.correct for x in row]
        return sum(flat) / len(flat)

    @property
    def all_correct(self) -> list[bool]:
        """Per example: every argmax right, i.e. greedy decoding writes the gold completion."""
        return [all(row) for row in self.correct]

    @property
    def gold_probs(self) -> list[float]:
        """Per example: p_θ(y* | x) = Π_t p_θ(y*_t | x, y*_<t), the chance that sampling at τ = 1 writes it."""
        return [math.exp(sum(row)) for row in self.logprobs]

    @property
    def token_error(self) -> float:
        """ε_TF = 1 − the mean over all tokens of p_θ(y*_t | x, y*_<t): the per-token error on the
        expert's own states."""
        flat = [math.exp(x) for row in self.logprobs for x in row]
        return 1.0 - sum(flat) / len(flat)


@torch.no_grad()
def teacher_forced(model: torch.nn.Module, tok: Tokenizer, examples: Sequence[Example],
                   chunk: int = CHUNK) -> TeacherForced:
    """Score the gold completions position by position with the gold prefix (teacher forcing, 002).

    A greedy free-running completion equals the gold one exactly when every ``correct`` entry
    of its example is True, and sampling at temperature 1 writes the gold completion with
    probability ``exp(sum(logprobs))``.
    """
    _check_examples(examples)
    correct: list[list[bool]] = []
    logprobs: list[list[float]] = []
    for i in range(0, len(examples), chunk):
        b = pad([encode_example(tok, e) for e in examples[i:i + chunk]], tok.pad_id).to(_device(model))
        with _eval_mode(model):
            logp = torch.log_softmax(model(b.input_ids).float(), dim=-1)[:, :-1]  # (B, T-1, V) predicting t+1
        target = b.input_ids[:, 1:]  # (B, T-1)
        gold_lp = logp.gather(-1, target[..., None])[..., 0]  # (B, T-1)
        hit = logp.argmax(-1) == target  # (B, T-1)
        mask = (b.labels[:, 1:] != IGNORE).tolist()
        correct += [[v for v, m in zip(r, mr) if m] for r, mr in zip(hit.tolist(), mask)]
        logprobs += [[v for v, m in zip(r, mr) if m] for r, mr in zip(gold_lp.tolist(), mask)]
    return TeacherForced(correct, logprobs)


@torch.no_grad()
def mean_nll(model: torch.nn.Module, tok: Tokenizer, examples: Sequence[Example], *,
             completion_only: bool = True, chunk: int = CHUNK) -> float:
    """Mean negative log-likelihood per target token of ``<bos> prompt completion <eos>``: on the
    completion and ``<eos>`` (what SFT optimises, 000 Definition 9) or, with
    ``completion_only=False``, on every token after ``<bos>`` (what pre-training optimised)."""
    _check_examples(examples)
    total, count = 0.0, 0
    for i in range(0, len(examples), chunk):
        b = pad([encode_example(tok, e, completion_only) for e in examples[i:i + chunk]], tok.pad_id)
        b = b.to(_device(model))
        with _eval_mode(model):
            total += float(causal_lm_loss(model(b.input_ids), b.labels, reduction="sum"))
        count += int(b.n_targets)
    return total / count


@torch.no_grad()
def next_token_probs(model: torch.nn.Module, tok: Tokenizer, prompts: Sequence[str],
                     chunk: int = CHUNK) -> torch.Tensor:
    """p_θ(next token | <bos> prompt) for each prompt: (N, V), float32, on the model's device."""
    if len(prompts) == 0:
        raise ValueError("prompts must hold at least one prompt")
    out = []
    for i in range(0, len(prompts), chunk):
        ids = [(tok.bos_id, *tok.encode(p)) for p in prompts[i:i + chunk]]
        b = pad([Encoded(x, x) for x in ids], tok.pad_id).to(_device(model))  # right-padded
        last = torch.tensor([len(x) - 1 for x in ids], device=b.input_ids.device)  # (B,) each row's last token
        with _eval_mode(model):
            logits = model(b.input_ids)[torch.arange(len(ids), device=last.device), last]  # (B, V)
        out.append(torch.softmax(logits.float(), dim=-1))
    return torch.cat(out)


# -- answers scored with an abstain option (ARCHITECTURE.md §8) -----------------------------------------
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


# -- mistakes, forced errors and erasures (000 §7.2–7.3) -----------------------------------------------
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


@dataclass(frozen=True)
class ForcedError:
    """Answers continued greedily after a wrong symbol forced at completion ``position``."""

    position: int  # completion position of the forced symbol (the gold symbols before it are forced too)
    examples: tuple[Example, ...]  # the examples, in order
    wrong: tuple[str, ...]  # the forced wrong symbol of each
    contexts: tuple[str, ...]  # prompt + gold prefix + wrong symbol: what the model continued
    completions: tuple[str, ...]  # the whole answer: the forced symbols, then what the model wrote
    scores: AnswerScores  # the answers scored with the task's verifier

    @property
    def recovered(self) -> tuple[bool, ...]:
        """Per answer: it ends right anyway (it took the wrong symbol back and finished correctly)."""
        return tuple(o == CORRECT for o in self.scores.outcomes)

    @property
    def recovery_rate(self) -> float:
        return self.scores.correct_rate


@torch.no_grad()
def forced_error(model: torch.nn.Module, tok: Tokenizer, task: Task, examples: Sequence[Example], position: int,
                 rng: random.Random, *, chunk: int = CHUNK) -> ForcedError:
    """Force the gold prefix and then a plausible wrong symbol (:meth:`Task.plausible_error`) at
    completion ``position`` through the engine, let the model continue greedily for
    :func:`answer_budget` tokens, and score the whole answer (000 §7.3: can it take the error back?).

    Every example must have a completion symbol at ``position``.
    """
    _check_examples(examples)
    golds = [e.completion.split() for e in examples]
    if not isinstance(position, int) or isinstance(position, bool) or position < 0:
        raise ValueError(f"position must be an int >= 0, got {position!r}")
    if short := [i for i, g in enumerate(golds) if len(g) <= position]:
        raise ValueError(f"position must be < every example's completion length; examples {short[:5]} are "
                         f"too short for position {position}")
    wrong = [task.plausible_error(e, position, rng) for e in examples]
    forced = [tok.encode([*g[:position], w]) for g, w in zip(golds, wrong)]  # (N, position + 1) ids
    budget = position + 1 + answer_budget(examples)  # the forced symbols, then a free answer's budget
    tokens: list[list[int]] = []
    for i in range(0, len(examples), chunk):
        prompts = [[tok.bos_id, *tok.encode(e.prompt)] for e in examples[i:i + chunk]]
        rows = forced[i:i + chunk]
        eng = engine_for(model, len(prompts), max(map(len, prompts)) + budget)
        with _eval_mode(model):
            eng.start(prompts, budget, SamplingParams(greedy=True), stop_tokens=(tok.eos_id,))
            for j in range(position + 1):
                eng.step(force={b: row[j] for b, row in enumerate(rows)})
            eng.run()
        tokens += eng.result().token_lists()
    completions = [tok.decode(t) for t in tokens]
    contexts = [" ".join([e.prompt, *g[:position], w]) for e, g, w in zip(examples, golds, wrong)]
    return ForcedError(position, tuple(examples), tuple(wrong), tuple(contexts), tuple(completions),
                       score_answers(task, [e.prompt for e in examples], completions))


def erasures(gold: str, completion: str) -> list[bool]:
    """For each ``<bksp>`` that erases something: True if it took back a right symbol (the text
    before the erasure, the erased symbol included, was a prefix of the gold completion).

    >>> erasures("4 6", "4 7 <bksp> 6 <bksp> 6 <eos>")
    [False, True]
    """
    want, said, out = gold.split(), [], []
    for w in completion.split():
        if w == EOS:
            break
        if w != BKSP:
            said.append(w)
        elif said:
            out.append(said == want[:len(said)])
            said.pop()
    return out


# -- what a pre-trained model knows (chapter 7) --------------------------------------------------------
@dataclass(frozen=True)
class FactRecall:
    """Which facts of a knowledge base a model completes right after ``<bos> entity relation``."""

    facts: tuple[tuple[str, str], ...]  # (entity, relation) of every fact, sorted
    recalled: tuple[bool, ...]  # the argmax next token is the fact's answer
    rare: tuple[bool, ...]  # the fact is rare in pre-training
    chance: float  # 1 / number of entities: a uniform guess among them

    def _rate(self, rare: bool) -> float:
        hits = [r for r, k in zip(self.recalled, self.rare) if k == rare]
        if not hits:
            raise ValueError(f"the knowledge base has no {'rare' if rare else 'common'} facts")
        return sum(hits) / len(hits)

    common_rate = property(lambda self: self._rate(False), doc="Share of common facts recalled.")
    rare_rate = property(lambda self: self._rate(True), doc="Share of rare facts recalled.")


@torch.no_grad()
def fact_recall(model: torch.nn.Module, tok: Tokenizer, task: KBWalk) -> FactRecall:
    """Probe a model pre-trained on ``e r e' .`` sentences: does the argmax after ``<bos> e r`` name e'?"""
    facts = tuple(sorted(task.facts))
    ids = torch.tensor([[tok.bos_id, *tok.encode([e, r])] for e, r in facts], device=_device(model))  # (F, 3)
    with _eval_mode(model):
        pred = model(ids)[:, -1].argmax(-1).tolist()  # (F,)
    recalled = tuple(tok.tokens[p] == task.facts[f] for p, f in zip(pred, facts))
    return FactRecall(facts, recalled, tuple(task.is_rare(*f) for f in facts), 1 / len(task.entities))
