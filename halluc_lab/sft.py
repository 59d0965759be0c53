"""What is SFT's own: backspace demonstrations and scheduled sampling.

Chapter 8. The data, the loss and the evaluation that SFT shares with pre-training and the later
stages live in :mod:`halluc_lab.data` (tokenised examples, padding, packing, batch streams),
:mod:`halluc_lab.losses` (the completion-only cross-entropy) and :mod:`halluc_lab.evaluate`
(free-running completion, teacher forcing). Sources: 000 §7.3 (backtracking: the backspace
demonstrations); 002 ("Scheduled Sampling").

Departures from the documents:

- Scheduled sampling (002, after Bengio et al. 2015) is done in one parallel pass: the
  model predicts every position from the gold prefix and some completion inputs are
  replaced by those predictions (the two-pass variant of Mihaylova & Martins, 2019); an
  RNN would feed its own samples step by step.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from halluc_lab.data import IGNORE, Batch, Encoded
from halluc_lab.sampling import sample
from halluc_lab.tasks.base import Example, Task, completion_symbols
from halluc_lab.tokenizer import SPECIAL_TOKENS, Tokenizer


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
