"""Decoding loops: 000 §6.1's generation loop without a cache, beam search, and repetition.

Chapter 3. Sources: 000 §4.2 (beam search with a length term), §6.1 (the generation loop);
003 §1 (greedy and beam search). The decoding rules these loops call (greedy, top-k, top-p,
sampling) are :mod:`halluc_lab.generation.sampling`; the cached, batched loop is
:mod:`halluc_lab.generation.engine`.

Where this departs from the documents: the beam-search score is 000 §4.2's sum of log-probs plus
λ·len, an additive length bonus (not a division by the length); a hypothesis that has emitted EOS
keeps its slot in the beam and its score, where Hugging Face moves it out and refills the beam.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from numbers import Integral, Real

import torch

from halluc_lab.generation.sampling import greedy, log_softmax

# --- the generation loop and beam search (000 §6.1, §4.2) --------------------------------------

Step = Callable[[torch.Tensor], torch.Tensor]  # (N, t) token ids -> (N, V) next-token logits


def _call_step(step: Step, tokens: torch.Tensor) -> torch.Tensor:
    logits = step(tokens)  # (N, V)
    if (not isinstance(logits, torch.Tensor) or logits.dim() != 2
            or logits.shape[0] != tokens.shape[0]):
        shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"step must map tokens (N, t) to logits (N, V); got {shape} for N = "
                         f"{tokens.shape[0]}")
    return logits


def _check_prompt(prompt: torch.Tensor) -> torch.Tensor:
    """A (T0,) or (N, T0) int64 prompt as (N, T0)."""
    if (not isinstance(prompt, torch.Tensor) or prompt.dtype != torch.long
            or prompt.dim() not in (1, 2)):
        raise ValueError("prompt must be an int64 tensor of shape (T0,) or (N, T0)")
    if 0 in prompt.shape:  # the step would see no token to condition on
        raise ValueError("prompt must have N >= 1 rows of T0 >= 1 tokens, got shape "
                         f"{tuple(prompt.shape)}")
    return prompt if prompt.dim() == 2 else prompt[None]


def _check_count(value: int, name: str, low: int, high: int | None = None) -> None:
    top, allowed = (math.inf, f"[{low}, inf)") if high is None else (high, f"[{low}, {high}]")
    if isinstance(value, bool) or not isinstance(value, Integral) or not low <= value <= top:
        raise ValueError(f"{name} must be an int in {allowed}, got {value!r}")


def decode(step: Step, prompt: torch.Tensor, max_new_tokens: int,
           choose: Callable[[torch.Tensor], torch.Tensor] = greedy,
           eos_token: int | None = None) -> torch.Tensor:
    """000 §6.1's loop: logits = step(tokens), token = choose(logits), append; stop after EOS.

    The reference loop without a cache (the engine is the fast one). ``choose`` is a decoding
    rule from (N, V) logits to (N,) tokens, e.g. ``greedy``,
    ``functools.partial(sample, top_p=0.9, generator=g)``, or the engine's rule for one setting,
    ``functools.partial(SamplingParams(top_p=0.9).choose, generator=g)``.

    Returns:
        (N, T0 + L) or (T0 + L,) like the prompt, L ≤ max_new_tokens; a row that has emitted
        EOS is padded with EOS; the loop ends early once every row has.
    """
    tokens = _check_prompt(prompt)  # (N, T0)
    _check_count(max_new_tokens, "max_new_tokens", 0)
    done = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)  # (N,)
    for _ in range(max_new_tokens):
        logits = _call_step(step, tokens)  # (N, V)
        if eos_token is not None:  # a token id of the vocabulary the step's logits have
            _check_count(eos_token, "eos_token", 0, logits.shape[-1] - 1)
        nxt = choose(logits)  # (N,)
        if eos_token is not None:
            nxt = torch.where(done, eos_token, nxt)
            done = done | (nxt == eos_token)
        tokens = torch.cat([tokens, nxt[:, None]], dim=1)  # (N, t + 1)
        if eos_token is not None and bool(done.all()):
            break
    return tokens if prompt.dim() == 2 else tokens[0]


@dataclass(frozen=True)
class Beams:
    """The B hypotheses of a beam search per prompt, best first."""

    tokens: torch.Tensor  # (*N, B, T0 + L) the prompt then the continuation, EOS-padded
    scores: torch.Tensor  # (*N, B) sum of log-probs + λ · length (000 §4.2), decreasing
    log_probs: torch.Tensor  # (*N, B) sum of the continuation's log-probs
    lengths: torch.Tensor  # (*N, B) continuation lengths, EOS included


def beam_search(step: Step, prompt: torch.Tensor, beam_width: int, max_new_tokens: int, *,
                eos_token: int | None = None, length_bonus: float = 0.0) -> Beams:
    """Beam search of 000 §4.2: extend each of B hypotheses by every token, keep the best B.

    score(h) = Σ log p(y_τ | y_<τ) + λ · len(h), with λ = ``length_bonus``. Every step scores
    B · V candidates. A hypothesis that has emitted ``eos_token`` is frozen: its only extension
    is EOS again at log-prob 0 and no extra length. With a beam wider than the number of distinct
    continuations, the surplus hypotheses have score -inf.

    Args:
        step: maps tokens (M, t) to next-token logits (M, V) (log-probs work too).
        prompt: (T0,) or (N, T0) int64.

    Returns:
        :class:`Beams`; the leading N is dropped for a 1-D prompt.

    Example:
        >>> table = torch.tensor([[0.0, 1.0], [1.0, 0.0]]).log()   # a deterministic 2-state chain
        >>> beam_search(lambda t: table[t[:, -1]], torch.tensor([0]), 2, 3).tokens[0].tolist()
        [0, 1, 0, 1]
    """
    tokens = _check_prompt(prompt)  # (N, T0)
    _check_count(beam_width, "beam_width", 1)
    _check_count(max_new_tokens, "max_new_tokens", 0)
    if (isinstance(length_bonus, bool) or not isinstance(length_bonus, Real)
            or not math.isfinite(length_bonus)):
        raise ValueError(f"length_bonus must be a finite number, got {length_bonus!r}")
    N, B = tokens.shape[0], beam_width
    tokens = tokens.repeat_interleave(B, dim=0)  # (N·B, T0)
    logp_sum = torch.full((N, B), -math.inf, device=tokens.device)  # promoted to the logits' dtype
    logp_sum[:, 0] = 0.0  # one live hypothesis to start with, or B copies would fill the beam
    lengths = torch.zeros(N, B, dtype=torch.long, device=tokens.device)
    done = torch.zeros(N, B, dtype=torch.bool, device=tokens.device)
    for _ in range(max_new_tokens):
        logits = _call_step(step, tokens)  # (N·B, V)
        V = logits.shape[-1]
        logp = log_softmax(logits).view(N, B, V)  # (N, B, V), float32 or float64
        if eos_token is not None:
            _check_count(eos_token, "eos_token", 0, V - 1)
            frozen = torch.full_like(logp, -math.inf)
            frozen[..., eos_token] = 0.0
            logp = torch.where(done[..., None], frozen, logp)
        new_len = lengths + (~done).long()  # (N, B)
        cand_logp = (logp_sum[..., None] + logp).view(N, B * V)  # (N, B·V)
        bonus = length_bonus * new_len.to(cand_logp.dtype)  # (N, B)
        cand_score = cand_logp + bonus.repeat_interleave(V, dim=1)  # (N, B·V)
        _, flat = cand_score.topk(B, dim=-1)  # (N, B), best first
        beam, tok = flat // V, flat % V  # (N, B) each
        logp_sum = cand_logp.gather(-1, flat)
        lengths = new_len.gather(-1, beam)
        done = done.gather(-1, beam) | (tok == eos_token if eos_token is not None else False)
        rows = (beam + B * torch.arange(N, device=beam.device)[:, None]).view(-1)  # (N·B,)
        tokens = torch.cat([tokens[rows], tok.view(-1, 1)], dim=1)  # (N·B, t + 1)
        if bool(done.all()):
            break
    scores = logp_sum + length_bonus * lengths.to(logp_sum.dtype)  # (N, B)
    lead = prompt.shape[:-1]  # () or (N,)
    return Beams(tokens=tokens.view(*lead, B, -1), scores=scores.view(*lead, B),
                 log_probs=logp_sum.view(*lead, B), lengths=lengths.view(*lead, B))


def nanogpt_generate_as_printed(model: torch.nn.Module, idx: torch.Tensor, max_new_tokens: int,
                                temperature: float = 1.0, top_k: int | None = None) -> torch.Tensor:
    """001 Part 3, Listing 4 (nanoGPT's ``generate``) taken as the document prints it: its second
    block, from the top-k truncation to the appended token, lost its indentation, so the loop only
    computes logits and one token is sampled after it, whatever ``max_new_tokens`` (≥ 1) asks.

    ``model`` has nanoGPT's interface: ``model(idx)`` returns (logits (B, T, V), loss) and
    ``model.config.block_size`` bounds the context. Returns ``idx`` (B, T) with one token
    appended, (B, T + 1). Kept to show the erratum; nanoGPT runs the whole body in the loop.
    """
    _check_count(max_new_tokens, "max_new_tokens", 1)
    for _ in range(max_new_tokens):
        idx_cond = idx if idx.size(1) <= model.config.block_size \
            else idx[:, -model.config.block_size:]
        logits, _ = model(idx_cond)
        logits = logits[:, -1, :] / temperature
    if top_k is not None:
        v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
        logits[logits < v[:, [-1]]] = -float('Inf')
    probs = torch.nn.functional.softmax(logits, dim=-1)
    idx_next = torch.multinomial(probs, num_samples=1)
    return torch.cat((idx, idx_next), dim=1)


class ListingCalls:
    """The helpers 002's "Cached Generation" loop calls but never defines, over one row of the
    lab's model and its KV cache (``model.new_cache``), so the listing runs as printed.

    ``compute_kv(ids)`` feeds a prompt and returns the cache; ``model(ids, kv_cache)`` returns the
    last token's logits (V,) for a list of ids or one id, writing what it computes to the cache
    when ``model_writes`` and else only reading (the cache's length is put back); ``update_cache``
    feeds one token; ``sample`` picks greedily. ``held`` lists the tokens the cache holds, in
    order, ``generated`` those ``sample`` returned, and ``should_hold`` what a right loop's cache
    holds once its last token is sampled.
    """

    def __init__(self, model: torch.nn.Module, capacity: int, model_writes: bool):
        self._model, self.cache = model, model.new_cache(1, capacity)
        self.model_writes = model_writes
        self.prompt: list[int] = []  # the ids compute_kv was given
        self.held: list[int] = []
        self.generated: list[int] = []

    def _forward(self, ids: list[int], write: bool) -> torch.Tensor:
        start = self.cache.lengths.clone()
        with torch.no_grad():
            out = self._model(torch.tensor([ids]), cache=self.cache)[0, -1]  # (V,) of the last id
        if write:
            self.held.extend(ids)
        else:
            self.cache.lengths.copy_(start)  # a read: what the call wrote is forgotten
        return out

    def model(self, ids, kv_cache) -> torch.Tensor:
        return self._forward(ids if isinstance(ids, list) else [ids], write=self.model_writes)

    def compute_kv(self, ids: list[int]):
        self.prompt = list(ids)
        self._forward(ids, write=True)
        return self.cache

    def update_cache(self, kv_cache, token: int):
        self._forward([token], write=True)
        return kv_cache

    def sample(self, logits: torch.Tensor) -> int:
        token = int(greedy(logits))
        self.generated.append(token)
        return token

    def helpers(self) -> tuple:
        """``model``, ``compute_kv``, ``update_cache`` and ``sample``, in that order."""
        return self.model, self.compute_kv, self.update_cache, self.sample

    @property
    def should_hold(self) -> list[int]:
        """The prompt and every generated token but the last, each once, in order."""
        return self.prompt + self.generated[:-1]


# --- what decoding produces: repetition (chapter 3's trade-off) ---------------------------------

def _ngram_ids(tokens: torch.Tensor, n: int) -> torch.Tensor:
    """(S, L) token ids -> (S, L - n + 1) integer codes of their n-grams."""
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.dtype != torch.long:
        raise ValueError("tokens must be an int64 tensor of shape (S, L)")
    if 0 in tokens.shape:  # no sequence, or no n-gram, to average over
        raise ValueError("tokens must hold S >= 1 sequences of L >= 1 tokens, got shape "
                         f"{tuple(tokens.shape)}")
    if tokens.numel() and int(tokens.min()) < 0:
        raise ValueError("tokens must be token ids in [0, inf)")
    _check_count(n, "n", 1)
    if tokens.shape[1] < n:
        raise ValueError(f"n must be in [1, L = {tokens.shape[1]}], got {n}")
    base = int(tokens.max()) + 1
    if base ** n >= 2 ** 62:
        raise ValueError(f"n = {n} with {base} token ids overflows int64 n-gram codes; "
                         "use a smaller n")
    windows = tokens.unfold(1, n, 1)  # (S, L - n + 1, n)
    weights = base ** torch.arange(n, device=tokens.device)  # (n,)
    return (windows * weights).sum(-1)


def repetition_rate(tokens: torch.Tensor, n: int = 2) -> float:
    """Mean over (S, L) sequences of 1 − distinct n-grams / n-grams (seq-rep-n of Welleck
    et al. 2020)."""
    ids = _ngram_ids(tokens, n).sort(dim=1).values  # (S, M)
    distinct = 1 + (ids[:, 1:] != ids[:, :-1]).sum(dim=1)  # (S,)
    return float((1 - distinct.double() / ids.shape[1]).mean())

