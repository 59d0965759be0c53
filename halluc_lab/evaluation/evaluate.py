"""Evaluating a model: free running against teacher forcing and forced errors, on fixed sets of
distinct held-out prompts.

Chapters 7–8 measure their models with it, and every later chapter that compares models
(9–11) does too. Sources: 000 §7.1 (exposure bias: teacher forcing against free running),
§7.3 (backtracking: :func:`forced_error`); 002 ("Training vs. Generation"). Judging the answers
— correct / wrong / abstained and the penalised score C − λW, Ross & Bagnell's mistakes (§7.2),
what ``<bksp>`` took back (§7.3) — is :mod:`halluc_lab.evaluation.scoring`, which needs no model; its names
are re-exported here, so a chapter imports one module.

What a task means by "right" is always the task's own verifier (:meth:`Task.reward`,
:meth:`Task.claims`). Nothing here branches on which task it is (:func:`fact_recall` and
:func:`entity_recall` probe a knowledge base and take a :class:`~halluc_lab.tasks.kb_walk.KBWalk`).

Departures and choices:

- Evaluation sets hold distinct prompts (:func:`distinct_examples`). A task's generator draws with
  replacement, and where the space of problems is small (1-hop chains, single-digit sums) a draw of
  1,000 repeats a few problems many times, so they weigh far more than their number in a pooled score.
  Where a space holds fewer than ``n`` problems the set is all of those found, and smaller.
- :func:`forced_error` forces the error through the engine (the tokens before it are forced too, all
  marked as not sampled), so the model continues from a cache exactly as in free running.
- :func:`best_of_n_matched` is the parallel baseline of a model that takes tokens back (chapter 10's
  fair test; Qin et al. 2025 compare the two at fixed compute): N samples at τ = 1, N chosen so
  that the N together spend the other arm's mean tokens per answer, one picked by a check the
  model could run on its own output (the task's: the last node is the goal) and one by the
  verifier, an upper bound.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from halluc_lab.generation.backtrack import rollout
from halluc_lab.training.data import IGNORE, Encoded, encode_example, pad
from halluc_lab.generation.engine import engine_for, generate
from halluc_lab.training.losses import causal_lm_loss
from halluc_lab.generation.sampling import GREEDY, SamplingParams
from halluc_lab.evaluation.scoring import (ABSTAINED, CORRECT, OUTCOMES, WRONG, AnswerScores, BackspaceUse,  # noqa: F401
                                backspace_use, erasures, lam_for_target, mistakes, mistakes_after_first,
                                score_answers)
from halluc_lab.evaluation.scoring import answer_tokens, oracle_check, pick_first
from halluc_lab.tasks.base import Example, Task, check_count
from halluc_lab.tasks.kb_walk import KBWalk
from halluc_lab.model.tokenizer import Tokenizer

CHUNK = 512  # rows per forward pass or engine batch


def model_device(model: torch.nn.Module) -> torch.device:
    """The device a model's parameters live on."""
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


# -- evaluation sets: distinct held-out prompts ------------------------------------------------------
def _round_seed(seed: int, r: int) -> int:
    """The seed of draw round ``r``: ``seed`` itself first, then seeds derived from (seed, r)."""
    return seed if r == 0 else int.from_bytes(hashlib.sha256(f"distinct:{seed}:{r}".encode()).digest()[:4], "big")


def _distinct(draw: Callable[[int], dict], n: int, seed: int, max_rounds: int) -> dict:
    """Per group, the first ``n`` examples with distinct prompts over rounds of ``draw(round_seed)``.

    A group stops when it holds ``n``, or when a round after the first adds no new prompt to it (its
    space is exhausted, or nearly); all stop after ``max_rounds`` rounds."""
    check_count("n", n, 1)
    check_count("seed", seed)
    check_count("max_rounds", max_rounds, 1)
    found: dict = {}  # group -> {prompt: example}, in the order first drawn
    done: set = set()
    for r in range(max_rounds):
        for group, exs in draw(_round_seed(seed, r)).items():
            if group in done:
                continue
            have = found.setdefault(group, {})
            before = len(have)
            for e in exs:
                if len(have) == n:
                    break
                have.setdefault(e.prompt, e)
            if len(have) == n or (r > 0 and len(have) == before):
                done.add(group)
        if done >= set(found):
            break
    return {group: list(have.values()) for group, have in found.items()}


