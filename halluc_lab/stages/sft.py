"""SFT as a recipe stage, and what is SFT's own: backspace demonstrations, scheduled sampling, retrieved
context.

Chapter 8. The data, the loss and the evaluation that SFT shares with pre-training and the later
stages live in :mod:`halluc_lab.training.data` (tokenised examples, padding, packing, batch streams),
:mod:`halluc_lab.training.losses` (the completion-only cross-entropy) and :mod:`halluc_lab.evaluation.evaluate`
(free-running completion, teacher forcing). Sources: 000 §7.3 (backtracking: the backspace
demonstrations); 002 ("Scheduled Sampling"); 001 Part 3 §3 (RAG, eq. 11: chapter 11's fine-tuning on
retrieved context). Chapter 12's retraction demonstrations are :mod:`halluc_lab.extensions.retraction`.

**The stage** (:class:`~halluc_lab.training.recipe.Stage`): :class:`SFT`, with the variants chapter 8 compares
(completion-only loss, replay, backspace demonstrations, scheduled sampling) and chapter 11's retrieved context.
Pre-training's stage is :mod:`halluc_lab.stages.pretraining`.

**Retrieved context** (chapter 11) is :mod:`halluc_lab.stages.retrieved_context`.

Departures from the documents:

- Scheduled sampling (002, after Bengio et al. 2015) is done in one parallel pass: the
  model predicts every position from the gold prefix and some completion inputs are
  replaced by those predictions (the two-pass variant of Mihaylova & Martins, 2019); an
  RNN would feed its own samples step by step.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from halluc_lab.training.data import IGNORE, Batch, Encoded, encode_document, encode_example, pack
from halluc_lab.training.recipe import Prepare, Recipe, Stage
from halluc_lab.stages.retrieved_context import RetrievedContext
from halluc_lab.generation.sampling import sample
from halluc_lab.tasks.base import Example, Task, completion_symbols, make_task
from halluc_lab.model.tokenizer import SPECIAL_TOKENS, Tokenizer


# -- backspace demonstrations (000 §7.3) ---------------------------------------------------------
@dataclass(frozen=True)
class BackspaceConfig:
    """How errors are injected into SFT completions, each followed by ``<bksp>`` and the fix."""

    rate: float = 0.1  # probability p of an error before each completion symbol
    errors: str = "plausible"  # "plausible" (the task's likely mistakes) or "random" (any other symbol)
    context: str = "keep"  # "keep": w <bksp> stay in the context; "erase": the context is rolled back

    def __post_init__(self):
        if not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"rate must be in [0, 1], got {self.rate!r}")
        if self.errors not in ("plausible", "random"):
            raise ValueError(f"errors must be 'plausible' or 'random', got {self.errors!r}")
        if self.context not in ("keep", "erase"):
            raise ValueError(f"context must be 'keep' or 'erase', got {self.context!r}")


def backspace_demonstration(tok: Tokenizer, task: Task, example: Example, cfg: BackspaceConfig,
                            rng: random.Random) -> list[Encoded]:
    """An SFT example with injected errors ``w <bksp>`` before some completion symbols.

    The wrong symbol ``w`` is never a target (label IGNORE: we do not teach errors); the
    ``<bksp>`` after it and the correction are. With ``context="keep"`` this is one sequence
    ``<bos> x y1 w <bksp> y2 ... <eos>``. With ``context="erase"`` (a KV-cache rollback
    forgets ``w <bksp>``) it is the clean sequence plus one short branch per error,
    ``<bos> x y<i w <bksp>``, whose only target is the ``<bksp>``.

    >>> from halluc_lab.tasks import Arithmetic
    >>> task = Arithmetic(); tok = task.tokenizer()
    >>> seq, = backspace_demonstration(tok, task, Example("1 + 1 =", "2"), BackspaceConfig(rate=1.0), random.Random(0))
    >>> tok.decode(seq.ids), tok.decode([t for t in seq.labels if t >= 0])
    ('<bos> 1 + 1 = 3 <bksp> 2 <eos>', '<bksp> 2 <eos>')
    """
    prompt = (tok.bos_id, *tok.encode(example.prompt))
    gold = tok.encode(example.completion)
    clean: list[int] = []
    ids, labels = list(prompt), [IGNORE] * len(prompt)
    branches: list[Encoded] = []
    for i, y in enumerate(gold):
        if rng.random() < cfg.rate:
            if cfg.errors == "plausible":
                w = tok.token_id(task.plausible_error(example, i, rng))
            else:
                w = rng.choice([t for t in range(len(SPECIAL_TOKENS), tok.vocab_size) if t != y])
            if cfg.context == "keep":
                ids += [w, tok.bksp_id]
                labels += [IGNORE, tok.bksp_id]
            else:
                branch = (*prompt, *clean, w, tok.bksp_id)
                branches.append(Encoded(branch, (IGNORE,) * (len(branch) - 1) + (tok.bksp_id,)))
        ids.append(y)
        labels.append(y)
        clean.append(y)
    ids.append(tok.eos_id)
    labels.append(tok.eos_id)
    return [Encoded(tuple(ids), tuple(labels)), *branches]


def own_error_demonstration(tok: Tokenizer, example: Example, completion: Sequence[int], *,
                            take_back: bool = True) -> Encoded:
    """A backspace demonstration from the model's own answer (DAgger-style): its prefix up to its first wrong
    symbol ``w``, then ``<bksp>`` and the gold answer from there on; the clean example if it made no mistake.

    The state is the model's own (its prefix and its error), the action the expert's (take ``w`` back,
    continue right). ``w`` is never a target; the prefix, the ``<bksp>`` and the correction are. An answer
    that stops early (its first wrong symbol is ``<eos>``) gives the clean example: nothing follows ``<eos>``.
    ``take_back=False`` gives the clean example always: the same gold answers without the take-back (the control
    that tells what the ``<bksp>`` adds from what the correction's information adds).

    >>> from halluc_lab.tasks import Arithmetic
    >>> task = Arithmetic(); tok = task.tokenizer()
    >>> seq = own_error_demonstration(tok, Example("1 + 1 =", "2 3"), tok.encode("2 4 <eos>"))
    >>> tok.decode(seq.ids), tok.decode([t for t in seq.labels if t >= 0])
    ('<bos> 1 + 1 = 2 4 <bksp> 3 <eos>', '2 <bksp> 3 <eos>')
    """
    prompt = (tok.bos_id, *tok.encode(example.prompt))
    gold = tuple(tok.encode(example.completion)) + (tok.eos_id,)
    said = tok.encode(" ".join(completion_symbols(tok.decode(completion))))  # what it finally says, take-backs applied
    said = tuple(said) + (tok.eos_id,) if tok.eos_id in completion else tuple(said)
    i = next((j for j, (a, b) in enumerate(zip(said, gold)) if a != b), None)
    if i is None or said[i] == tok.eos_id or not take_back:  # right (or cut off while right), or stopped early
        return Encoded(prompt + gold, (IGNORE,) * len(prompt) + gold)
    ids = prompt + gold[:i] + (said[i], tok.bksp_id) + gold[i:]
    return Encoded(ids, (IGNORE,) * len(prompt) + gold[:i] + (IGNORE, tok.bksp_id) + gold[i:])


# -- scheduled sampling (002) ------------------------------------------------------------------
@torch.no_grad()
def scheduled_sampling(model: torch.nn.Module, batch: Batch, rate: float, generator: torch.Generator,
                       temperature: float = 1.0) -> Batch:
    """Replace each completion input token, with probability ``rate``, by the model's own sample.

    One parallel pass predicts every position from the gold prefix; labels stay gold, so
    the model learns to continue correctly from a context holding its own mistakes (002,
    "Scheduled Sampling": start low, increase over training).
    """
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"rate must be in [0, 1], got {rate!r}")
    if rate == 0.0:
        return batch
    logits = model(batch.input_ids, **batch.model_kwargs())  # (B, T, V)
    pred = sample(logits[:, :-1].float(), temperature, generator=generator, validate=False)  # (B, T-1)
    u = torch.rand(pred.shape, generator=generator, device=pred.device)  # (B, T-1)
    # Only completion targets are replaced, and never the last one (<eos>): nothing follows it.
    swap = (batch.labels[:, 1:] != IGNORE) & (u < rate)  # (B, T-1)
    swap &= torch.cat([batch.labels[:, 2:] != IGNORE, torch.zeros_like(swap[:, :1])], dim=1)
    ids = batch.input_ids.clone()  # (B, T)
    ids[:, 1:] = torch.where(swap, pred, batch.input_ids[:, 1:])
    return Batch(ids, batch.labels, batch.position_ids, batch.segment_ids)


# -- retry demonstrations: a dead end walked and taken back (Physics of LMs 2.2) ----------------
def retry_demonstration(tok: Tokenizer, task, example: Example, rng: random.Random, *,
                        wrong_targets: bool = True) -> Encoded:
    """An SFT example whose completion walks a wrong arm to its dead end, takes it back with one
    ``<bksp>`` per wrong node and writes the gold path (``DeadEnds.retry_completion`` of
    :mod:`halluc_lab.tasks.dead_ends`), ``<bksp>`` kept in the context. The retry data that
    pre-training sees, for SFT from a clean pre-trained model (the fine-tune-only control). Every
    completion token is a target, the wrong ones too, as in Ye et al.'s retry data;
    ``wrong_targets=False`` leaves the wrong nodes out of the loss, as
    :func:`backspace_demonstration` does.

    >>> from halluc_lab.tasks.dead_ends import DeadEnds, DeadEndsConfig
    >>> task = DeadEnds(DeadEndsConfig(reveal=1, length=2, n_nodes=5)); tok = task.tokenizer()
    >>> ex = Example("0 1 , 1 2 , 0 3 , 3 4 / 0 4 =", "0 3 4")
    >>> seq = retry_demonstration(tok, task, ex, random.Random(0), wrong_targets=False)
    >>> tok.decode([t for t in seq.labels if t >= 0])
    '0 <bksp> <bksp> 3 4 <eos>'
    """
    if not callable(getattr(task, "retry_completion", None)):
        raise TypeError(f"task must have dead ends to retry from (a DeadEnds task), "
                        f"got {type(task).__name__}")
    seq = encode_example(tok, Example(example.prompt, task.retry_completion(example, rng)))
    if wrong_targets:
        return seq
    first = 2 + len(tok.encode(example.prompt))  # the first wrong node: after <bos>, prompt, centre
    wrong = seq.ids.index(tok.bksp_id) - first  # the wrong nodes run up to the first <bksp>
    return Encoded(seq.ids, seq.labels[:first] + (IGNORE,) * wrong + seq.labels[first + wrong:])


# -- the stage: SFT (chapter 8) -------------------------------------------------------------------------
@dataclass(frozen=True)
class SFT(Stage):
    """Supervised fine-tuning on the task's train split (chapter 8), with the variants the book compares."""

    n_examples: int  # training examples drawn from the task's train split
    completion_only: bool = True  # loss on the completion only (000 §5.4)
    replay_fraction: float = 0.0  # pre-training documents mixed in, per SFT example (against forgetting)
    backspace: BackspaceConfig | None = None  # inject errors + <bksp> + correction (000 §7.3); None: clean
    scheduled_sampling: float = 0.0  # final rate of scheduled sampling, ramped up linearly from 0 (002)
    retrieved: RetrievedContext | None = None  # passages prepended to a share of the prompts (001 eq. 11); None: plain
    retry: float = 0.0  # share of examples as retry demonstrations (dead_ends: a detour taken back)

    def __post_init__(self):
        if not isinstance(self.n_examples, int) or isinstance(self.n_examples, bool) or self.n_examples < 1:
            raise ValueError(f"n_examples must be an int >= 1, got {self.n_examples!r}")
        if not isinstance(self.completion_only, bool):
            raise TypeError(f"completion_only must be a bool, got {self.completion_only!r}")
        if not (isinstance(self.replay_fraction, (int, float)) and math.isfinite(self.replay_fraction)
                and self.replay_fraction >= 0):
            raise ValueError(f"replay_fraction must be a finite number >= 0, got {self.replay_fraction!r}")
        if self.backspace is not None and not isinstance(self.backspace, BackspaceConfig):
            raise TypeError(f"backspace must be a BackspaceConfig or None, got {type(self.backspace).__name__}")
        if not (isinstance(self.scheduled_sampling, (int, float)) and 0.0 <= self.scheduled_sampling <= 1.0):
            raise ValueError(f"scheduled_sampling must be in [0, 1], got {self.scheduled_sampling!r}")
        if self.retrieved is not None and not isinstance(self.retrieved, RetrievedContext):
            raise TypeError(f"retrieved must be a RetrievedContext or None, got {type(self.retrieved).__name__}")
        real = isinstance(self.retry, (int, float)) and not isinstance(self.retry, bool)
        if not (real and 0.0 <= self.retry <= 1.0):
            raise ValueError(f"retry must be a number in [0, 1], got {self.retry!r}")
        if self.retry > 0 and self.backspace is not None:
            raise ValueError("retry and backspace are two layouts of a take-back: give one, got "
                             f"retry={self.retry!r} and a BackspaceConfig")

    def rows(self, recipe: Recipe) -> Batch:
        """The examples (with retrieved passages, and backspace or retry demonstrations, if asked),
        the replayed documents, shuffled and packed.

        Retrieved context (:meth:`RetrievedContext.augment`) replaces an example's prompt after the examples
        are drawn, with the stage's ``rng``; with backspace demonstrations as well, errors are injected in
        the augmented example's completion (the passages are prompt: never a target). Replayed documents
        come from the corpus of the chain's pre-training recipe (its seed), also when this recipe starts
        from another SFT recipe, without the facts the task keeps for evaluation only.
        """
        task = make_task(recipe.task)
        tok = task.tokenizer()
        rng = random.Random(recipe.seed)
        seqs = []
        for ex in task.examples("train", self.n_examples, seed=recipe.seed):
            if self.retrieved is not None:
                ex = self.retrieved.augment(task, ex, rng)
            if self.backspace is not None:
                seqs += backspace_demonstration(tok, task, ex, self.backspace, rng)
            elif self.retry > 0 and rng.random() < self.retry:
                seqs.append(retry_demonstration(tok, task, ex, rng))
            else:
                seqs.append(encode_example(tok, ex, completion_only=self.completion_only))
        if self.replay_fraction > 0:
            docs = task.replay_documents(seed=recipe.pretraining.seed)  # no evaluation-only fact
            seqs += [encode_document(tok, d) for d in rng.sample(docs, int(self.replay_fraction * self.n_examples))]
        rng.shuffle(seqs)
        return pack(seqs, recipe.seq_len, tok.pad_id)

    def prepare(self, recipe: Recipe) -> Prepare | None:
        """Scheduled sampling when its rate is above 0, else nothing."""
        if self.scheduled_sampling == 0:
            return None
        return ScheduledSampling(self.scheduled_sampling, recipe.train.steps, recipe.seed)


@dataclass(frozen=True)
class ScheduledSampling:
    """``prepare(model, batch, step)``: :func:`~halluc_lab.stages.sft.scheduled_sampling` at a rate ramped
    linearly from 0 to ``final_rate`` over the run, its draws seeded by the step (so a resumed run
    draws what an uninterrupted one would)."""

    final_rate: float  # the rate at the last step
    steps: int  # the run's optimizer steps
    seed: int  # the recipe's seed

    def __call__(self, model: nn.Module, batch: Batch, step: int) -> Batch:
        g = torch.Generator(device=batch.input_ids.device).manual_seed(self.seed * 1_000_003 + step)
        return scheduled_sampling(model, batch, self.final_rate * step / self.steps, g)
