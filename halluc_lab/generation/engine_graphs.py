"""The engine's CUDA graphs: its decode step, captured once per sampling setting
(:func:`capture_step`), and its prefill, captured once per batch shape (:class:`PrefillGraphs`). The
engine hands each capture the memory pool of its first step graph, so its graphs share one pool
(they replay one at a time); a prefill captured before any step, which the engine's own order never
does, gets a pool of its own.

A graph replays the kernels its capture recorded, on the addresses it recorded. So a replay gives
the bits the eager call gives, provided the inputs are copied into the tensors the capture read and
the weights stay where they were (:meth:`halluc_lab.generation.engine_core.Engine.start` recaptures
when they move). What a replay saves is the host's work: a forward pass of the lab's models is a few
hundred small kernels, and on a busy host launching them one by one takes longer than running them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from halluc_lab.device import to_device


def capture(body: Callable[[], None], device: torch.device, pool=None, *, warmup: int = 1,
            generator: torch.Generator | None = None) -> torch.cuda.CUDAGraph:
    """``body`` run ``warmup`` times on a side stream (cuBLAS workspaces, lazy caches; a compiled
    body compiles there), then captured in a new graph (``pool``: another graph's memory pool,
    shared). A capture records kernels without running them: what the warm-up calls wrote stays
    written. ``generator``: one the body draws from; each replay draws fresh numbers from it."""
    graph = torch.cuda.CUDAGraph()
    if generator is not None:
        graph.register_generator_state(generator)
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            body()
    torch.cuda.current_stream(device).wait_stream(stream)
    with torch.cuda.graph(graph, pool=pool):
        body()
    return graph


def capture_step(engine, body: Callable[[], None], pool=None) -> torch.cuda.CUDAGraph:
    """``engine``'s decode step ``body`` (its ``_step_body``, or the compiled one) captured after
    two warm-up steps, with every buffer the step writes, the cache's lengths and the generator put
    back afterwards."""
    saved = {name: getattr(engine, name).clone() for name in engine._STEP_STATE}
    saved_lengths, saved_bound = engine.cache.lengths.clone(), engine.cache.bound
    saved_rng = engine.generator.get_state()

    def traced() -> None:
        # The cache's host-side bound is 0 in every call: the room check must not sync inside the
        # capture (budgets guarantee room), and a compiled step, specialised on that int, must see
        # the same value in every call, or it recompiles inside the capture.
        engine.cache.bound = 0
        body()

    with torch.no_grad(), engine._autocast():
        graph = capture(traced, engine.device, pool, warmup=2,
                        generator=None if engine.params.greedy else engine.generator)
    torch.cuda.synchronize(engine.device)
    for name, value in saved.items():
        getattr(engine, name).copy_(value)
    engine.cache.lengths.copy_(saved_lengths)
    engine.cache.bound = saved_bound
    engine.generator.set_state(saved_rng)
    return graph


class PrefillGraphs:
    """The prefill's forward pass as CUDA graphs, one per shape ``(prompts, positions)`` of its
    input ids.

    A shape's first prefill runs eagerly. Its second is the warm-up of a capture (the real work, on
    a side stream) and the capture. From the third on, the ids are copied into the tensor the
    capture read and the graph replays. A shape met once (an evaluation's last, short batch) so
    costs no capture; the shapes an RL loop's rounds repeat cost one each.
    """

    def __init__(self) -> None:
        # shape -> (graph, its ids)
        self.graphs: dict[tuple[int, ...], tuple[torch.cuda.CUDAGraph, Tensor]] = {}
        self.seen: set[tuple[int, ...]] = set()

    def run(self, forward: Callable[[Tensor], None], ids: Tensor, device: torch.device,
            pool=None) -> None:
        """``forward(ids on the device)``: eagerly, captured, or replayed (above). ``forward`` must
        not synchronise with the host, and must write only tensors that keep their addresses."""
        shape = tuple(ids.shape)
        ids = to_device(ids, device)
        if shape in self.graphs:
            graph, static = self.graphs[shape]
            static.copy_(ids)
            graph.replay()
            return
        if shape not in self.seen:
            self.seen.add(shape)
            forward(ids)
            return
        self.graphs[shape] = capture(lambda: forward(ids), device, pool), ids