def distinct_examples(task: Task, split: str, n: int, seed: int, *, max_rounds: int = 10, **kw) -> list[Example]:
    """Up to ``n`` examples of ``split`` with distinct prompts, in the order first drawn: rounds of
    ``task.examples(split, n, round_seed, **kw)`` (round 0 with ``seed`` itself), deduplicated,
    until ``n`` are found or a round adds none (fewer than ``n`` exist, or nearly none are left).

    >>> from halluc_lab.tasks import Arithmetic
    >>> len(distinct_examples(Arithmetic(), "heldout", 1000, seed=0, answer_digits=1))  # all there are
    8
    """
    return _distinct(lambda s: {None: task.examples(split, n, s, **kw)}, n, seed, max_rounds)[None]


def distinct_examples_by_length(task: Task, split: str, n: int, seed: int, *,
                                max_rounds: int = 10) -> dict[int, list[Example]]:
    """:func:`distinct_examples` for each answer length of :meth:`Task.examples_by_length`: up to ``n``
    distinct prompts per length, shortest first, drawn in rounds of ``examples_by_length``."""
    return _distinct(lambda s: task.examples_by_length(split, n, s), n, seed, max_rounds)


# -- free running (000 §7.1) -----------------------------------------------------------------------
def complete(model: torch.nn.Module, tok: Tokenizer, prompts: Sequence[str], max_new_tokens: int, *,
             sampling: SamplingParams = GREEDY, generator: torch.Generator | None = None,
             dtype: torch.dtype | None = None, chunk: int = CHUNK,
             allow_bksp: bool = True) -> list[str]:
    """Free-running completions of ``<bos> prompt`` through :func:`halluc_lab.generation.engine.generate`,
    stopped at ``<eos>`` (kept in the text), ``chunk`` prompts at a time. ``sampling``: greedy
    unless given (e.g. ``SamplingParams(temperature=0.5)``, drawn from ``generator``). A ``<bksp>``
    stays in the text (the scoring applies it) and in the context; ``allow_bksp=False`` decodes the
    same weights with ``<bksp>`` masked out (:func:`halluc_lab.generation.backtrack.rollout`)."""
    out: list[str] = []
    with _eval_mode(model):
        for i in range(0, len(prompts), chunk):
            ids = [[tok.bos_id, *tok.encode(p)] for p in prompts[i:i + chunk]]
            kw = dict(sampling=sampling, stop_tokens=(tok.eos_id,), generator=generator,
                      dtype=dtype)
            res = (generate(model, ids, max_new_tokens, **kw) if allow_bksp else
                   rollout(model, ids, max_new_tokens, bksp_id=tok.bksp_id, context="keep", allow_bksp=False, **kw))
            out += [tok.decode(t) for t in res.token_lists()]
    return out


def free_run(model: torch.nn.Module, tok: Tokenizer, examples: Sequence[Example], *,
             sampling: SamplingParams = GREEDY, generator: torch.Generator | None = None,
             allow_bksp: bool = True) -> list[str]:
    """The model's own answers to the examples' prompts, with :func:`answer_budget` tokens each,
    chosen by ``sampling`` (greedy unless given; drawn from ``generator``, on the model's device);
    ``allow_bksp=False``: ``<bksp>`` masked out."""
    return complete(model, tok, [e.prompt for e in examples], answer_budget(examples),
                    sampling=sampling, generator=generator, allow_bksp=allow_bksp)


@dataclass(frozen=True)
class BestOfN:
    """Best-of-N at matched tokens: N samples per prompt, one picked by a check the model could run
    on its own output and one by the verifier (an upper bound)."""

    n: int  # samples per prompt
    tokens_per_answer: float  # mean tokens of all N samples of a prompt together, <eos> included
    self_checked: AnswerScores  # the first sample that passes the task's own check (else the first)
    oracle: AnswerScores  # the first correct sample (else the first): the upper bound


