"""A round of RLVR as training tensors: each rollout's sampled tokens as targets in the context they
were sampled in, their log-probs under a model, and the round's update replayed on them as CUDA
graphs.

Chapter 10; :func:`halluc_lab.stages.rlvr.rlvr` calls it. Sources: 001 Part 2 §3 (the policy
gradient sums over the sampled tokens), 000 §7.3 (the take-back is a token like any other).
:func:`round_rows` lays a round out as rows
(:func:`halluc_lab.generation.backtrack.training_rows`'s, for the whole round at once in the keep
context) and :func:`log_logprobs` reads a model's log-probs back in log order; :func:`keep_rows`
lays the keep context's rows out from padded tensors wherever they are. :class:`CapturedUpdate` is
the optional update of ``RLVRConfig.captured_update``, one CUDA graph per optimizer step, as PPO's
(:mod:`halluc_lab.stages.rlhf`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np
import torch
from torch import nn

from halluc_lab.generation.backtrack import training_rows
from halluc_lab.training.data import IGNORE, pad
from halluc_lab.device import to_device
from halluc_lab.evaluation.evaluate import model_device
from halluc_lab.training.losses import kl_estimates, token_logprobs
from halluc_lab.training.step import Graphs, autocast

Tensor = torch.Tensor


# -- the rows --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RoundRows:
    """Rollouts as training rows, and where each row's targets go in the rollouts' (N, M) log."""

    input_ids: Tensor  # (R, W) prompt + context + targets, padded
    labels: Tensor  # (R, W) the sampled tokens as targets, IGNORE elsewhere
    # (K,) index into the flattened (N, M) log of each target, in the rows' target order
    slot: Tensor
    shape: tuple[int, int]  # (N, M): rollouts, log columns

    def to(self, device) -> "RoundRows":
        """The rows on ``device``, uploaded without waiting for it
        (:func:`halluc_lab.device.to_device`)."""
        return RoundRows(*(to_device(t, device) for t in (self.input_ids, self.labels, self.slot)),
                         self.shape)


def round_rows(prompts: Sequence[Sequence[int]], logs: Sequence[Sequence[int]],
               sampled: Sequence[Sequence[bool]], width: int, *, bksp_id: int, context: str,
               pad_id: int) -> RoundRows:
    """Every sampled token of every rollout as a target in the context it was sampled in
    (:func:`~halluc_lab.generation.backtrack.training_rows`), and each target's place in a log
    ``width`` columns wide.

    In the keep context a rollout's one row is its prompt and its whole log; those rows are laid out
    for the whole round at once (the rows ``training_rows`` and ``pad`` give, without a Python step
    per token).
    """
    if len(prompts) != len(logs) or len(sampled) != len(logs):
        raise ValueError(f"prompts, logs and sampled must be as long, got {len(prompts)}, "
                         f"{len(logs)}, {len(sampled)}")
    if not logs:
        raise ValueError("a round needs at least one rollout")
    if (longest := max(map(len, logs))) > width:
        raise ValueError(f"a log of {longest} tokens does not fit in width={width} columns")
    if context == "keep":
        return _keep_rows(prompts, logs, sampled, width, pad_id)
    seqs, slots = [], []
    for i, (prompt, toks, flags) in enumerate(zip(prompts, logs, sampled)):
        seqs += training_rows(prompt, toks, flags, bksp_id, context)
        # training_rows keeps the log's order
        slots += [i * width + j for j, s in enumerate(flags) if s]
    batch = pad(seqs, pad_id)
    return RoundRows(batch.input_ids, batch.labels, torch.tensor(slots, dtype=torch.long),
                     (len(logs), width))


def _ragged(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row and column of each element of rows ``lengths`` long, laid end to end."""
    row = np.repeat(np.arange(len(lengths)), lengths)
    return row, np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)


def _keep_rows(prompts, logs, sampled, width: int, pad_id: int) -> RoundRows:
    """:func:`round_rows` in the keep context (its arguments checked there): row i is
    ``prompts[i] + logs[i]``, right-padded, its targets the sampled log tokens."""
    n_prompt, n_log = (np.fromiter(map(len, x), dtype=np.int64, count=len(x))
                       for x in (prompts, logs))
    if not n_prompt.all():
        raise ValueError("every rollout needs a prompt of at least one token (<bos>)")
    if any(len(t) != len(s) for t, s in zip(logs, sampled)):
        raise ValueError("each rollout's tokens and sampled flags must have one length")
    flags = _padded(sampled, n_log, bool)
    ids, labels = keep_rows(_padded(prompts, n_prompt, np.int64), torch.from_numpy(n_prompt),
                            _padded(logs, n_log, np.int64), torch.from_numpy(n_log), flags,
                            int((n_prompt + n_log).max()), pad_id)
    row, col = flags.nonzero(as_tuple=True)  # row-major: each rollout's sampled tokens in log order
    return RoundRows(ids, labels, row * width + col, (len(logs), width))


