"""Argument checks of the generation engine (:mod:`halluc_lab.generation.engine_core`, chapter 6 of
the book).

Bad input gets a clear error naming the argument and the allowed range (ARCHITECTURE.md §10), before
the engine changes anything: a raw ``IndexError`` from an embedding, or a token silently clamped, is
what these checks prevent. They live apart from the engine so that it reads as generation only.

After a run, :func:`check_finite` reads the rows' NaN flags with their lengths (one wait for the
device) and raises :class:`NonFiniteLogits`: NaN logits never become tokens silently.

Prompts: a list of prompts (each a list of token ids or a 1-D tensor) or a 2-D tensor ``(N, T)``.
A flat list of ints or a 1-D tensor is refused rather than guessed at (one prompt of T tokens, or
T prompts of one token?): pass ``[prompt]``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import torch

Tensor = torch.Tensor
# stop tokens live in a fixed-size device buffer, so graphs need not change with them
MAX_STOP_TOKENS = 16


def is_int(value: object) -> bool:
    """A Python int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_count(name: str, value: object, what: str = "") -> None:
    """ValueError unless ``value`` is a positive int."""
    if not is_int(value) or value < 1:
        raise ValueError(f"{name} must be a positive int{what}, got {value!r}")


def prompt_lists(prompts: Sequence[Sequence[int]] | Tensor) -> list[list[int]]:
    """Prompts as lists of token ids (see the module docstring for what is accepted)."""
    one = "for one prompt pass [prompt] (or prompt[None] for a tensor)"
    if isinstance(prompts, Tensor):
        if prompts.ndim != 2:
            raise ValueError("prompts must be a 2-D (N, T) tensor or a list of prompts, got a "
                             "tensor of shape "
                             f"{tuple(prompts.shape)}; {one}")
        return prompts.tolist()
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Iterable):
        raise TypeError(f"prompts must be a list of prompts (lists of token ids) or a 2-D tensor, "
                        f"got {type(prompts).__name__}")
    out = []
    for p in prompts:
        if isinstance(p, Tensor) and p.ndim == 1:
            p = p.tolist()
        elif isinstance(p, (str, bytes, Tensor)) or not isinstance(p, Iterable):
            raise ValueError("prompts must be a list of prompts, each a list of token ids; found "
                             f"{p!r} where a "
                             f"prompt was expected: {one}")
        out.append(list(p))
    return out


def model_context(model) -> int | None:
    """The positions a model is meant for (``config.max_positions``), or None."""
    return getattr(getattr(model, "config", None), "max_positions", None)


def check_context(prompts: list[list[int]], max_new_tokens: int, context: int | None,
                  name: str = "max_new_tokens") -> None:
    """ValueError, before any cache is allocated, unless every prompt plus ``max_new_tokens`` (the
    argument ``name``) fits the model's ``context`` (None: no limit)."""
    if context is None:
        return
    b, longest = max(enumerate(map(len, prompts)), key=lambda item: item[1])
    if longest >= context:
        raise ValueError(f"prompt {b} has {longest} tokens; the model's context is "
                         f"config.max_positions={context}, so a prompt may hold at most "
                         f"{context - 1} (room for one new token)")
    if longest + max_new_tokens > context:
        prompt = f"the longest prompt has {longest} tokens and " if longest else ""
        raise ValueError(f"{name} must be at most {context - longest} here, got {max_new_tokens}: "
                         f"{prompt}the model's context is config.max_positions={context}")


def check_engine(model, max_positions: int, cuda_graph: bool | None, fused: bool) -> bool:
    """:class:`~halluc_lab.generation.engine_core.Engine`'s options, checked before its cache is
    allocated; returns whether it captures CUDA graphs (default: on a CUDA device)."""
    device = model.embed_tokens.weight.device
    use_graph = (device.type == "cuda") if cuda_graph is None else bool(cuda_graph)
    if use_graph and device.type != "cuda":
        raise ValueError(f"cuda_graph=True needs a model on a CUDA device, the model is on "
                         f"{device}")
    if not isinstance(fused, bool):
        raise TypeError(f"fused must be a bool, got {fused!r}")
    if fused and not use_graph:
        raise ValueError("fused=True compiles the step for its CUDA graph: it needs a model on a "
                         f"CUDA device and cuda_graph left on (the model is on {device}, "
                         f"cuda_graph={cuda_graph})")
    check_count("max_positions", max_positions)
    check_context([[]], max_positions, model_context(model), "max_positions")
    return use_graph