def best_of_n_matched(model: torch.nn.Module, tok: Tokenizer, task: Task, prompts: Sequence[str],
                      max_new_tokens: int, *, target_tokens: float,
                      check: Callable[[str, str], bool], generator: torch.Generator,
                      sampling: SamplingParams = SamplingParams(temperature=1.0),
                      max_n: int = 64) -> BestOfN:
    """Best-of-N whose N spends about ``target_tokens`` per answer (another arm's mean, e.g. a model
    that takes tokens back): one sample per prompt measures a sample's mean tokens t,
    N = round(target / t) (1 to ``max_n``), and N − 1 more samples are drawn. Picked by ``check``
    (a task's own, e.g. ``DeadEnds.reaches_goal``) and by
    :func:`~halluc_lab.evaluation.scoring.oracle_check`."""
    if not prompts:
        raise ValueError("prompts must hold at least one prompt")
    if isinstance(target_tokens, bool) or not isinstance(target_tokens, (int, float)) or not (
            math.isfinite(target_tokens) and target_tokens > 0):
        raise ValueError(f"target_tokens must be a finite number > 0, got {target_tokens!r}")
    check_count("max_n", max_n, 1)
    first = complete(model, tok, prompts, max_new_tokens, sampling=sampling, generator=generator)
    per_sample = sum(map(answer_tokens, first)) / len(first)
    n = min(max_n, max(1, round(target_tokens / per_sample)))
    groups = [[c] for c in first]
    if n > 1:
        more = complete(model, tok, [p for p in prompts for _ in range(n - 1)], max_new_tokens,
                        sampling=sampling, generator=generator)
        for i, g in enumerate(groups):
            g += more[i * (n - 1):(i + 1) * (n - 1)]
    spent = sum(answer_tokens(c) for g in groups for c in g) / len(groups)
    return BestOfN(n, spent, score_answers(task, prompts, pick_first(prompts, groups, check)),
                   score_answers(task, prompts, pick_first(prompts, groups, oracle_check(task))))


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
        b = pad([encode_example(tok, e) for e in examples[i:i + chunk]], tok.pad_id).to(model_device(model))
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
        b = b.to(model_device(model))
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
        b = pad([Encoded(x, x) for x in ids], tok.pad_id).to(model_device(model))  # right-padded
        last = torch.tensor([len(x) - 1 for x in ids], device=b.input_ids.device)  # (B,) each row's last token
        with _eval_mode(model):
            logits = model(b.input_ids)[torch.arange(len(ids), device=last.device), last]  # (B, V)
        out.append(torch.softmax(logits.float(), dim=-1))
    return torch.cat(out)


# -- forced errors (000 §7.3) -------------------------------------------------------------------
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
            eng.start(prompts, budget, GREEDY, stop_tokens=(tok.eos_id,))
            for j in range(position + 1):
                eng.step(force={b: row[j] for b, row in enumerate(rows)})
            eng.run()
        tokens += eng.result().token_lists()
    completions = [tok.decode(t) for t in tokens]
    contexts = [" ".join([e.prompt, *g[:position], w]) for e, g, w in zip(examples, golds, wrong)]
    return ForcedError(position, tuple(examples), tuple(wrong), tuple(contexts), tuple(completions),
                       score_answers(task, [e.prompt for e in examples], completions))


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
    ids = torch.tensor([[tok.bos_id, *tok.encode([e, r])] for e, r in facts], device=model_device(model))  # (F, 3)
    with _eval_mode(model):
        pred = model(ids)[:, -1].argmax(-1).tolist()  # (F,)
    recalled = tuple(tok.tokens[p] == task.facts[f] for p, f in zip(pred, facts))
    return FactRecall(facts, recalled, tuple(task.is_rare(*f) for f in facts), 1 / len(task.entities))


@torch.no_grad()
def entity_recall(model: torch.nn.Module, tok: Tokenizer, task: KBWalk,
                  facts: Sequence[tuple[str, str]]) -> list[float]:
    """Per fact (entity, relation): 1.0 where its answer is the likeliest *entity* at the point a
    one-hop walk would state it (after ``<bos> e r = e r``), ranked among the world's entities
    only, else 0.0: what a model believes, whether or not it would say it (chapter 12's safety)."""
    if len(facts) == 0:
        raise ValueError("facts must hold at least one (entity, relation) pair")
    if missing := [f for f in facts if tuple(f) not in task.facts]:
        raise ValueError(f"facts must be facts of the world; {missing[:3]} are not")
    entity_ids = torch.tensor([tok.token_id(x) for x in task.entities])  # (E,)
    probs = next_token_probs(model, tok, [f"{e} {r} = {e} {r}" for e, r in facts]).cpu()  # (F, V)
    best = entity_ids[probs[:, entity_ids].argmax(-1)].tolist()  # (F,) the likeliest entity of each
    return [float(b == tok.token_id(task.facts[tuple(f)])) for b, f in zip(best, facts)]