def _padded(rows, lengths: np.ndarray, dtype, width: int | None = None) -> Tensor:
    """Ragged lists ``lengths`` long as a right-padded (zeros) tensor ``width`` columns wide
    (default: the longest, at least one)."""
    out = np.zeros((len(rows), width or max(1, int(lengths.max()))), dtype=dtype)
    row, col = _ragged(lengths)
    out[row, col] = np.fromiter(chain.from_iterable(rows), dtype=dtype, count=len(row))
    return torch.from_numpy(out)


def keep_rows(prompts: Tensor, n_prompt: Tensor, logs: Tensor, n_log: Tensor, sampled: Tensor,
              width: int, pad_id: int) -> tuple[Tensor, Tensor]:
    """The keep context's rows, computed where the tensors are (on the device, no step on the host):
    row i is ``prompts[i, :n_prompt[i]]`` then ``logs[i, :n_log[i]]``, right-padded with ``pad_id``
    to ``width`` columns; its labels are the log tokens ``sampled`` marks, IGNORE elsewhere.
    ``prompts`` ``(N, P)`` and ``logs``, ``sampled`` ``(N, M)`` may hold anything past their
    lengths; every row must fit in ``width``.
    """
    col = torch.arange(width, device=prompts.device)[None, :]  # (1, W)
    j = col - n_prompt[:, None]  # (N, W) the log column a row column holds, if 0 <= j < n_log
    in_log = (j >= 0) & (j < n_log[:, None])
    at = j.clamp(0, logs.shape[1] - 1)
    from_prompt = prompts.gather(1, col.clamp(max=prompts.shape[1] - 1).expand(len(prompts), -1))
    ids = torch.where(j < 0, from_prompt, torch.where(in_log, logs.gather(1, at), pad_id))
    return ids, torch.where(in_log & sampled.gather(1, at), ids, IGNORE)


def _row_logprobs(model: nn.Module, ids: Tensor, labels: Tensor, banned: Tensor | None) -> Tensor:
    """``(R, W-1)`` float32 log π of each row's labels (0 off the targets); the ``banned`` token
    ids' logits are masked first (the policy that never emits them)."""
    logits = model(ids)  # (R, W, V)
    if banned is not None:
        logits = logits.index_fill(-1, banned, float("-inf"))
    return token_logprobs(logits, labels).float()


def log_logprobs(model: nn.Module, rows: RoundRows, banned: Sequence[int] = ()) -> Tensor:
    """``(N, M)`` log π of each rollout's sampled tokens, in log order (0 elsewhere); ``banned``
    tokens' logits are masked first (the policy that never emits them)."""
    banned = to_device(list(banned), rows.input_ids.device, torch.long) if banned else None
    lp = _row_logprobs(model, rows.input_ids, rows.labels, banned)  # (R, W-1)
    flat = torch.zeros(rows.shape[0] * rows.shape[1], device=lp.device)
    return flat.index_put((rows.slot,), lp[rows.labels[:, 1:] != IGNORE]).view(rows.shape)


def pad_flags(flags: list[list[bool]], width: int) -> Tensor:
    """``(N, width)`` bool: each row's flags, then False."""
    return _padded(flags, np.fromiter(map(len, flags), dtype=np.int64, count=len(flags)), bool,
                   width)


