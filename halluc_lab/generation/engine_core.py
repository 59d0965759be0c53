"""The generation engine itself: :class:`Engine`, batched prefill and decode over a preallocated KV
cache.

Chapter 6 of the book. Documents: 000 §6.1 (the generation loop) and §6.2 (the KV cache), 001
Part 3 eq. (10) and §1 (the cache as the state of a recursion), 004 §6.2 steps 1–6, 002 "Cached
Generation". The one-call API that keeps engines per model,
:func:`~halluc_lab.generation.engine.generate` and :func:`~halluc_lab.generation.engine.engine_for`,
is :mod:`halluc_lab.generation.engine`; the module docstring there shows both ways of use.

How a step works. Row b holds its prompt and the tokens generated so far; the cache holds keys
and values of all of them but the last (the "pending" token). A step feeds the pending token of
every row, writes its key/value at the row's own slot, reads the next-token logits, chooses a
token (:mod:`halluc_lab.generation.sampling`: greedy, or temperature/top-k/top-p sampling with the
engine's generator), or takes the caller's forced token instead, and records token, log-prob and a
sampled/forced flag. Rows stop at a stop token or after ``max_new_tokens``; finished rows keep
their cache and outputs and are carried along unchanged.

Groups (GRPO, best-of-N): ``start(..., n_samples=G)`` prefills each distinct prompt once and copies
its cache to G rows, prompt-major (nanochat's engine does the same); the prefill computes no logits
(``logits_to_keep``), since the first step computes the ones it needs.

On CUDA the step is captured once as a CUDA graph per sampling setting and replayed: all its
bookkeeping stays on the device, so a decode step is one ``replay()`` from Python. The prefill is
replayed too, one graph per batch shape from the shape's second use
(:mod:`halluc_lab.generation.engine_graphs`); the same kernels, so the same bits. ``fused=True``
compiles the step first (:func:`halluc_lab.device.compile_for_capture`): fewer kernels, summed in
another order, so other low bits, and a sampled token can differ where two are nearly tied. The
chapters decode unfused.

An engine has a fixed batch size (:mod:`halluc_lab.generation.engine` keeps engines for batch sizes
rounded up to a power of two, the graph buckets); unused rows are finished dummies. A graph reads
the weights where they are, so training them in place between generations is fine; weights replaced
by new tensors (``.to()``, ``load_state_dict(assign=True)``) are noticed at :meth:`Engine.start` and
recaptured.

Where the code departs from the documents:

- 000 §6.1's loop appends and re-runs the model on the whole sequence; here each step runs the
  model on one token per row and reads the rest from the cache (the point of chapter 6).
- Log-probs are those of the model at temperature 1 with no top-k/top-p filter,
  ``log π_θ(y_t | ·)``, whatever the sampling setting: the quantity the training losses of chapters
  8–10 use.
- A prompt is prefilled except its last token, which the first step feeds; so every generated
  token, the first included, comes out of the same step code.

NaN (or +inf) logits never become tokens: each step folds a flag into the rows' records on the
device (no host wait), and :meth:`Engine.result` raises :class:`NonFiniteLogits` naming the rows.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import nn

from halluc_lab.generation import sampling
from halluc_lab.device import compile_for_capture, distinct_indices, host_copies, to_device
from halluc_lab.generation.engine_checks import (MAX_STOP_TOKENS, NonFiniteLogits,  # noqa: F401
                                                 check_engine, check_finite, check_force,
                                                 check_start)
from halluc_lab.generation.engine_graphs import PrefillGraphs, capture_step
from halluc_lab.model.kv_cache import KVCache, rollback_request
from halluc_lab.generation.sampling import SamplingParams

Tensor = torch.Tensor
# logits_to_keep for a prefill: no position's logits are used
NO_LOGITS = torch.zeros(0, dtype=torch.long)


@dataclass(frozen=True)
class GenerationResult:
    """What a batch generation produced; row b's tokens are ``tokens[b, :lengths[b]]``."""

    tokens: Tensor  # (N, M) generated token ids (after rollbacks); 0 past a row's length
    # (N, M) float32 log π(token | context) at temperature 1; 0 past a row's length
    logprobs: Tensor
    # (N, M) bool: True = sampled by the engine, False = forced by the caller (or past the end)
    sampled_mask: Tensor
    lengths: Tensor  # (N,) number of generated tokens per row
    stopped: Tensor  # (N,) bool: the row ended with a stop token (False: it used up max_new_tokens)

    def token_lists(self) -> list[list[int]]:
        """The generated tokens of each row as Python lists."""
        return [row[:n] for row, n in zip(self.tokens.tolist(), self.lengths.tolist())]

    def to_host(self) -> Callable[[], GenerationResult]:
        """Start copying this result to the host; the function returned waits for those copies alone
        (not for device work queued after them: :func:`halluc_lab.device.host_copies`) and returns
        the result on the host."""
        names = [f.name for f in dataclasses.fields(self)]
        wait = host_copies([getattr(self, name) for name in names])
        return lambda: dataclasses.replace(self, **dict(zip(names, wait())))