class NonFiniteLogits(FloatingPointError):
    """The model gave NaN (or +inf) next-token logits: no token can be chosen from them."""


def check_finite(lengths: Tensor, nonfinite: Tensor) -> int:
    """The longest of ``lengths`` (N,), read in one wait with the rows' NaN flags ``nonfinite``
    (N,); raises :class:`NonFiniteLogits` naming the rows if a flag is set."""
    longest, bad = torch.stack([lengths.max(), nonfinite.any().long()]).tolist()
    if bad:
        rows = nonfinite.nonzero()[:, 0].tolist()
        more = " …" if len(rows) > 8 else ""
        raise NonFiniteLogits(f"the model gave NaN (or +inf) next-token logits in rows {rows[:8]}"
                              f"{more}: its weights or activations are not finite")
    return longest


def check_start(prompts: Sequence[Sequence[int]] | Tensor, max_new_tokens: int, params,
                stop_tokens: Sequence[int], generator: torch.Generator | None, n_samples: int, *,
                batch_size: int, max_positions: int, vocab_size: int,
                device: torch.device) -> list[list[int]]:
    """Check :meth:`Engine.start`'s arguments; return the prompts as lists of ints."""
    B, T, V = batch_size, max_positions, vocab_size
    prompts = prompt_lists(prompts)
    check_count("max_new_tokens", max_new_tokens)
    check_count("n_samples", n_samples, " (samples per prompt)")
    N = len(prompts) * n_samples
    if not 1 <= N <= B:
        raise ValueError(f"the engine has {B} rows; got {len(prompts)} prompts × "
                         f"n_samples={n_samples} = {N} rows "
                         f"(allowed 1 to {B})")
    for b, p in enumerate(prompts):
        if not p:
            raise ValueError(f"prompt {b} is empty; every prompt needs at least one token")
        bad = next((t for t in p if not is_int(t) or not 0 <= t < V), None)
        if bad is not None:
            raise ValueError(f"prompt {b} holds {bad!r}, a token outside [0, {V - 1}] (prompts "
                             "hold int token ids)")
        if len(p) + max_new_tokens > T:
            raise ValueError(f"prompt {b} ({len(p)} tokens) + max_new_tokens ({max_new_tokens}) is "
                             "longer than "
                             f"the cache ({T} positions)")
    stop_tokens = list(stop_tokens)
    if len(stop_tokens) > MAX_STOP_TOKENS:
        raise ValueError(f"at most {MAX_STOP_TOKENS} stop tokens, got {len(stop_tokens)}")
    for t in stop_tokens:
        if not is_int(t) or not 0 <= t < V:
            raise ValueError(f"unknown stop token {t!r}: stop tokens must be ids in [0, {V - 1}]")
    if generator is not None and (not isinstance(generator, torch.Generator)
                                  or generator.device.type != device.type):
        raise ValueError(f"generator must be a torch.Generator on {device.type} (the "
                         "model's device)")
    return prompts


def check_force(force: Mapping[int, int], n_rows: int, vocab_size: int) -> None:
    """``force`` maps rows in ``[0, n_rows)`` to ids in ``[0, vocab_size)``: TypeError if not ints,
    else ValueError."""
    if not isinstance(force, Mapping):
        raise TypeError(f"force must be a mapping {{row: token id}}, got {type(force).__name__}")
    for r, t in force.items():
        if not is_int(r):
            raise TypeError(f"forced row must be an int, got {r!r} ({type(r).__name__})")
        if not 0 <= r < n_rows:
            raise ValueError(f"forced row must be an int in [0, {n_rows - 1}], got {r!r}")
        if not is_int(t):
            raise TypeError(f"forced token for row {r} must be an int token id, got {t!r} "
                            f"({type(t).__name__})")
        if not 0 <= t < vocab_size:
            raise ValueError(f"forced token must be an id in [0, {vocab_size - 1}], got {t!r}")
