"""Supervised fine-tuning data and loss: masking, packing, label smoothing, backspace demos.

Chapter 8 (and chapter 7's pre-training, which uses the same loss on every token).
Sources: 000 §5.2–5.4 (the SFT loss, cross-entropy, completion-only masking with label
-100), §5.6 (causal language modelling), §5.7 (packing, accumulation); 001 Part 1 eq. (9)
and Listing 1; 002 ("Padding": ``ignore_index``; "Scheduled Sampling"); 004 §3.7 (label
smoothing); 000 §7.3 (backtracking: the backspace demonstrations).

Conventions. A sequence is ``<bos> prompt completion <eos>``. Labels follow Hugging Face:
``labels`` has the shape of ``input_ids`` and ``labels[t]`` is the target of the logits at
``t - 1`` (the shift happens inside :func:`causal_lm_loss`); -100 means "no loss here".
``<bos>`` is never a target, so in a packed row the first token of each sequence is -100
and no sequence is asked to predict its neighbour.

Departures from the documents:

- 000 §5.7 writes accumulation as the mean of K micro-batch gradients; that equals the big
  batch's gradient only when the K micro-batches hold equally many target tokens.
  :mod:`halluc_lab.train` instead divides every micro-batch's *summed* loss by the whole
  batch's token count, which is exactly the big batch's mean-token loss (tested).
- Scheduled sampling (002, after Bengio et al. 2015) is done in one parallel pass: the
  model predicts every position from the gold prefix and some completion inputs are
  replaced by those predictions (the two-pass variant of Mihaylova & Martins, 2019); an
  RNN would feed its own samples step by step.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F

from halluc_lab.tasks.base import Example, Task
from halluc_lab.tokenizer import SPECIAL_TOKENS, Tokenizer

IGNORE = -100  # the ignore_index of F.cross_entropy (000 §5.4)


@dataclass(frozen=True)
class Encoded:
    """One tokenised training sequence."""

    ids: tuple[int, ...]  # <bos> ... <eos>
    labels: tuple[int, ...]  # same length; IGNORE where there is no loss


@dataclass(frozen=True)
class Batch:
    """Rows of token ids with their labels; padded or packed."""

    input_ids: torch.Tensor  # (B, T) int64
    labels: torch.Tensor  # (B, T) int64, IGNORE where there is no loss
    position_ids: torch.Tensor | None = None  # (B, T) positions, restarting at 0 in each packed sequence
    segment_ids: torch.Tensor | None = None  # (B, T) which packed sequence a token is in (1, 2, ...; 0 = padding)

    def __getitem__(self, idx) -> Batch:
        pick = lambda t: None if t is None else t[idx]
        return Batch(self.input_ids[idx], self.labels[idx], pick(self.position_ids), pick(self.segment_ids))

    def to(self, device: torch.device | str) -> Batch:
        """The same batch on another device."""
        move = lambda t: None if t is None else t.to(device, non_blocking=True)
        return Batch(move(self.input_ids), move(self.labels), move(self.position_ids), move(self.segment_ids))

    def model_kwargs(self) -> dict:
        """The keyword arguments a model takes besides ``input_ids`` (only those that are set)."""
        out = {}
        if self.position_ids is not None:
            out["position_ids"] = self.position_ids
        if self.segment_ids is not None:
            out["segment_ids"] = self.segment_ids
        return out

    @property
    def n_targets(self) -> torch.Tensor:
        """How many tokens carry a loss (a 0-d tensor; no host sync)."""
        return (self.labels[:, 1:] != IGNORE).sum()


# -- labels (000 §5.4) ---------------------------------------------------------------------------
def encode_example(tok: Tokenizer, example: Example, completion_only: bool = True) -> Encoded:
    """``<bos> prompt completion <eos>`` with labels on the completion and ``<eos>`` only
    (000 Definition 9) or, with ``completion_only=False``, on every token after ``<bos>``.

    >>> tok = Tokenizer(["1", "2", "+", "="])
    >>> encode_example(tok, Example("1 + 1 =", "2")).labels
    (-100, -100, -100, -100, -100, 6, 2)
    """
    prompt, completion = tok.encode(example.prompt), tok.encode(example.completion)
    ids = (tok.bos_id, *prompt, *completion, tok.eos_id)
    n_masked = 1 + len(prompt) if completion_only else 1
    return Encoded(ids, (IGNORE,) * n_masked + ids[n_masked:])


def encode_document(tok: Tokenizer, document: str) -> Encoded:
    """A pre-training document ``<bos> text <eos>``: every token after ``<bos>`` is a target (eq. 9)."""
    ids = (tok.bos_id, *tok.encode(document), tok.eos_id)
    return Encoded(ids, (IGNORE, *ids[1:]))


# -- batching: padding and packing (000 §5.7, 002 "Padding") ----------------------------------------
def pad(seqs: Sequence[Encoded], pad_id: int, length: int | None = None) -> Batch:
    """One sequence per row, right-padded with ``pad_id`` (labels IGNORE on padding)."""
    if not seqs:
        raise ValueError("seqs must not be empty")
    longest = max(len(s.ids) for s in seqs)
    length = longest if length is None else length
    if length < longest:
        raise ValueError(f"length must be >= the longest sequence ({longest}), got {length}")
    ids = torch.tensor([list(s.ids) + [pad_id] * (length - len(s.ids)) for s in seqs])  # (B, T)
    labels = torch.tensor([list(s.labels) + [IGNORE] * (length - len(s.ids)) for s in seqs])  # (B, T)
    return Batch(ids, labels)


def pack(seqs: Sequence[Encoded], length: int, pad_id: int) -> Batch:
    """Pack sequences into rows of ``length`` tokens: ``[seq1, seq2, ..., pad]`` (000 §5.7).

    First fit, in order: each sequence goes into the first row with room (rows too full for
    the shortest sequence are no longer searched). ``segment_ids``
    number the sequences of a row from 1 (padding is 0) so the model attends only within a
    sequence, and ``position_ids`` restart at 0 for each, so a packed sequence is computed
    exactly as it would be alone.
    """
    if not seqs:
        raise ValueError("seqs must not be empty")
    if max(len(s.ids) for s in seqs) > length:
        raise ValueError(f"length must be >= the longest sequence ({max(len(s.ids) for s in seqs)}), got {length}")
    shortest = min(len(s.ids) for s in seqs)
    rows: list[list[Encoded]] = []
    room: list[int] = []
    open_rows: list[int] = []  # rows that can still take the shortest sequence, in order
    for s in seqs:
        r = next((r for r in open_rows if room[r] >= len(s.ids)), None)
        if r is None:
            r = len(rows)
            rows.append([])
            room.append(length)
            open_rows.append(r)
        rows[r].append(s)
        room[r] -= len(s.ids)
        if room[r] < shortest:
            open_rows.remove(r)
    ids, labels, pos, seg = [], [], [], []  # built as lists: one tensor per field, not per sequence
    for row in rows:
        r_ids, r_lab, r_pos, r_seg = [], [], [], []
        for k, s in enumerate(row):
            r_ids += s.ids
            r_lab += s.labels
            r_pos += range(len(s.ids))
            r_seg += [k + 1] * len(s.ids)
        n_pad = length - len(r_ids)
        ids.append(r_ids + [pad_id] * n_pad)
        labels.append(r_lab + [IGNORE] * n_pad)
        pos.append(r_pos + list(range(n_pad)))  # padding: harmless positions, no loss
        seg.append(r_seg + [0] * n_pad)
    as_tensor = lambda x: torch.tensor(x, dtype=torch.long)  # (B, T)
    return Batch(as_tensor(ids), as_tensor(labels), as_tensor(pos), as_tensor(seg))


def batches(rows: Batch, batch_size: int, seed: int) -> Callable[[int], Batch]:
    """A function ``step -> Batch`` drawing ``batch_size`` rows, each epoch in a fresh order.

    The order depends only on ``(seed, epoch)``, so step ``s`` always gets the same rows:
    a resumed run sees exactly the data it would have seen (:mod:`halluc_lab.train`).
    """
    n = rows.input_ids.shape[0]
    if not isinstance(batch_size, int) or not 1 <= batch_size <= n:
        raise ValueError(f"batch_size must be an int in [1, {n}] (the number of rows), got {batch_size!r}")
    per_epoch = n // batch_size

    @lru_cache(maxsize=2)
    def order(epoch: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        return torch.randperm(n, generator=g).to(rows.input_ids.device)  # (N,)

    def get(step: int) -> Batch:
        epoch, k = divmod(step, per_epoch)
        return rows[order(epoch)[k * batch_size:(k + 1) * batch_size]]

    return get


# -- the loss (000 §5.2–5.5, 001 eq. 9, 004 §3.7) -------------------------------------------------
def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor, *, label_smoothing: float = 0.0,
                   reduction: str = "mean") -> torch.Tensor:
    """Next-token cross-entropy: logits at t score ``labels[t + 1]``; IGNORE labels are skipped.

    Args:
        logits: (B, T, V); computed in float32 at least.
        labels: (B, T) ids or IGNORE.
        label_smoothing: ε of 004 §3.7: the target becomes (1 - ε)·onehot + ε/V.
        reduction: "mean" over target tokens (000 §5.2 per token) or "sum".

    Example:
        >>> logits = torch.zeros(1, 3, 5); labels = torch.tensor([[-100, 2, 4]])
        >>> round(float(causal_lm_loss(logits, labels)), 4)   # log 5
        1.6094
    """
    if logits.dim() != 3 or labels.shape != logits.shape[:2]:
        raise ValueError(f"logits must be (B, T, V) and labels (B, T); got {tuple(logits.shape)} "
                         f"and {tuple(labels.shape)}")
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing!r}")
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    z = logits[:, :-1].flatten(0, 1)  # (B*(T-1), V)
    z = z.float() if z.dtype in (torch.float16, torch.bfloat16) else z
    y = labels[:, 1:].flatten()  # (B*(T-1),)
    return F.cross_entropy(z, y, ignore_index=IGNORE, label_smoothing=label_smoothing, reduction=reduction)


def label_smoothed_nll(logits: torch.Tensor, targets: torch.Tensor, epsilon: float) -> torch.Tensor:
    """Reference: the mean of -Σ_k q'(k) log p(k) with q' = (1 - ε)δ_{k,y} + ε/K (004 §3.7).

    logits (N, K), targets (N,) with no IGNORE; the readable version :func:`causal_lm_loss` agrees with.
    """
    logp = torch.log_softmax(logits, dim=-1)  # (N, K)
    k = logits.shape[-1]
    q = torch.full_like(logp, epsilon / k)  # (N, K) the uniform part ε u(k), u = 1/K
    q.scatter_add_(1, targets[:, None], torch.full_like(logp[:, :1], 1.0 - epsilon))  # + (1 - ε) δ_{k,y}
    return -(q * logp).sum(-1).mean()


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
    ('<bos> 1 + 1 = 1 <bksp> 2 <eos>', '<bksp> 2 <eos>')
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


# -- scheduled sampling (002) ------------------------------------------------------------------
@torch.no_grad()
def scheduled_sampling(model: torch.nn.Module, batch: Batch, rate: float, generator: torch.Generator,
                       temperature: float = 1.0) -> Batch:
    """Replace each completion input token, with probability ``rate``, by the model's own sample.

    One parallel pass predicts every position from the gold prefix; labels stay gold, so
    the model learns to continue correctly from a context holding its own mistakes (002,
    "Scheduled Sampling": start low, increase over training).
    """
    from halluc_lab.sampling import sample

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


# -- evaluation: free-running against teacher-forced (000 §7.1) -------------------------------------
def complete(model: torch.nn.Module, tok: Tokenizer, prompts: Sequence[str], max_new_tokens: int, *,
             greedy: bool = True, temperature: float = 1.0, generator: torch.Generator | None = None,
             dtype: torch.dtype | None = None, chunk: int = 512) -> list[str]:
    """Free-running completions of ``<bos> prompt`` through :func:`halluc_lab.engine.generate`,
    stopped at ``<eos>`` (kept in the text), ``chunk`` prompts at a time."""
    from halluc_lab.engine import generate

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
