"""A round of RLVR as training tensors: each rollout's sampled tokens as targets in the context they were sampled
in, their log-probs under a model, and the round's update replayed on them as CUDA graphs.

Chapter 10; :func:`halluc_lab.rlvr.rlvr` calls it. Sources: 001 Part 2 §3 (the policy gradient sums over the
sampled tokens), 000 §7.3 (the take-back is a token like any other). :func:`round_rows` lays a round out as
rows (:func:`halluc_lab.backtrack.training_rows`'s, for the whole round at once in the keep context) and
:func:`log_logprobs` reads a model's log-probs back in log order; :class:`CapturedUpdate` is the optional
update of ``RLVRConfig.captured_update``, one CUDA graph per optimizer step, as PPO's (:mod:`halluc_lab.rlhf`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np
import torch
from torch import nn

from halluc_lab.backtrack import training_rows
from halluc_lab.data import IGNORE, pad
from halluc_lab.evaluate import model_device
from halluc_lab.losses import kl_estimates, token_logprobs
from halluc_lab.step import Graphs, autocast
from halluc_lab.tokenizer import Tokenizer

Tensor = torch.Tensor


# -- the rows ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RoundRows:
    """Rollouts as training rows, and where each row's targets go in the rollouts' (N, M) log."""

    input_ids: Tensor  # (R, W) prompt + context + targets, padded
    labels: Tensor  # (R, W) the sampled tokens as targets, IGNORE elsewhere
    slot: Tensor  # (K,) index into the flattened (N, M) log of each target, in the rows' target order
    shape: tuple[int, int]  # (N, M): rollouts, log columns

    def to(self, device) -> "RoundRows":
        return RoundRows(self.input_ids.to(device), self.labels.to(device), self.slot.to(device), self.shape)


def round_rows(prompts: Sequence[Sequence[int]], logs: Sequence[Sequence[int]], sampled: Sequence[Sequence[bool]],
               width: int, *, bksp_id: int, context: str, pad_id: int) -> RoundRows:
    """Every sampled token of every rollout as a target in the context it was sampled in
    (:func:`~halluc_lab.backtrack.training_rows`), and each target's place in a log ``width`` columns wide.

    In the keep context a rollout's one row is its prompt and its whole log; those rows are laid out for the
    whole round at once (the rows ``training_rows`` and ``pad`` give, without a Python step per token).
    """
    if len(prompts) != len(logs) or len(sampled) != len(logs):
        raise ValueError(f"prompts, logs and sampled must be as long, got {len(prompts)}, {len(logs)}, {len(sampled)}")
    if not logs:
        raise ValueError("a round needs at least one rollout")
    if (longest := max(map(len, logs))) > width:
        raise ValueError(f"a log of {longest} tokens does not fit in width={width} columns")
    if context == "keep":
        return _keep_rows(prompts, logs, sampled, width, pad_id)
    seqs, slots = [], []
    for i, (prompt, toks, flags) in enumerate(zip(prompts, logs, sampled)):
        seqs += training_rows(prompt, toks, flags, bksp_id, context)
        slots += [i * width + j for j, s in enumerate(flags) if s]  # training_rows keeps the log's order
    batch = pad(seqs, pad_id)
    return RoundRows(batch.input_ids, batch.labels, torch.tensor(slots, dtype=torch.long), (len(logs), width))


def _ragged(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row and column of each element of rows ``lengths`` long, laid end to end."""
    row = np.repeat(np.arange(len(lengths)), lengths)
    return row, np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)


