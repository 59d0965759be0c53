"""Training data as tensors: tokenised sequences, padded or packed batches, seeded batch streams.

Chapters 7–10 all train on :class:`Batch` es made here: pre-training documents (chapter 7), SFT
examples (chapter 8), preference pairs and RL rollouts (chapters 9–10). Sources: 000 §5.4
(completion-only masking with label -100), §5.7 (packing); 001 Part 1 eq. (9); 002 ("Padding":
``ignore_index``).

Conventions. A sequence is ``<bos> prompt completion <eos>``. Labels follow Hugging Face:
``labels`` has the shape of ``input_ids`` and ``labels[t]`` is the target of the logits at
``t - 1`` (the shift happens inside :func:`halluc_lab.training.losses.causal_lm_loss`);
:data:`IGNORE` (-100) means "no loss here". ``<bos>`` is never a target, so in a packed row the
first token of each sequence is IGNORE and no sequence is asked to predict its neighbour.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from numbers import Integral

import torch

from halluc_lab.training.losses import IGNORE
from halluc_lab.tasks.base import Example
from halluc_lab.model.tokenizer import Tokenizer

__all__ = ["IGNORE", "Encoded", "Batch", "encode_example", "encode_document", "pad", "pack",
           "batches", "rollout_batch"]


@dataclass(frozen=True)
class Encoded:
    """One tokenised training sequence."""

    ids: tuple[int, ...]  # <bos> ... <eos>
    labels: tuple[int, ...]  # same length; IGNORE where there is no loss

    def __post_init__(self):
        if len(self.ids) != len(self.labels):
            raise ValueError(f"labels must have one entry per id: {len(self.ids)} ids, "
                             f"{len(self.labels)} labels")


@dataclass(frozen=True)
class Batch:
    """Rows of token ids with their labels; padded or packed."""

    input_ids: torch.Tensor  # (B, T) int64
    labels: torch.Tensor  # (B, T) int64, IGNORE where there is no loss
    # (B, T) positions, restarting at 0 in each packed sequence
    position_ids: torch.Tensor | None = None
    # (B, T) which packed sequence a token is in (1, 2, ...; 0 = padding)
    segment_ids: torch.Tensor | None = None

    def __getitem__(self, idx) -> Batch:
        pick = lambda t: None if t is None else t[idx]
        return Batch(self.input_ids[idx], self.labels[idx], pick(self.position_ids),
                     pick(self.segment_ids))

    def to(self, device: torch.device | str) -> Batch:
        """The same batch on another device."""
        move = lambda t: None if t is None else t.to(device, non_blocking=True)
        return Batch(move(self.input_ids), move(self.labels), move(self.position_ids),
                     move(self.segment_ids))

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
    """A pre-training document ``<bos> text <eos>``: every token after ``<bos>`` is a target (eq.
    9)."""
    ids = (tok.bos_id, *tok.encode(document), tok.eos_id)
    return Encoded(ids, (IGNORE, *ids[1:]))


# -- batching: padding and packing (000 §5.7, 002 "Padding") ---------------------------------------
def _check_seqs(seqs: Sequence[Encoded], pad_id: int) -> int:
    """The longest sequence's length; raise for no sequences, a non-Encoded one or a bad pad_id."""
    if not seqs:
        raise ValueError("seqs must not be empty")
    if bad := [i for i, s in enumerate(seqs) if not isinstance(s, Encoded)]:
        kind = type(seqs[bad[0]]).__name__
        raise TypeError(f"seqs must hold Encoded sequences; seqs[{bad[0]}] is {kind}")
    _check_int("pad_id", pad_id)
    return max(len(s.ids) for s in seqs)


def _check_int(name: str, value: object, low: int = 0) -> int:
    """``value`` as an int (numpy integers too), or a ValueError naming it and the bound."""
    if isinstance(value, bool) or not isinstance(value, Integral) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return int(value)


def _ids_tensor(rows: list[list[int]], what: str) -> torch.Tensor:
    """``rows`` as a (B, T) int64 tensor; a ValueError if they hold anything but integers."""
    t = torch.tensor(rows)
    if t.dtype != torch.long:
        raise ValueError(f"{what} must be integer token ids, got {t.dtype} values")
    return t


def pad(seqs: Sequence[Encoded], pad_id: int, length: int | None = None) -> Batch:
    """One sequence per row, right-padded with ``pad_id`` (labels IGNORE on padding)."""
    longest = _check_seqs(seqs, pad_id)
    length = longest if length is None else _check_int("length", length, 1)
    if length < longest:
        raise ValueError(f"length must be >= the longest sequence ({longest}), got {length}")
    fill = lambda s: length - len(s.ids)
    ids = _ids_tensor([list(s.ids) + [pad_id] * fill(s) for s in seqs], "ids")  # (B, T)
    labels = _ids_tensor([list(s.labels) + [IGNORE] * fill(s) for s in seqs], "labels")  # (B, T)
    return Batch(ids, labels)