class CapturedUpdate:
    """RLVR's optimizer step as one CUDA graph (``RLVRConfig.captured_update``,
    :mod:`halluc_lab.stages.rlvr`), as PPO's update is (:mod:`halluc_lab.stages.rlhf`): the policy's
    forward pass, the loss, the backward pass, clipping and AdamW, replayed once per minibatch on
    rows copied into fixed buffers; the reference's forward pass (and π_old's) is a second graph.

    In the keep context a rollout is one training row, its prompt then its whole log; here every row
    is padded to one width, the longest prompt plus the generation budget, so the shapes never
    change, and log token j of rollout i is read from the row's log-prob at column
    ``len(prompt_i) − 1 + j`` (a gather, where the eager path scatters by slot; the same values for
    the same logits). The optimizer is capturable (its rate and step counts on the device). The
    numbers differ from the eager path's in their low bits: other matrix shapes, and AdamW's step
    computed on the device.

    A round is :meth:`score`, then :meth:`update`. The rows are laid out on the device from the
    rollouts' tensors (:func:`keep_rows`), and the scoring needs no reward, so
    :func:`~halluc_lab.stages.rlvr.rlvr` queues it before the host reads the rollouts back and
    judges them: the device scores while the host works.
    """

    def __init__(self, policy: nn.Module, reference: nn.Module, optimizer, loss, cfg,
                 prompts: Sequence[Sequence[int]], banned: Sequence[int], dtype: torch.dtype | None,
                 pad_id: int):
        """``cfg``: the run's ``RLVRConfig``; ``loss``: one of ``rlvr.POLICY_LOSSES``;
        ``optimizer``: capturable; ``prompts``: the run's (kept on the device, where the rows are
        laid out)."""
        self.policy, self.reference, self.optimizer = policy, reference, optimizer
        self.loss, self.cfg, self.dtype, self.pad_id = loss, cfg, dtype, pad_id
        self.device = model_device(policy)
        n_prompt = np.fromiter(map(len, prompts), dtype=np.int64, count=len(prompts))
        # (P, longest prompt)
        self.prompts = to_device(_padded(prompts, n_prompt, np.int64), self.device)
        self.n_prompt = to_device(torch.from_numpy(n_prompt), self.device)  # (P,)
        n = cfg.prompts_per_iteration * cfg.samples_per_prompt // cfg.minibatches
        M = cfg.max_new_tokens
        self.width = int(n_prompt.max()) + M
        z = lambda *shape, dt=torch.long: torch.zeros(*shape, dtype=dt,
                                                      device=self.device)  # noqa: E731
        self.buf = {"ids": z(n, self.width), "labels": z(n, self.width), "index": z(n, M),
                    "mask": z(n, M, dt=torch.bool), "adv": z(n, dt=torch.float32),
                    "ref": z(n, M, dt=torch.float32), "old": z(n, M, dt=torch.float32)}
        self.banned = (torch.tensor(list(banned), dtype=torch.long, device=self.device) if banned
                       else None)
        self.graphs = Graphs()  # "score" and "update"
        # per minibatch: rollouts, rows, π_ref, π_old
        self._scored: list[tuple[Tensor, dict, Tensor, Tensor]] = []

    def rows(self, which: Tensor, out) -> dict:
        """The ids, labels and gather index of rollouts ``out`` (a
        :class:`~halluc_lab.generation.backtrack.Rollout` on the device) of the prompts ``which``
        (N,), at the fixed width, laid out on the device."""
        ids, labels = keep_rows(self.prompts[which], self.n_prompt[which], out.tokens, out.lengths,
                                out.sampled_mask, self.width, self.pad_id)
        index = self.n_prompt[which, None] - 1 + torch.arange(self.cfg.max_new_tokens,
                                                              device=self.device)
        return {"ids": ids, "labels": labels, "index": index}

    def logprobs(self, model: nn.Module, rows: dict) -> Tensor:
        """``(n, M)`` log π of each rollout's log tokens (0 where not sampled or past the log)."""
        return _row_logprobs(model, rows["ids"], rows["labels"], self.banned).gather(1,
                                                                                     rows["index"])

    @torch.no_grad()
    def _score_body(self) -> tuple[Tensor, Tensor]:
        """π_ref's log-probs of the rows in the buffers, and π_old's (the policy's, needed before
        any step when a round takes several)."""
        with autocast(self.device, self.dtype):
            ref = self.logprobs(self.reference, self.buf)
            return ref, self.logprobs(self.policy, self.buf) if self.cfg.minibatches > 1 else ref

    def _update_body(self) -> Tensor:
        b, cfg = self.buf, self.cfg
        with autocast(self.device, self.dtype):
            logp = self.logprobs(self.policy, b)
        kl = kl_estimates(logp, b["ref"], b["mask"]).k3
        old = logp.detach() if cfg.minibatches == 1 else b["old"]
        value = self.loss(logp, old, b["adv"], b["mask"], kl=kl if cfg.beta else None,
                          beta=cfg.beta, max_tokens=cfg.max_new_tokens)
        value.backward()
        torch.nn.utils.clip_grad_norm_(self.policy.parameters(), cfg.grad_clip)
        self.optimizer.step()
        return kl.detach().sum()

    def score(self, todo: Sequence[int], out, parts: Sequence[Tensor]) -> None:
        """Queue a round's scoring on the device: ``out`` (a
        :class:`~halluc_lab.generation.backtrack.Rollout` on the device) holds G rollouts of each
        prompt ``todo[k]`` (indices into the run's prompts), prompt-major; for each minibatch
        ``parts[k]`` (rollout indices), before any step, π_ref's log-probs, and π_old's if they
        differ. Nothing waits for the device, so the host can judge the rollouts meanwhile;
        :meth:`update` follows."""
        # (N,) prompt of each
        which = to_device(todo, self.device).repeat_interleave(self.cfg.samples_per_prompt)
        rows, self._scored = self.rows(which, out), []
        for part in parts:
            part = to_device(part, self.device)
            r = {name: value[part] for name, value in rows.items()}
            self._load(r)
            self._scored.append((part, r,
                                 *[x.clone() for x in self.graphs.run("score", self._score_body)]))

    def update(self, advantages: Tensor, mask: Tensor) -> Tensor:
        """The round's optimizer steps, one per minibatch :meth:`score` queued, from each rollout's
        advantage ``(N,)`` and the mask of its sampled tokens ``(N, M)``, on the device; the sum of
        the k3 KL estimates over the round's tokens, on the device."""
        if not self._scored:
            raise RuntimeError("score() a round before update()")
        self.policy.train()
        kl_sum = torch.zeros((), device=self.device)
        for part, r, ref, old in self._scored:
            self._load({**r, "mask": mask[part], "adv": advantages[part], "ref": ref, "old": old})
            kl_sum += self.graphs.run("update", self._update_body, [self.optimizer])
        self._scored = []
        return kl_sum

    def _load(self, values: dict) -> None:
        for name, value in values.items():
            self.buf[name].copy_(value)