def _keep_rows(prompts, logs, sampled, width: int, pad_id: int) -> RoundRows:
    """:func:`round_rows` in the keep context (its arguments checked there): row i is ``prompts[i] + logs[i]``,
    right-padded, its targets the sampled log tokens."""
    n_prompt, n_log = (np.fromiter(map(len, x), dtype=np.int64, count=len(x)) for x in (prompts, logs))
    if not n_prompt.all():
        raise ValueError("every rollout needs a prompt of at least one token (<bos>)")
    if any(len(t) != len(s) for t, s in zip(logs, sampled)):
        raise ValueError("each rollout's tokens and sampled flags must have one length")
    R, W = len(logs), int((n_prompt + n_log).max())
    ids = np.full((R, W), pad_id, dtype=np.int64)
    labels = np.full((R, W), IGNORE, dtype=np.int64)
    row, col = _ragged(n_prompt + n_log)
    ids[row, col] = np.fromiter(chain.from_iterable(chain(p, t) for p, t in zip(prompts, logs)), dtype=np.int64,
                                count=len(row))
    row, col = _ragged(n_log)  # the logs' tokens: targets where sampled
    flags = np.fromiter(chain.from_iterable(sampled), dtype=bool, count=len(row))
    tokens = np.fromiter(chain.from_iterable(logs), dtype=np.int64, count=len(row))
    labels[row[flags], n_prompt[row[flags]] + col[flags]] = tokens[flags]
    return RoundRows(torch.from_numpy(ids), torch.from_numpy(labels), torch.from_numpy(row[flags] * width + col[flags]),
                     (R, width))


def _row_logprobs(model: nn.Module, ids: Tensor, labels: Tensor, banned: Tensor | None) -> Tensor:
    """``(R, W-1)`` float32 log π of each row's labels (0 off the targets); the ``banned`` token ids' logits are
    masked first (the policy that never emits them)."""
    logits = model(ids)  # (R, W, V)
    if banned is not None:
        logits = logits.index_fill(-1, banned, float("-inf"))
    return token_logprobs(logits, labels).float()


def log_logprobs(model: nn.Module, rows: RoundRows, banned: Sequence[int] = ()) -> Tensor:
    """``(N, M)`` log π of each rollout's sampled tokens, in log order (0 elsewhere); ``banned`` tokens' logits
    are masked first (the policy that never emits them)."""
    banned = torch.tensor(list(banned), device=rows.input_ids.device) if banned else None
    lp = _row_logprobs(model, rows.input_ids, rows.labels, banned)  # (R, W-1)
    flat = torch.zeros(rows.shape[0] * rows.shape[1], device=lp.device)
    return flat.index_put((rows.slot,), lp[rows.labels[:, 1:] != IGNORE]).view(rows.shape)


def pad_flags(flags: list[list[bool]], width: int) -> Tensor:
    """``(N, width)`` bool: each row's flags, then False."""
    out = np.zeros((len(flags), width), dtype=bool)
    row, col = _ragged(np.fromiter(map(len, flags), dtype=np.int64, count=len(flags)))
    out[row, col] = np.fromiter(chain.from_iterable(flags), dtype=bool, count=len(row))
    return torch.from_numpy(out)


