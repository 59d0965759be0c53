"""The backspace controller: rollouts in which a sampled ``<bksp>`` takes back the row's last token.

Chapter 10 (chapter 8 trained the token, chapter 11 measures what it does to hallucination).
Sources: 000 §7.3 (detect, backtrack, correct), 001 Part 2 §3 (RLVR: the rollouts it learns from);
Zhang et al. 2024 ([RESET]), Yang et al. 2025 (Self-Backtracking)::

    out = rollout(model, prompts, 16, bksp_id=tok.bksp_id, context="erase",
                  stop_tokens=(tok.eos_id,), generator=g, n_samples=8)
    out.text_lists()      # what each answer finally says: erased tokens and backspaces removed
                          # (the verifier's input)
    out.token_lists()     # every token the row emitted, in order, erased ones and <bksp> included
    out.logprobs          # log π of each, in the context it was sampled in
    rows = training_rows(prompt, out.token_lists()[0], out.sampled_mask[0].tolist(), tok.bksp_id,
                         "erase")

**Two contexts** (ARCHITECTURE.md §8, the same choice as chapter 8's demonstrations):

- ``"keep"``: ``w <bksp>`` stay in the context, so the model sees its mistake and the take-back; the
  context is the row's whole token sequence. What chapter 8's backspace SFT trains by default.
- ``"erase"``: the KV cache rolls back, and the model continues as if ``w`` had never been sampled.
  In the step: the erased token is the pending one just written to the cache, so the row's cache
  loses two positions — that token and the one before it, which becomes pending again and is fed by
  the next step (the engine's pending-token design: the cache holds all but the last token). A
  ``<bksp>`` with nothing to erase (an empty answer) drops only the prompt's last token, which is
  then fed again.

In both, the decision is made inside the decode step, per row, on the device (``torch.where``, no
host synchronisation), so on CUDA the step with its backspaces is one replayed graph. The row's
*log* records every emitted token with its log-prob and whether it was sampled; ``alive`` marks the
tokens that survive in the final text; the budget ``max_new_tokens`` counts emitted tokens
(backspaces and erased tokens spend it), so a row cannot backspace forever. ``allow_bksp=False``
masks ``<bksp>``'s logit before sampling and before the recorded log-prob (the same weights, decoded
without take-backs; the log-probs are then those of the masked policy).

Where the code departs from the documents: 000 §7.3 describes detect–backtrack–correct as a
procedure; here it is one token the model samples like any other, so detection is the model's own
probability of ``<bksp>`` and the correction is whatever it samples next.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from halluc_lab.training.data import IGNORE, Encoded
from halluc_lab.device import distinct_indices
from halluc_lab.generation.engine import generate
from halluc_lab.generation.engine_core import Engine, GenerationResult
from halluc_lab.generation.sampling import SamplingParams

Tensor = torch.Tensor
CONTEXTS = ("keep", "erase")


def _check_context(context: str) -> None:
    if context not in CONTEXTS:
        raise ValueError(f"context must be one of {CONTEXTS} (what a <bksp> leaves in the "
                         f"context), got {context!r}")


@dataclass(frozen=True)
class Rollout(GenerationResult):
    """A batch of rollouts with take-backs. ``tokens``, ``logprobs`` and ``sampled_mask`` are the
    *log*: every emitted token in order (``lengths`` per row), erased tokens and ``<bksp>``
    included; ``alive`` (N, M) bool marks the log entries that survive in the final text,
    ``text_lengths`` (N,) how many."""

    alive: Tensor  # (N, M) bool: the token is in the final text (not erased, not a <bksp>)
    text_lengths: Tensor  # (N,) tokens in the final text

    def text_lists(self) -> list[list[int]]:
        """What each row finally says: its surviving tokens, in order (the verifier's input)."""
        return [[t for t, a in zip(row, keep) if a]
                for row, keep in zip(self.tokens.tolist(), self.alive.tolist())]

    def sampled_lists(self) -> list[list[bool]]:
        """Per row, whether each logged token was sampled (True) or forced by the caller (False)."""
        return [m[:n] for m, n in zip(self.sampled_mask.tolist(), self.lengths.tolist())]


class BacktrackEngine(Engine):
    """An :class:`~halluc_lab.generation.engine_core.Engine` whose rows take back their last token
    when they emit ``bksp_id``.

    ``context``: ``"keep"`` or ``"erase"`` (module docstring); ``allow_bksp=False`` never samples
    ``<bksp>``. :meth:`result` returns a :class:`Rollout`. :meth:`rollback` is not offered: a
    take-back is a token here.
    """

    # A take-back lowers n_out, so a warm-up step may write over text a real row still holds.
    _STEP_STATE = Engine._STEP_STATE + ("n_log", "log_alive", "alive_at", "out_tokens")

    def __init__(self, model: nn.Module, batch_size: int, max_positions: int, *, bksp_id: int,
                 context: str = "erase", allow_bksp: bool = True, dtype: torch.dtype | None = None,
                 cuda_graph: bool | None = None, fused: bool = False) -> None:
        super().__init__(model, batch_size, max_positions, dtype=dtype, cuda_graph=cuda_graph,
                         fused=fused)
        if (isinstance(bksp_id, bool) or not isinstance(bksp_id, int)
                or not 0 <= bksp_id < self.vocab_size):
            raise ValueError(f"bksp_id must be a token id in [0, {self.vocab_size - 1}], "
                             f"got {bksp_id!r}")
        _check_context(context)
        if not isinstance(allow_bksp, bool):
            raise TypeError(f"allow_bksp must be a bool, got {allow_bksp!r}")
        self.bksp_id, self.context, self.allow_bksp = bksp_id, context, allow_bksp
        B, T, dev = batch_size, max_positions, self.device
        # made here: a graph capture cannot copy from the host
        self._bksp_index = torch.tensor([bksp_id], device=dev)
        # The log: every emitted token. out_tokens / n_out (the engine's) hold the surviving text.
        self.n_log = torch.zeros(B, dtype=torch.long, device=dev)  # (B,) tokens emitted
        self.log_tokens = torch.zeros(B, T, dtype=torch.long, device=dev)
        self.log_logprobs = torch.zeros(B, T, dtype=torch.float32, device=dev)
        self.log_sampled = torch.zeros(B, T, dtype=torch.bool, device=dev)
        self.log_alive = torch.zeros(B, T, dtype=torch.bool, device=dev)
        # (B, T) text position j -> its log column
        self.alive_at = torch.zeros(B, T, dtype=torch.long, device=dev)

    def start(self, *args, **kwargs) -> None:
        super().start(*args, **kwargs)
        self.n_log.zero_()
        self.log_alive.zero_()

    def _logits(self, logits: Tensor) -> Tensor:
        if self.allow_bksp:
            return logits
        return logits.index_fill(1, self._bksp_index, float("-inf"))

    def _record(self, token: Tensor, logp: Tensor) -> None:
        active = ~self.finished  # (B,)
        is_bksp = active & (token == self.bksp_id)  # (B,)
        erase = is_bksp & (self.n_out > 0)  # (B,) there is a token to take back
        # (B, 1) each: where this step writes
        col, text_col = self.n_log[:, None], self.n_out[:, None]
        with distinct_indices():  # every write below is one column per row
            # 1. The log: every active row's token, alive unless it is a <bksp>.
            self.log_tokens.scatter_(1, col, token[:, None])
            self.log_logprobs.scatter_(1, col, logp[:, None])
            self.log_sampled.scatter_(1, col, ~self.force_mask[:, None])
            self.log_alive.scatter_(1, col, (active & ~is_bksp)[:, None])
            # 2. The text: a written token is appended; a <bksp> kills the last surviving one. (Its
            # log-probs and sampled flags are not kept: a Rollout reports the log's.)
            # past the end for a <bksp> row: never read
            self.out_tokens.scatter_(1, text_col, token[:, None])
            self.alive_at.scatter_(1, text_col, col)
            # (B, 1) log column of the last text token
            last = self.alive_at.gather(1, (self.n_out - 1).clamp_min(0)[:, None])
            self.log_alive.scatter_(1, last, self.log_alive.gather(1, last) & ~erase[:, None])
        self.n_out += (active & ~is_bksp).long() - erase.long()
        self.n_log += active.long()
        # 3. The context: keep feeds the <bksp>; erase drops the erased token (and re-feeds the one
        # before it).
        if self.context == "keep":
            self.tok.copy_(torch.where(active, token, self.tok))
        else:
            self.cache.lengths -= is_bksp.long() + erase.long()
            # (B,)
            now_last = self.out_tokens.gather(1, (self.n_out - 1).clamp_min(0)[:, None])[:, 0]
            pending = torch.where(self.n_out > 0, now_last, self.last_prompt)
            self.tok.copy_(torch.where(is_bksp, pending, torch.where(active, token, self.tok)))
        # the budget counts emitted tokens, take-backs included
        self._finish(active, token, self.n_log)

    def rollback(self, rows, n) -> None:
        raise NotImplementedError("a BacktrackEngine takes tokens back by emitting <bksp>; force "
                                  "it with step(force=...)")

    def result(self) -> Rollout:
        """The rows in use: their logs trimmed to the longest, the alive mask, the text lengths."""
        base = super().result()  # the surviving text (copies the generator state back)
        N = self.n_rows
        lengths = self.n_log[:N].clone()
        M = max(1, int(lengths.max()))
        inside = torch.arange(M, device=self.device)[None, :] < lengths[:, None]  # (N, M)
        return Rollout(tokens=torch.where(inside, self.log_tokens[:N, :M], 0),
                       logprobs=torch.where(inside, self.log_logprobs[:N, :M], 0.0),
                       sampled_mask=inside & self.log_sampled[:N, :M], lengths=lengths,
                       stopped=base.stopped, alive=inside & self.log_alive[:N, :M],
                       text_lengths=base.lengths)


def rollout(model: nn.Module, prompts: Sequence[Sequence[int]] | Tensor, max_new_tokens: int, *,
            bksp_id: int, context: str = "erase", allow_bksp: bool = True,
            sampling: SamplingParams = SamplingParams(), stop_tokens: Sequence[int] = (),
            generator: torch.Generator | None = None, dtype: torch.dtype | None = None,
            n_samples: int = 1, fused: bool = False) -> Rollout:
    """Continue each prompt by up to ``max_new_tokens`` emitted tokens, ``<bksp>`` taking back the
    last one.

    Arguments as :func:`halluc_lab.generation.engine.generate` (``sampling``, default temperature 1;
    ``n_samples`` = G rows per prompt from one prefill, prompt-major), and ``bksp_id``, ``context``,
    ``allow_bksp`` and ``fused`` as :class:`BacktrackEngine`. Same generator state, same rollouts.
    """
    return generate(model, prompts, max_new_tokens, sampling=sampling, stop_tokens=stop_tokens,
                    generator=generator, dtype=dtype, n_samples=n_samples,
                    engine_type=BacktrackEngine, bksp_id=bksp_id, context=context,
                    allow_bksp=allow_bksp, fused=fused)


# -- reading a log back ----------------------------------------------------------------------------
def erase_text(tokens: Sequence[int], bksp_id: int) -> list[int]:
    """The text a token log leaves: each ``<bksp>`` removes the token before it (if any) and itself.

    >>> erase_text([5, 6, 3, 7, 3, 3, 8], bksp_id=3)
    [8]
    """
    text: list[int] = []
    for t in tokens:
        if t == bksp_id:
            if text:
                text.pop()
        else:
            text.append(t)
    return text


def training_rows(prompt: Sequence[int], tokens: Sequence[int], sampled: Sequence[bool],
                  bksp_id: int, context: str) -> list[Encoded]:
    """Rows in which every sampled log token is a target exactly once, in the context it was sampled
    in.

    ``"keep"``: one row, ``prompt + tokens``, labels on the sampled tokens. ``"erase"``: the context
    of a token is the prompt and the text surviving when it was sampled, so each ``<bksp>`` closes a
    branch: a row ``prompt + path + <bksp>`` whose targets are the path's tokens not yet a target
    and the ``<bksp>``; a last row holds the final text. Forced tokens (``sampled`` False) are
    context, not targets.

    >>> [(r.ids, r.labels) for r in training_rows([1], [5, 3, 6], [True] * 3, 3, "erase")]
    [((1, 5, 3), (-100, 5, 3)), ((1, 6), (-100, 6))]
    """
    _check_context(context)
    if len(tokens) != len(sampled):
        raise ValueError(f"tokens and sampled must have one length, got {len(tokens)} and "
                         f"{len(sampled)}")
    if not prompt:
        raise ValueError("prompt must hold at least one token (<bos>)")
    prompt = tuple(prompt)
    if context == "keep":
        return [Encoded(prompt + tuple(tokens), (IGNORE,) * len(prompt) + tuple(
            t if s else IGNORE for t, s in zip(tokens, sampled)))]
    rows, path = [], []  # path: [token, still to be a target] per surviving token

    def close(extra: tuple[int, int] | None) -> None:
        ids = prompt + tuple(t for t, _ in path) + ((extra[0],) if extra else ())
        labels = (IGNORE,) * len(prompt) + tuple(t if todo else IGNORE
                                                 for t, todo in path) + ((extra[1],) if extra
                                                                         else ())
        if any(label != IGNORE for label in labels):
            rows.append(Encoded(ids, labels))
        for entry in path:
            entry[1] = False

    for t, s in zip(tokens, sampled):
        if t == bksp_id:
            close((t, t if s else IGNORE))
            if path:
                path.pop()
        else:
            path.append([t, bool(s)])
    close(None)
    return rows