class Engine:
    """Batched generation with a KV cache, per-row lengths, forcing and rollback.

    ``batch_size`` rows of at most ``max_positions`` tokens each (prompt + generated). ``dtype``:
    the cache's dtype and compute dtype (default: the weights'; a different one runs the model under
    autocast). ``cuda_graph``: capture the decode step (default: on CUDA devices). ``fused``:
    compile the step before capturing it (module docstring; needs the graph, so a CUDA device).
    """

    # Buffers a step writes that the warm-up before a capture must leave as they were.
    _STEP_STATE = ("tok", "n_out", "finished", "stopped", "force_tok", "force_mask", "nonfinite")

    def __init__(self, model: nn.Module, batch_size: int, max_positions: int, *,
                 dtype: torch.dtype | None = None, cuda_graph: bool | None = None,
                 fused: bool = False) -> None:
        weight = model.embed_tokens.weight
        self._model, self.device = weakref.ref(model), weight.device
        self._keep = model  # a strong reference, dropped by engine_for (see there)
        self.vocab_size = model.config.vocab_size
        self.dtype = weight.dtype if dtype is None else dtype
        self.use_graph = check_engine(model, max_positions, cuda_graph, fused)  # before allocating
        self.fused = fused
        self._fused_body = None  # the compiled step, made at the first capture
        self.cache = KVCache.for_model(model.config, batch_size, max_positions, dtype=self.dtype,
                                       device=self.device)
        self.cache.static = self.use_graph  # graphs need the same shapes at every step
        B, T, dev = batch_size, max_positions, self.device
        z = lambda *shape, dtype=torch.long: torch.zeros(shape, dtype=dtype,
                                                         device=dev)  # noqa: E731
        # Device state. Buffers are only ever written in place: a captured graph holds their
        # addresses.
        self.tok = z(B)  # (B,) each row's pending token: the last one emitted, not yet in the cache
        # (B,) each row's last prompt token (pending again if every output is rolled back)
        self.last_prompt = z(B)
        self.n_out = z(B)  # (B,) tokens generated so far per row
        self.budget = z(B)  # (B,) max_new_tokens per row (0 for unused rows)
        self.finished = z(B, dtype=torch.bool)  # (B,) row has stopped
        self.stopped = z(B, dtype=torch.bool)  # (B,) row stopped on a stop token
        self.force_tok = z(B)  # (B,) the caller's tokens for the next step
        self.force_mask = z(B, dtype=torch.bool)  # (B,) which rows take force_tok next step
        self.nonfinite = z(B, dtype=torch.bool)  # (B,) the row met NaN logits (see result())
        # -1 matches nothing
        self.stop_buf = torch.full((MAX_STOP_TOKENS,), -1, dtype=torch.long, device=dev)
        self.out_tokens = z(B, T)  # (B, T) generated tokens at columns 0 … n_out-1
        self.out_logprobs = z(B, T, dtype=torch.float32)  # (B, T)
        self.out_sampled = z(B, T, dtype=torch.bool)  # (B, T)
        # a graph is bound to this one; callers' states are copied in
        self.generator = torch.Generator(device=dev)
        self.params: SamplingParams | None = None
        self.n_rows = 0  # rows in use (the rest are finished dummies)
        self.max_new_tokens = 0
        self._user_generator: torch.Generator | None = None
        self._graphs: dict[SamplingParams, torch.cuda.CUDAGraph] = {}  # the step's, by setting
        self._prefills = PrefillGraphs()
        self._no_logits = NO_LOGITS.to(dev)  # on the device: a capture cannot copy from the host
        # addresses of the weights the graphs were captured with
        self._weights: tuple[int, ...] = ()

    @property
    def model(self) -> nn.Module:
        model = self._model()
        if model is None:
            raise RuntimeError("the engine's model no longer exists")
        return model

    @property
    def batch_size(self) -> int:
        return self.cache.batch_size

    @property
    def max_positions(self) -> int:
        return self.cache.capacity

    # -- starting a batch ---------------------------------------------------------------------

    def start(self, prompts: Sequence[Sequence[int]] | Tensor, max_new_tokens: int,
              params: SamplingParams = SamplingParams(), *, stop_tokens: Sequence[int] = (),
              generator: torch.Generator | None = None, n_samples: int = 1) -> None:
        """Reset, prefill ``prompts`` (lists of token ids, or a 2-D tensor) and get ready to
        generate.

        ``n_samples`` = G rows per prompt (a GRPO group, best-of-N): each prompt is prefilled once
        and its cache copied to its G rows, ordered prompt-major (rows p·G … p·G+G-1 continue prompt
        p). Raises ValueError (changing nothing) for an empty prompt, a token outside the
        vocabulary, more rows (prompts × n_samples) than the engine has, a prompt plus
        ``max_new_tokens`` longer than ``max_positions``, an unknown stop token or a bad sampling
        setting. ``generator``'s state is copied in, and the state after the run is copied back by
        :meth:`result`; None draws a seed from torch's global generator.
        """
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        prompts = check_start(prompts, max_new_tokens, params, stop_tokens, generator, n_samples,
                              batch_size=self.batch_size, max_positions=self.max_positions,
                              vocab_size=self.vocab_size, device=self.device)
        weights = tuple(p.data_ptr() for p in self.model.parameters())
        # graphs read weights in place: new tensors (.to(), assign=True) need new graphs
        if weights != self._weights:
            self._graphs.clear()
            self._prefills.graphs.clear()
            self._weights = weights
        N, B = len(prompts) * n_samples, self.batch_size
        self.params, self.n_rows, self.max_new_tokens = params, N, max_new_tokens
        self._user_generator = generator
        if generator is not None:
            self.generator.set_state(generator.get_state())
        else:
            # from the global seed (hl.setup)
            self.generator.manual_seed(int(torch.randint(2**62, (1,))))
        # Uploads that do not wait for the device (device.to_device): the previous batch's work may
        # still run.
        # unused: 0
        last = to_device([p[-1] for p in prompts for _ in range(n_samples)] + [0] * (B - N),
                         self.device)
        self.tok.copy_(last)
        self.last_prompt.copy_(last)
        self.n_out.zero_()
        self.budget.fill_(0)
        self.budget[:N] = max_new_tokens
        self.finished.fill_(True)
        self.finished[:N] = False
        self.stopped.zero_()
        self.force_mask.zero_()
        self.nonfinite.zero_()
        stops = list(stop_tokens) + [-1] * (MAX_STOP_TOKENS - len(stop_tokens))
        self.stop_buf.copy_(to_device(stops, self.device))
        self._prefill(prompts, n_samples)

    def _prefill(self, prompts: list[list[int]], n_samples: int) -> None:
        """Cache every prompt token but the last, once per distinct prompt, then copy each to its
        rows."""
        P, B = len(prompts), self.batch_size
        self.cache.reset()
        # the last token of each prompt is fed by the first step
        T = max(len(p) for p in prompts) - 1
        if T > 0:
            ids = torch.zeros(P, T, dtype=torch.long)  # (P, T), right-padded
            for b, p in enumerate(prompts):
                ids[b, : len(p) - 1] = torch.tensor(p[:-1], dtype=torch.long)
            if self.use_graph:
                self._prefills.run(self._prefill_forward, ids, self.device, self._pool())
            else:
                self._prefill_forward(to_device(ids, self.device))
        # forget the pads (they stay masked)
        self.cache.set_lengths([len(p) - 1 for p in prompts] + [0] * (B - P))
        # row p·G + g ← row p (copy_rows gathers before it writes, so overlaps are safe)
        if n_samples > 1:
            self.cache.copy_rows(torch.arange(P).repeat_interleave(n_samples), T)

    def _prefill_forward(self, ids: Tensor) -> None:
        # no logits: the first step computes the ones it needs
        with torch.no_grad(), self._autocast():
            self.model(ids, cache=self.cache.first_rows(len(ids)), logits_to_keep=self._no_logits)

    def _pool(self):
        """The memory pool of the engine's graphs (they replay one at a time), or None before the
        first."""
        graph = next(iter(self._graphs.values()), None)
        return None if graph is None else graph.pool()

    def _autocast(self):
        if self.dtype == self.model.embed_tokens.weight.dtype:
            return nullcontext()
        # No weight-cast cache: a captured graph must not read casts that the context frees on exit.
        return torch.autocast(self.device.type, dtype=self.dtype, cache_enabled=False)

    # -- decoding -----------------------------------------------------------------------------

    def _step_body(self) -> None:
        """One decode step for every row, on the device only (no host sync): what the graph
        captures."""
        # (B, V) next-token logits
        logits = self._logits(self.model(self.tok[:, None], cache=self.cache)[:, -1])
        # finished rows keep their length (their write is masked)
        self.cache.lengths -= self.finished.long()
        logp = sampling.log_softmax(logits, validate=False)  # (B, V) float32, temperature 1
        choice = self.params.choose(logits, self.generator, validate=False)  # (B,)
        token = torch.where(self.force_mask, self.force_tok, choice)  # (B,) the caller's token wins
        token_logp = logp.gather(1, token[:, None])[:, 0]  # (B,) NaN if a logit is NaN or +inf
        self.nonfinite |= ~self.finished & token_logp.isnan()  # one (B,) test; result() reads it
        self._record(token, token_logp)
        self.force_mask.zero_()  # a forced token applies to one step

    def _logits(self, logits: Tensor) -> Tensor:
        """The next-token logits a step chooses from (a subclass may mask tokens); here
        unchanged."""
        return logits

    def _record(self, token: Tensor, logp: Tensor) -> None:
        """Append each active row's ``token`` (B,) and its log-prob ``logp`` (B,); make it pending;
        stop rows."""
        active = ~self.finished  # (B,)
        col = self.n_out[:, None]  # (B, 1) next output column of each row
        with distinct_indices():  # one column per row
            self.out_tokens.scatter_(1, col, token[:, None])
            self.out_logprobs.scatter_(1, col, logp[:, None])
            self.out_sampled.scatter_(1, col, ~self.force_mask[:, None])
        self.n_out += active.long()
        self.tok.copy_(torch.where(active, token, self.tok))
        self._finish(active, token, self.n_out)

    def _finish(self, active: Tensor, token: Tensor, spent: Tensor) -> None:
        """Stop active rows whose ``token`` is a stop token or whose ``spent`` (B,) tokens reach the
        budget."""
        hit_stop = (token[:, None] == self.stop_buf[None, :]).any(dim=1)  # (B,)
        self.stopped |= active & hit_stop
        self.finished |= active & (hit_stop | (spent >= self.budget))

    def step(self, force: Mapping[int, int] | None = None) -> None:
        """Generate one token in every unfinished row; ``force`` maps rows to tokens they must take
        instead.

        Forced tokens are recorded with their log-prob and ``sampled_mask`` False (teacher forcing,
        an injected error). Forcing a finished row does nothing. A row or token that is not an int
        (a bool included) raises TypeError; one out of range, ValueError.
        """
        if self.params is None:
            raise RuntimeError("call start() before step()")
        if force:
            check_force(force, self.n_rows, self.vocab_size)
            rows, toks = zip(*force.items())
            index = torch.tensor(rows, device=self.device)
            self.force_tok.index_copy_(0, index, torch.tensor(toks, device=self.device))
            self.force_mask.index_fill_(0, index, True)
        if self.use_graph:
            if self.params not in self._graphs:
                if self.fused and self._fused_body is None:
                    self._fused_body = compile_for_capture(self._step_body)
                self._graphs[self.params] = capture_step(self, self._fused_body or self._step_body,
                                                         self._pool())
            self._graphs[self.params].replay()
            self.cache.bound += 1  # what the captured forward's Python would have done
        else:
            with torch.no_grad(), self._autocast():
                self._step_body()

    @property
    def done(self) -> bool:
        """True when every row has finished (asks the device)."""
        return bool(self.finished.all())

    @property
    def last_tokens(self) -> Tensor:
        """``(N,)`` the token each row emitted last (its last prompt token before the first step);
        on the device."""
        return self.tok[: self.n_rows]

    def run(self, check_every: int | None = None) -> None:
        """Step until every row has finished (at most ``max_new_tokens`` steps).

        ``check_every``: steps between asking the device whether all rows are done (default 1 eager,
        8 with graphs, where a question costs a sync and a few wasted steps cost little).
        """
        check_every = check_every or (8 if self.use_graph else 1)
        for i in range(1, self.max_new_tokens + 1):
            self.step()
            if i % check_every == 0 and self.done:
                break

    # -- taking tokens back -------------------------------------------------------------------

    def rollback(self, rows: Sequence[int] | None, n: int | Sequence[int]) -> None:
        """Take back the last ``n`` generated tokens of each row in ``rows`` (None = every row in
        use).

        What a backspace token does when it physically erases (ARCHITECTURE.md §8): the row's cache
        and outputs shrink, its pending token becomes the one now last, and a finished row is
        reopened. Raises ValueError, changing nothing, for a bad row or an ``n`` larger than the
        tokens the row generated (a rollback never reaches into the prompt).
        """
        if self.params is None:
            raise RuntimeError("call start() before rollback()")
        # one sync: the check needs the device's counts
        generated = self.n_out[: self.n_rows].tolist()
        rows, counts = rollback_request(rows, n,
                                        generated, "tokens it generated; a rollback cannot reach "
                                                   "into the prompt")
        rows, counts = zip(*[(r, c) for r, c in zip(rows, counts)
                             if c > 0]) if any(counts) else ((), ())
        if not rows:
            return
        index = torch.tensor(rows, device=self.device)  # (R,)
        n = torch.tensor(counts, device=self.device)  # (R,)
        self.cache.shrink(index, n)  # checked above: n ≤ generated < what the row's cache holds + 1
        left = self.n_out[index] - n  # (R,) tokens kept
        self.n_out.index_copy_(0, index, left)
        prev = self.out_tokens[index, (left - 1).clamp_min(0)]  # (R,) the token now last, if any
        self.tok.index_copy_(0, index, torch.where(left > 0, prev, self.last_prompt[index]))
        self.finished.index_fill_(0, index, False)
        self.stopped.index_fill_(0, index, False)

    # -- results ------------------------------------------------------------------------------

    def result(self) -> GenerationResult:
        """The rows in use, trimmed to the longest (:class:`NonFiniteLogits` if one met NaN
        logits); copies the generator's state back to the caller's."""
        if self.params is None:
            raise RuntimeError("call start() before result()")
        N = self.n_rows
        lengths = self.n_out[:N].clone()  # (N,)
        M = max(1, check_finite(lengths, self.nonfinite[:N]))  # one wait for the device
        inside = torch.arange(M, device=self.device)[None, :] < lengths[:, None]  # (N, M)
        if self._user_generator is not None:
            self._user_generator.set_state(self.generator.get_state())
        return GenerationResult(
            tokens=torch.where(inside, self.out_tokens[:N, :M], 0),
            logprobs=torch.where(inside, self.out_logprobs[:N, :M], 0.0),
            sampled_mask=inside & self.out_sampled[:N, :M],
            lengths=lengths, stopped=self.stopped[:N].clone())
