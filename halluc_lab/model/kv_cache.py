"""The key-value cache: keys and values of past tokens, kept so a new token need not recompute them.

Chapter 6 of the book. Documents: 000 §6.2 (K_cache, V_cache and the concatenation
``[K_cache; K_t]``), 001 Part 3 §1 (the cache S_t as the state of a recursion, its O(L·d·t)
memory), 004 §6.2 steps 1–6 (the cached ``K_{≤t}``, ``V_{≤t}`` and the update of step 6),
002 "Cached Generation".

Why it works: under the causal mask (000 §3.3) the key and value of a past token never depend
on later tokens, so they can be computed once and reused by every later query.

Layout: one preallocated tensor for keys and one for values, each
``(layers, batch, positions, kv-heads, head-dim)`` = ``(L, B, T, H_kv, D)``, so the cache costs
``2·L·B·T·H_kv·D·bytes`` whatever is in it (:attr:`KVCache.nbytes`). Each row of the batch has
its own length (``lengths``, on the device): row ``b`` holds positions ``0 … lengths[b]-1``.
:meth:`KVCache.copy_rows` copies rows onto others: a prompt prefilled once serves a group of
samples (GRPO, best-of-N), as nanochat's engine does.

Where the code departs from the documents:

- 000 §6.2 and 002 *concatenate* the new key to the cache, which allocates a longer tensor at
  every step. Here the cache is allocated once at its full size and a new key is *written* at
  slot ``lengths[b]``; attention reads the first ``n`` slots and a mask hides slots at or past a
  query's own position. Same result, no allocation per token, and static shapes (which a CUDA
  graph needs, see :mod:`halluc_lab.generation.engine_core`).
- Rows may hold different numbers of tokens, and :meth:`KVCache.rollback` takes tokens back from
  chosen rows (the backspace token of chapter 10). Rollback only lowers ``lengths``: the stale
  keys stay in memory, are masked, and are overwritten by the next write.
- The documents describe one layer and one sequence; the cache here holds every layer (001's
  union over ℓ) and a batch of sequences.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from halluc_lab.device import distinct_indices, to_device

Tensor = torch.Tensor


def _positive_int(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def rollback_request(rows: Sequence[int] | None, n: int | Sequence[int], available: list[int],
                     what: str) -> tuple[list[int], list[int]]:
    """Check a request to take ``n`` tokens from ``rows`` (None = all) when row r has
    ``available[r]``.

    Returns the rows and one count per row; raises ValueError naming the allowed range (``what``
    says what the available tokens are).
    """
    R = len(available)
    rows = list(range(R)) if rows is None else list(rows)
    for r in rows:
        if not isinstance(r, int) or isinstance(r, bool) or not 0 <= r < R:
            raise ValueError(f"rows must hold ints in [0, {R - 1}], got {r!r}")
    if len(set(rows)) != len(rows):
        raise ValueError(f"rows must not repeat a row, got {rows}")
    counts = [n] * len(rows) if isinstance(n, int) and not isinstance(n, bool) else list(n)
    if len(counts) != len(rows):
        raise ValueError(f"n must be an int or one int per row ({len(rows)}), got "
                         f"{len(counts)} values")
    for r, c in zip(rows, counts):
        if not isinstance(c, int) or isinstance(c, bool) or not 0 <= c <= available[r]:
            raise ValueError(f"n for row {r} must be an int in [0, {available[r]}] "
                             f"({what}), got {c!r}")
    return rows, counts


class KVCache:
    """Preallocated keys and values for every layer, with a length per row.

    Shapes: ``k`` and ``v`` ``(L, B, T, H_kv, D)``; ``lengths`` ``(B,)`` (long, on the cache's
    device).

    Example::

        cache = KVCache(n_layers=2, batch_size=3, max_positions=16, n_kv_heads=2, head_dim=8)
        cache.nbytes            # 2 · 2 · 3 · 16 · 2 · 8 · 4 bytes = 12288
        logits = model(input_ids, cache=cache)   # writes keys/values, then lengths += T
        cache.rollback([1], 2)  # row 1 forgets its last two tokens
    """

    def __init__(self, n_layers: int, batch_size: int, max_positions: int, n_kv_heads: int,
                 head_dim: int, *, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None) -> None:
        shape = tuple(_positive_int(name, value) for name, value in (
            ("n_layers", n_layers), ("batch_size", batch_size), ("max_positions", max_positions),
            ("n_kv_heads", n_kv_heads), ("head_dim", head_dim)))
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # (L, B, T, H_kv, D) keys
        self.v = torch.zeros(shape, dtype=dtype, device=device)  # (L, B, T, H_kv, D) values
        # (B,) tokens held
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=self.k.device)
        # (B, 1) row index for writes
        self._rows = torch.arange(batch_size, device=self.k.device)[:, None]
        # (L, 1, 1): [l] is (1, 1)
        self._layers = torch.arange(n_layers, device=self.k.device)[:, None, None]
        # A host-side upper bound on max(lengths). It sizes the attention window without asking
        # the device (no sync); it is exact after prefill and rollback and may run ahead of the
        # device when rows stop early.
        self.bound = 0
        # True: attention always reads all T slots (static shapes, for CUDA graph capture).
        # False: it reads only the first bound + T_new slots (less work when eager).
        self.static = False

    @classmethod
    def for_model(cls, config, batch_size: int, max_positions: int, *,
                  dtype: torch.dtype = torch.float32,
                  device: torch.device | str | None = None) -> "KVCache":
        """A cache shaped for a model config (anything with n_layers, n_kv_heads and head_dim)."""
        return cls(config.n_layers, batch_size, max_positions, config.n_kv_heads, config.head_dim,
                   dtype=dtype, device=device)

    # -- sizes -------------------------------------------------------------------------------

    @property
    def n_layers(self) -> int:
        return self.k.shape[0]

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]

    @property
    def capacity(self) -> int:
        """Positions each row can hold."""
        return self.k.shape[2]

    @property
    def nbytes(self) -> int:
        """Bytes held by keys and values: ``2·L·B·T·H_kv·D·bytes_per_element``."""
        return self.k.nbytes + self.v.nbytes

    @property
    def bytes_per_token(self) -> int:
        """Bytes one token of one row occupies across all layers: ``2·L·H_kv·D·bytes``."""
        L, _, _, H_kv, D = self.k.shape
        return 2 * L * H_kv * D * self.k.element_size()

    # -- what the model calls ----------------------------------------------------------------

    def slots(self, n_new: int) -> Tensor:
        """Where ``n_new`` new tokens of each row go: ``lengths[:, None] + arange(n_new)``,
        ``(B, n_new)``.

        Raises ValueError (and changes nothing) if a row would run past :attr:`capacity`.
        """
        _positive_int("n_new", n_new)
        if self.bound + n_new > self.capacity:
            self.bound = int(self.lengths.max())  # the bound may be stale: ask the device once
            if self.bound + n_new > self.capacity:
                raise ValueError(f"the cache holds {self.capacity} positions per row; a row "
                                 "already holds "
                                 f"{self.bound}, so {n_new} more tokens do not fit")
        offsets = torch.arange(n_new, device=self.lengths.device)  # (n_new,)
        return self.lengths[:, None] + offsets[None, :]  # (B, n_new)

    def window(self, n_new: int) -> int:
        """How many slots attention reads this step: all of them if :attr:`static`, else
        ``bound + n_new``."""
        return self.capacity if self.static else min(self.capacity, self.bound + n_new)

    def write(self, layer: int, k_new: Tensor, v_new: Tensor, slots: Tensor) -> None:
        """Store the new keys and values ``(B, n_new, H_kv, D)`` of one layer at ``slots``
        ``(B, n_new)``.

        004 §6.2 step 6: "the new token's key and value vectors are computed and added to the
        cache".
        """
        # Row b's slots never repeat, so the write needs no deterministic sort
        # (device.distinct_indices). The write before this one, a one-hot select over the whole
        # layer, read and wrote every slot: on an H200 (2026-11-27, book/results/engine.md) a decode
        # step of chapter 10's 4 × 256 model at batch 512 with 192 positions per row took 2.52 ms
        # with it and 2.01 ms with this write and the engine's unsorted record writes (same bits).
        # The write indexes the whole tensor, not the layer's view: compiled (the engine's fused
        # step), a write into a view is a write into a copy of the whole cache, copied back at the
        # end of the step.
        # k[layer, b, slots[b, i]] = k_new[b, i], broadcast
        index = (self._layers[layer], self._rows, slots)
        with distinct_indices():
            self.k.index_put_(index, k_new.to(self.k.dtype))
            self.v.index_put_(index, v_new.to(self.v.dtype))

    def read(self, layer: int, n_keys: int) -> tuple[Tensor, Tensor]:
        """Keys and values of the first ``n_keys`` slots of one layer, as ``(B, H_kv, n_keys, D)``
        views."""
        return (self.k[layer, :, :n_keys].transpose(1, 2),  # (B, H_kv, n_keys, D)
                self.v[layer, :, :n_keys].transpose(1, 2))

    def advance(self, n_new: int) -> None:
        """Every row now holds ``n_new`` more tokens (called once per forward, after all layers)."""
        self.lengths += n_new
        self.bound += n_new

    # -- what the engine calls ---------------------------------------------------------------

    def rollback(self, rows: Sequence[int] | None, n: int | Sequence[int]) -> None:
        """Take back the last ``n`` tokens of each row in ``rows`` (``None`` = every row).

        ``n`` is one int for all chosen rows or one int per row. Raises ValueError, leaving the
        cache as it was, if a row is out of range or repeated, or ``n`` is negative or larger
        than what the row holds. Only ``lengths`` change (O(1) in the sequence length).
        """
        held = self.lengths.tolist()  # one sync: the check needs the device's lengths
        rows, counts = rollback_request(rows, n, held, "the tokens it holds")
        if not rows:
            return
        for r, c in zip(rows, counts):
            held[r] -= c
        self.lengths.copy_(torch.tensor(held, dtype=torch.long))
        self.bound = max(held)

    def set_lengths(self, lengths: Sequence[int]) -> None:
        """Set every row's length from the host (e.g. after a right-padded prefill); the bound
        becomes exact."""
        lengths = list(lengths)
        if len(lengths) != self.batch_size:
            raise ValueError(f"lengths must hold one int per row ({self.batch_size}), got "
                             f"{len(lengths)}")
        for r, n in enumerate(lengths):
            if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= self.capacity:
                raise ValueError(f"lengths[{r}] must be an int in [0, {self.capacity}], got {n!r}")
        self.lengths.copy_(to_device(lengths, self.lengths.device, torch.long))
        self.bound = max(lengths)

    def first_rows(self, n_rows: int) -> "KVCache":
        """A cache over rows ``0 … n_rows-1`` sharing this one's keys and values (not its lengths).

        What a forward writes through it lands in this cache; its lengths are its own copy, so set
        this cache's lengths afterwards (:meth:`set_lengths`). The engine prefills distinct prompts
        with it.
        """
        if (not isinstance(n_rows, int) or isinstance(n_rows, bool)
                or not 1 <= n_rows <= self.batch_size):
            raise ValueError(f"n_rows must be an int in [1, {self.batch_size}], got {n_rows!r}")
        part = object.__new__(KVCache)
        part.k, part.v = self.k[:, :n_rows], self.v[:, :n_rows]  # (L, n_rows, T, H_kv, D) views
        part.lengths = self.lengths[:n_rows].clone()  # (n_rows,)
        part._rows, part._layers = self._rows[:n_rows], self._layers  # (n_rows, 1), (L, 1, 1)
        part.bound, part.static = self.bound, False
        return part

    def copy_rows(self, source: Tensor, n_positions: int | None = None) -> None:
        """Row ``b`` becomes a copy of row ``source[b]`` for ``b < len(source)``: keys, values and
        length.

        Only the first ``n_positions`` slots are copied (default: all). With
        ``source = [0, 0, 1, 1]`` two prefilled prompts fan out to two samples each (a GRPO group,
        best-of-N), without a second prefill.
        """
        source = torch.as_tensor(source)  # checked where it is: a host tensor costs no sync
        R, T = source.numel(), self.capacity if n_positions is None else n_positions
        if (source.ndim != 1 or source.dtype not in (torch.long, torch.int)
                or not 1 <= R <= self.batch_size):
            raise ValueError(f"source must be a 1-D int tensor of 1 to {self.batch_size} row "
                             "indices, got "
                             f"{tuple(source.shape)} {source.dtype}")
        if not 0 <= int(source.min()) <= int(source.max()) < self.batch_size:
            raise ValueError(f"source must hold row indices in [0, {self.batch_size - 1}], got "
                             f"{source.tolist()}")
        source = to_device(source, self.k.device)
        if not isinstance(T, int) or isinstance(T, bool) or not 0 <= T <= self.capacity:
            raise ValueError(f"n_positions must be an int in [0, {self.capacity}] or None, got "
                             f"{n_positions!r}")
        # Advanced indexing on the right gathers a copy first, so source and target rows may
        # overlap; one layer at a time, so the copy costs one layer's worth of memory, not the
        # cache's.
        for layer in range(self.n_layers):
            self.k[layer, :R, :T] = self.k[layer, source, :T]  # (R, T, H_kv, D)
            self.v[layer, :R, :T] = self.v[layer, source, :T]
        # the bound stays valid: no row grows past the longest
        self.lengths[:R] = self.lengths[source]

    def shrink(self, rows: Tensor, n: Tensor) -> None:
        """``lengths[rows] -= n`` on the device with no checks and no sync (for callers that checked
        already)."""
        self.lengths.index_add_(0, rows, -n)  # (R,) rows, (R,) counts

    def reset(self) -> None:
        """Empty every row (the memory stays allocated)."""
        self.lengths.zero_()
        self.bound = 0

    def __repr__(self) -> str:
        L, B, T, H_kv, D = self.k.shape
        return (f"KVCache(layers={L}, batch={B}, positions={T}, kv_heads={H_kv}, head_dim={D}, "
                f"dtype={str(self.k.dtype).removeprefix('torch.')}, {self.nbytes / 2**20:.2f} MiB)")


# ----------------------------------------------------------------------------- what a forward costs

@dataclass(frozen=True)
class StepCost:
    """Work and memory traffic of one forward of ``n_new`` tokens per row over ``n_cached`` cached
    ones."""

    token_rows: int  # token positions pushed through the projections and the MLP (B · n_new)
    # query-key dot products per layer and head (causal: each new token sees the cache and itself)
    scores: int
    dense_flops: int  # multiply-adds ×2 of the projections, the MLP and the head, all layers
    # ×2 multiply-adds of q·k and of the weighted sum of values, all layers and heads
    attention_flops: int
    weight_bytes: int  # the weights, read once per forward
    kv_read_bytes: int  # keys and values read by attention (every visible position, every layer)
    kv_write_bytes: int  # keys and values written for the new tokens

    @property
    def flops(self) -> int:
        return self.dense_flops + self.attention_flops

    @property
    def bytes(self) -> int:
        return self.weight_bytes + self.kv_read_bytes + self.kv_write_bytes


def step_cost(config, n_new: int, n_cached: int = 0, batch: int = 1,
              bytes_per_value: int = 2) -> StepCost:
    """Count the work of one forward (a prefill if ``n_cached == 0``, a decode step if
    ``n_new == 1``).

    Without a cache, step t of 000 §6.1's loop is ``step_cost(c, t)``; with one it is
    ``step_cost(c, 1, t - 1)``. ``config`` needs vocab_size, hidden_size, n_layers, n_heads,
    n_kv_heads, head_dim and intermediate_size (a :class:`~halluc_lab.model.config.ModelConfig`).

    Example::

        step_cost(config, 1, 99).scores    # 100: the new query against 99 cached keys and its own
    """
    for name, value in (("n_new", n_new), ("batch", batch), ("bytes_per_value", bytes_per_value)):
        _positive_int(name, value)
    if not isinstance(n_cached, int) or isinstance(n_cached, bool) or n_cached < 0:
        raise ValueError(f"n_cached must be a non-negative int, got {n_cached!r}")
    c = config
    d, L, H, H_kv, D, I, V = (c.hidden_size, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim,
                              c.intermediate_size, c.vocab_size)
    rows = batch * n_new
    # qkv, o, gate/up/down; head
    per_row = L * 2 * d * ((H + 2 * H_kv) * D + H * D + 3 * I) + 2 * d * V
    scores = batch * (n_new * n_cached + n_new * (n_new + 1) // 2)  # Σ_i (n_cached + i + 1)
    # Weights read once: every layer, the final norm and the head in full, but only the embedding
    # rows used.
    params = L * (d * (H + 2 * H_kv) * D + H * D * d + 3 * d * I + 2 * d) + d + V * d + rows * d
    kv_per_position = 2 * L * H_kv * D * bytes_per_value
    return StepCost(token_rows=rows, scores=scores, dense_flops=rows * per_row,
                    attention_flops=L * H * 4 * D * scores, weight_bytes=params * bytes_per_value,
                    kv_read_bytes=batch * (n_cached + n_new) * kv_per_position,
                    kv_write_bytes=rows * kv_per_position)