def pack(seqs: Sequence[Encoded], length: int, pad_id: int) -> Batch:
    """Pack sequences into rows of ``length`` tokens: ``[seq1, seq2, ..., pad]`` (000 §5.7).

    First fit, in order: each sequence goes into the first row with room. ``segment_ids``
    number the sequences of a row from 1 (padding is 0) so the model attends only within a
    sequence, and ``position_ids`` restart at 0 for each, so a packed sequence is computed
    exactly as it would be alone.

    The first row with room is found in O(log n) by a max-tree over the rooms of every row there
    could be (one per sequence, an unused row has a whole row's room): the leftmost row whose room
    fits is the first existing one that does, or else the next new row — a full-scale corpus of
    ~200,000 documents packs in seconds, where scanning the open rows took the better part of a
    minute.
    """
    longest, length = _check_seqs(seqs, pad_id), _check_int("length", length, 1)
    if longest > length:
        raise ValueError(f"length must be >= the longest sequence ({longest}), got {length}")
    size = 1 << max(1, (len(seqs) - 1).bit_length())  # leaves: rows 0 .. size − 1
    # tree[i]: the most room of any row under node i (leaf size + r: row r)
    tree = [length] * (2 * size)
    rows: list[list[Encoded]] = []
    for s in seqs:
        need, i = len(s.ids), 1
        # down to the leftmost leaf with room >= need (the root always has: longest <= length)
        while i < size:
            i = 2 * i if tree[2 * i] >= need else 2 * i + 1
        r = i - size
        if r == len(rows):
            rows.append([])
        rows[r].append(s)
        tree[i] -= need
        while i > 1:
            i //= 2
            tree[i] = max(tree[2 * i], tree[2 * i + 1])
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
    ids, labels = _ids_tensor(ids, "ids"), _ids_tensor(labels, "labels")  # (B, T)
    return Batch(ids, labels, torch.tensor(pos), torch.tensor(seg))


def batches(rows: Batch, batch_size: int, seed: int) -> Callable[[int], Batch]:
    """A function ``step -> Batch`` drawing ``batch_size`` rows, each epoch in a fresh order.

    The order depends only on ``(seed, epoch)``, so step ``s`` always gets the same rows:
    a resumed run sees exactly the data it would have seen (:mod:`halluc_lab.training.train`).
    """
    n = rows.input_ids.shape[0]
    size = batch_size
    if isinstance(size, bool) or not isinstance(size, Integral) or not 1 <= size <= n:
        raise ValueError(f"batch_size must be an int in [1, {n}] (the number of rows), got "
                         f"{batch_size!r}")
    batch_size, seed = int(batch_size), _check_int("seed", seed)
    per_epoch = n // batch_size

    @lru_cache(maxsize=2)
    def order(epoch: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        return torch.randperm(n, generator=g).to(rows.input_ids.device)  # (N,)

    def get(step: int) -> Batch:
        epoch, k = divmod(_check_int("step", step), per_epoch)
        return rows[order(epoch)[k * batch_size:(k + 1) * batch_size]]

    return get


# -- rollouts (chapters 9–10) ----------------------------------------------------------------------
def prompt_rounds(n: int, per_round: int, generator: torch.Generator) -> Iterator[list[int]]:
    """Endless rounds of ``per_round`` indices into ``n`` prompts: seeded permutations laid end to
    end, so every prompt comes once before any comes again (PPO's and RLVR's rounds). Lazy:
    ``generator`` is drawn from only when a round needs a new permutation, so a loop that also draws
    from it between rounds stays reproducible.

    >>> rounds = prompt_rounds(3, 2, torch.Generator().manual_seed(0))
    >>> sorted(next(rounds) + next(rounds)[:1])
    [0, 1, 2]
    """
    n, per_round = _check_int("n", n, 1), _check_int("per_round", per_round, 1)  # n = 0: endless
    order: list[int] = []
    while True:
        while len(order) < per_round:
            order += torch.randperm(n, generator=generator).tolist()
        yield order[:per_round]
        order = order[per_round:]


def rollout_batch(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
                  pad_id: int, targets: Sequence[Sequence[bool]] | None = None) -> Batch:
    """Generated rollouts as a padded :class:`Batch`: ``prompt + completion`` per row, labels on the
    completion only (the policy is scored on what it generated, not on the prompt).

    ``targets[i][t]`` (optional) says whether completion token ``t`` of row ``i`` carries a loss —
    False for tokens the caller forced, or for tokens a policy-gradient loss must skip; the default
    is every completion token. Prompts must hold at least one token (``<bos>``), since the first
    completion token is predicted from the last prompt position.

    >>> b = rollout_batch([[1, 5]], [[6, 2]], pad_id=0)
    >>> b.input_ids.tolist(), b.labels.tolist()
    ([[1, 5, 6, 2]], [[-100, -100, 6, 2]])
    """
    if len(prompts) != len(completions):
        raise ValueError(f"prompts and completions must have the same length, got {len(prompts)} "
                         f"and {len(completions)}")
    if targets is not None and len(targets) != len(completions):
        raise ValueError(f"targets must have one entry per completion ({len(completions)}), got "
                         f"{len(targets)}")
    seqs = []
    for i, (p, c) in enumerate(zip(prompts, completions)):
        if len(p) == 0:
            raise ValueError(f"prompts[{i}] is empty: a rollout's prompt holds at least <bos>")
        keep = [True] * len(c) if targets is None else list(targets[i])
        if len(keep) != len(c):
            raise ValueError(f"targets[{i}] has {len(keep)} entries for a completion of "
                             f"{len(c)} tokens")
        labels = (IGNORE,) * len(p) + tuple(t if k else IGNORE for t, k in zip(c, keep))
        seqs.append(Encoded((*p, *c), labels))
    return pad(seqs, pad_id)
