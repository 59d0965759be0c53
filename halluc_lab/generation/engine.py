"""Generation in one call: :func:`generate`, through engines kept per model (:func:`engine_for`).

Chapter 6 of the book; chapters 8–10 generate through it. Documents: 000 §6.1 (the generation
loop) and §6.2 (the KV cache), 001 Part 3 eq. (10) and §1 (the cache as the state of a
recursion), 004 §6.2 steps 1–6, 002 "Cached Generation".

One call does it all::

    result = generate(model, [[5, 6, 7], [8]], 20, sampling=SamplingParams(top_p=0.9),
                      stop_tokens=(2,), generator=torch.Generator().manual_seed(0))
    result.token_lists()      # generated tokens of each row
    result.logprobs           # (N, M) log π(token | context) of each generated token

and the :class:`Engine` underneath is there for step-by-step use (force a token, take tokens
back with :meth:`Engine.rollback`, look at :attr:`Engine.last_tokens`)::

    eng = Engine(model, batch_size=2, max_positions=64)
    eng.start([[5, 6, 7], [8]], max_new_tokens=20, params=SamplingParams(greedy=True))
    eng.step(); eng.step(force={1: 42}); eng.rollback([0], 1); eng.run()
    result = eng.result()

An engine has a fixed batch size; :func:`generate` keeps engines for batch sizes rounded up to a
power of two (the graph buckets) and fills unused rows with finished dummies. A graph reads the
weights where they are, so training them in place between generations is fine; weights replaced by
new tensors (``.to()``, ``load_state_dict(assign=True)``) are noticed at :meth:`Engine.start` and
recaptured.

The engine itself (how a step works, groups, CUDA graphs, where the code departs from the
documents) is :mod:`halluc_lab.generation.engine_core`.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence

import torch
from torch import nn

from halluc_lab.generation.engine_checks import (NonFiniteLogits, check_context,  # noqa: F401
                                                 check_count, model_context, prompt_lists)
from halluc_lab.generation.engine_core import Engine, GenerationResult
# GREEDY and SamplingParams are also imported from here
from halluc_lab.generation.sampling import GREEDY, SamplingParams  # noqa: F401

Tensor = torch.Tensor
# engine_for keeps this many engines (kinds × batch buckets × lengths) per model
MAX_ENGINES_PER_MODEL = 6


# ----------------------------------------------------------------------------- the one-call API

_ENGINES: "weakref.WeakKeyDictionary[nn.Module, dict]" = weakref.WeakKeyDictionary()


def engine_for(model: nn.Module, batch_size: int, max_positions: int, *,
               dtype: torch.dtype | None = None, cuda_graph: bool | None = None,
               engine_type: type[Engine] | None = None, **options) -> Engine:
    """A cached :class:`Engine` for at least this batch and length: batch rounded up to a power of
    two, positions to a multiple of 64, so repeated calls reuse the cache and the captured graphs.

    ``engine_type`` (a subclass, e.g. :class:`halluc_lab.generation.backtrack.BacktrackEngine`) and
    its keyword ``options`` are part of the key: each kind of engine keeps its own cache and
    graphs."""
    check_count("batch_size", batch_size)
    engine_type = engine_type or Engine
    bucket = 1 << (batch_size - 1).bit_length()  # 1, 2, 4, 8, ...
    rounded = min(64 * math.ceil(max_positions / 64), model_context(model) or math.inf)
    positions = max(max_positions, rounded)  # never past the model's context
    dtype = dtype or model.embed_tokens.weight.dtype
    key = (engine_type, tuple(sorted(options.items())), bucket, positions, dtype, cuda_graph,
           model.embed_tokens.weight.device)
    engines = _ENGINES.setdefault(model, {})
    if key not in engines:
        # caches and graphs hold device memory: drop the oldest
        if len(engines) >= MAX_ENGINES_PER_MODEL:
            engines.pop(next(iter(engines)))
        engines[key] = engine_type(model, bucket, positions, dtype=dtype, cuda_graph=cuda_graph,
                                   **options)
        # The dictionary is weak in its keys; an engine holding its model strongly would keep the
        # model (and the engine's device memory) alive forever, so cached engines hold it weakly.
        engines[key]._keep = None
    engines[key] = engines.pop(key)  # most recently used last
    return engines[key]


def generate(model: nn.Module, prompts: Sequence[Sequence[int]] | Tensor, max_new_tokens: int, *,
             sampling: SamplingParams = SamplingParams(), stop_tokens: Sequence[int] = (),
             generator: torch.Generator | None = None, dtype: torch.dtype | None = None,
             n_samples: int = 1, engine_type: type[Engine] | None = None,
             **engine_options) -> GenerationResult:
    """Continue each prompt by up to ``max_new_tokens`` tokens (000 §6.1 with a KV cache).

    ``prompts``: a list of prompts (lists of token ids, any lengths) or a 2-D tensor ``(N, T)``;
    a single prompt (a flat list or a 1-D tensor) is refused: pass ``[prompt]``. ``sampling``: how
    each token is chosen (:class:`~halluc_lab.generation.sampling.SamplingParams`; default:
    temperature 1), drawn from ``generator`` (on the model's device). A row stops after a token in
    ``stop_tokens`` (which is kept). Same generator state, same tokens. ``n_samples`` = G
    continuations per prompt from one prefill; rows are prompt-major (rows p·G … p·G+G-1 belong to
    prompt p). ``engine_type`` and ``engine_options``: another kind of engine and its options
    (:func:`halluc_lab.generation.backtrack.rollout` passes the backspace engine's). A prompt plus
    ``max_new_tokens`` past the model's ``config.max_positions`` is refused before allocating.

    Example::

        out = generate(model, [[1, 2, 3]], 10, sampling=SamplingParams(greedy=True))
        out.token_lists()     # [[...10 ids...]]
        # 16 rows, 8 per prompt
        group = generate(model, [[1, 2, 3], [4]], 10, n_samples=8, generator=g)
    """
    prompts = prompt_lists(prompts)
    check_count("max_new_tokens", max_new_tokens)
    check_count("n_samples", n_samples, " (samples per prompt)")
    if not prompts:
        raise ValueError("prompts must hold at least one prompt")
    check_context(prompts, max_new_tokens, model_context(model))
    longest = max(len(p) for p in prompts)
    eng = engine_for(model, len(prompts) * n_samples, longest + max_new_tokens, dtype=dtype,
                     engine_type=engine_type, **engine_options)
    eng.start(prompts, max_new_tokens, sampling, stop_tokens=stop_tokens, generator=generator,
              n_samples=n_samples)
    eng.run()
    return eng.result()