class CapturedUpdate:
    """RLVR's optimizer step as one CUDA graph (``RLVRConfig.captured_update``, :mod:`halluc_lab.rlvr`), as PPO's
    update is (:mod:`halluc_lab.rlhf`): the policy's forward pass, the loss, the backward pass, clipping and AdamW,
    replayed once per minibatch on rows copied into fixed buffers; the reference's forward pass (and π_old's)
    is a second graph.

    In the keep context a rollout is one training row, its prompt then its whole log; here every row is padded
    to one width, the longest prompt plus the generation budget, so the shapes never change, and log token j
    of rollout i is read from the row's log-prob at column ``len(prompt_i) − 1 + j`` (a gather, where the eager
    path scatters by slot; the same values for the same logits). The optimizer is capturable (its rate and
    step counts on the device). The numbers differ from the eager path's in their low bits: other matrix
    shapes, and AdamW's step computed on the device.
    """

    def __init__(self, policy: nn.Module, reference: nn.Module, optimizer, loss, cfg, longest_prompt: int,
                 banned: Sequence[int], dtype: torch.dtype | None):
        """``cfg``: the run's ``RLVRConfig``; ``loss``: one of ``rlvr.POLICY_LOSSES``; ``optimizer``: capturable."""
        self.policy, self.reference, self.optimizer, self.loss, self.cfg, self.dtype = (
            policy, reference, optimizer, loss, cfg, dtype)
        self.device = model_device(policy)
        n, M = cfg.prompts_per_iteration * cfg.samples_per_prompt // cfg.minibatches, cfg.max_new_tokens
        self.width = longest_prompt + M
        z = lambda *shape, dt=torch.long: torch.zeros(*shape, dtype=dt, device=self.device)  # noqa: E731
        self.buf = {"ids": z(n, self.width), "labels": z(n, self.width), "index": z(n, M),
                    "mask": z(n, M, dt=torch.bool), "adv": z(n, dt=torch.float32), "ref": z(n, M, dt=torch.float32),
                    "old": z(n, M, dt=torch.float32)}
        self.banned = torch.tensor(list(banned), dtype=torch.long, device=self.device) if banned else None
        self.graphs = Graphs()  # "score" and "update"

    def rows(self, prompts: list, logs: list, sampled: list, tok: Tokenizer) -> dict:
        """The ids, labels and gather index of a minibatch's rollouts, on the device, at the fixed width."""
        r = round_rows(prompts, logs, sampled, self.cfg.max_new_tokens, bksp_id=tok.bksp_id, context="keep",
                       pad_id=tok.pad_id)
        extra = (0, self.width - r.input_ids.shape[1])
        index = torch.tensor([len(p) - 1 for p in prompts])[:, None] + torch.arange(self.cfg.max_new_tokens)
        return {"ids": torch.nn.functional.pad(r.input_ids, extra, value=tok.pad_id).to(self.device),
                "labels": torch.nn.functional.pad(r.labels, extra, value=IGNORE).to(self.device),
                "index": index.to(self.device)}

    def logprobs(self, model: nn.Module, rows: dict) -> Tensor:
        """``(n, M)`` log π of each rollout's log tokens (0 where not sampled or past the log)."""
        return _row_logprobs(model, rows["ids"], rows["labels"], self.banned).gather(1, rows["index"])

    @torch.no_grad()
    def _score_body(self) -> tuple[Tensor, Tensor]:
        """π_ref's log-probs of the rows in the buffers, and π_old's (the policy's, needed before any step when a
        round takes several)."""
        with autocast(self.device, self.dtype):
            ref = self.logprobs(self.reference, self.buf)
            return ref, self.logprobs(self.policy, self.buf) if self.cfg.minibatches > 1 else ref

    def _update_body(self) -> Tensor:
        b, cfg = self.buf, self.cfg
        with autocast(self.device, self.dtype):
            logp = self.logprobs(self.policy, b)
        kl = kl_estimates(logp, b["ref"], b["mask"]).k3
        old = logp.detach() if cfg.minibatches == 1 else b["old"]
        value = self.loss(logp, old, b["adv"], b["mask"], kl=kl if cfg.beta else None, beta=cfg.beta,
                          max_tokens=cfg.max_new_tokens)
        value.backward()
        torch.nn.utils.clip_grad_norm_(self.policy.parameters(), cfg.grad_clip)
        self.optimizer.step()
        return kl.detach().sum()

    def round(self, prompts: list[list], samples, parts: list[Tensor], advantages: Tensor, mask: Tensor,
              tok: Tokenizer) -> Tensor:
        """One round's updates, a minibatch ``parts[k]`` (rollout indices; ``prompts[k]`` their prompts) at a time,
        from ``samples`` (an ``rlvr.RoundSamples``: its ``logs`` and ``sampled``); the sum of the k3 KL estimates
        over the round's tokens, on the device."""
        rows = [self.rows(p, [samples.logs[i] for i in part], [samples.sampled[i] for i in part], tok)
                for p, part in zip(prompts, parts)]
        scored = []
        for r in rows:  # before any step: π_ref, and π_old if it differs
            self._load(r)
            scored.append([x.clone() for x in self.graphs.run("score", self._score_body)])
        self.policy.train()
        kl_sum = torch.zeros((), device=self.device)
        for part, r, (ref, old) in zip(parts, rows, scored):
            part = part.to(self.device)
            self._load({**r, "mask": mask[part], "adv": advantages[part], "ref": ref, "old": old})
            kl_sum += self.graphs.run("update", self._update_body, [self.optimizer])
        return kl_sum

    def _load(self, values: dict) -> None:
        for name, value in values.items():
            self.buf[name].copy_(value)
