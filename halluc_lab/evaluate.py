"""Evaluating a trained model: free-running completion and teacher-forced scoring.

Chapters 7–8, and every later chapter that measures a model. Sources: 000 §7.1 (teacher forcing
against free running: exposure bias), 002 ("Training vs. Generation").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from halluc_lab.data import IGNORE, encode_example, pad
from halluc_lab.engine import generate
from halluc_lab.tasks.base import Example
from halluc_lab.tokenizer import Tokenizer


def complete(model: torch.nn.Module, tok: Tokenizer, prompts: Sequence[str], max_new_tokens: int, *,
             greedy: bool = True, temperature: float = 1.0, generator: torch.Generator | None = None,
             dtype: torch.dtype | None = None, chunk: int = 512) -> list[str]:
    """Free-running completions of ``<bos> prompt`` through :func:`halluc_lab.engine.generate`,
    stopped at ``<eos>`` (kept in the text), ``chunk`` prompts at a time."""
    was_training = model.training
    model.eval()
    out: list[str] = []
    for i in range(0, len(prompts), chunk):
        ids = [[tok.bos_id, *tok.encode(p)] for p in prompts[i:i + chunk]]
        res = generate(model, ids, max_new_tokens, greedy=greedy, temperature=temperature,
                       stop_tokens=(tok.eos_id,), generator=generator, dtype=dtype)
        out += [tok.decode(t) for t in res.token_lists()]
    model.train(was_training)
    return out


@dataclass(frozen=True)
class TeacherForced:
    """Per completion token (``<eos>`` included), given the gold prefix: is the argmax right, and
    the log-probability of the gold token."""

    correct: list[list[bool]]  # one list per example
    logprobs: list[list[float]]  # log p_θ(y_t | x, y_<t), one list per example


@torch.no_grad()
def teacher_forced(model: torch.nn.Module, tok: Tokenizer, examples: Sequence[Example]) -> TeacherForced:
    """Score the gold completions position by position with the gold prefix (teacher forcing, 002).

    A greedy free-running completion equals the gold one exactly when every ``correct`` entry
    of its example is True, and sampling at temperature 1 writes the gold completion with
    probability ``exp(sum(logprobs))``.
    """
    was_training = model.training
    model.eval()
    b = pad([encode_example(tok, e) for e in examples], tok.pad_id).to(next(model.parameters()).device)
    logp = torch.log_softmax(model(b.input_ids).float(), dim=-1)[:, :-1]  # (B, T-1, V) predicting t+1
    target = b.input_ids[:, 1:]  # (B, T-1)
    gold_lp = logp.gather(-1, target[..., None])[..., 0]  # (B, T-1)
    hit = logp.argmax(-1) == target  # (B, T-1)
    mask = (b.labels[:, 1:] != IGNORE).tolist()
    model.train(was_training)
    pick = lambda rows: [[v for v, m in zip(r, mr) if m] for r, mr in zip(rows, mask)]
    return TeacherForced(pick(hit.tolist()), pick(gold_lp.tolist()))
