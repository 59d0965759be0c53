"""How a deviation travels through the model: the residual stream, the distance between two runs,
and the Jacobians of one block and of several.

Chapter 11. Source: 001 Part 3 §2 ("Dynamics of Hallucination"). Its claim: once a low-probability
but coherent token is sampled, the transformer, built of residual connections and attention, neither
pulls the state back towards a factual path nor blows the error up; the deviation propagates
"approximately neutrally" — "the Jacobian of the hidden-state map with respect to earlier tokens
often remains close to preserving small deviations across layers", and residual streams "exhibit
near-unit singular values in semantically relevant directions". The document cites this; the lab
measures it on its own models.

What is measured, with h_l the residual stream after l blocks (h_0 the token embeddings, h_L the
last block's output, before the final RMSNorm), ``(T, d)`` for one sequence:

- :func:`residual_stream`: every h_l of a run, ``(L+1, B, T, d)``, read with forward hooks on the
  model.
- :func:`deviation`: a wrong token is not a small perturbation, so the first measurement is the
  finite one: two teacher-forced runs (the clean sequence and one with a token swapped) and the
  relative distance ‖h'_{l,t} − h_{l,t}‖ / ‖h_{l,t}‖ by layer l and position t. By causality it is
  exactly 0 before the swapped position; after it, it says whether the deviation grows, fades or
  stays, down the layers and along the positions that attend to it.
- :func:`block_jacobian`: ∂h_{l+1}[t] / ∂h_l[t] ``(d, d)``, one block at one position, the block's
  inputs at the other positions held fixed. A pre-norm block is ``h + Attn(Norm h) + MLP(Norm …)``,
  so its Jacobian is I plus the branches' terms: singular values near 1 are the document's
  "near-unit".
- :func:`stream_jacobian`: ∂h_last[target] / ∂h_first[source] ``(d, d)``, through blocks
  first…last-1. With source < target only attention carries the change (the residual path stays at
  its own position); with first = 0 it is the Jacobian "with respect to earlier tokens" (their
  embeddings) of 001.

Their singular values are ``torch.linalg.svdvals(J)`` (descending): near 1, deviations are
preserved; well below, the map forgets them; well above, it amplifies them.

Choices:

- The stream is read before the final RMSNorm, as the residual stream of the interpretability work
  001 cites. 001's feature s_t is the map's output fed to W_out; the norm only rescales it per
  position.
- The Jacobians rerun the model's own blocks on the recorded stream, with the RoPE angles the
  model's forward passed them (read by a pre-hook on block 0), so there is one code path and
  ``model.py`` has no hook of its own. They are exact (reverse-mode autograd), not finite
  differences: the d rows of a Jacobian come from one backward pass over d copies of the sequence,
  each differentiating one output coordinate. ``torch.func.jacrev`` gives the same numbers, but its
  vmap has no batching rule for the backward of PyTorch's fused attention and falls back to a loop
  (15× slower on a CPU at d = 128, with a warning). The copies cost d times the activations of one
  sequence of target+1 tokens.
- Results are float32 (float64 for a float64 model; its RMSNorms still compute in float32, as the
  model's do). Under autocast the blocks run in bf16 and the Jacobians carry bf16's rounding:
  measure without it.
- Only positions ≤ target can affect position target (causal attention), so a Jacobian runs the
  sequence's first target+1 positions only.
"""

from __future__ import annotations

import torch
from torch import nn

from halluc_lab.evaluation.evaluate import _eval_mode

Tensor = torch.Tensor

__all__ = ["block_jacobian", "deviation", "residual_stream", "stream_jacobian"]


def _check_ids(name: str, ids: Tensor, ndim: int) -> None:
    """``ids`` an int tensor of ``ndim`` dimensions (``(T,)`` one sequence, ``(B, T)`` a batch),
    T ≥ 1."""
    shape = "(T,): one sequence" if ndim == 1 else "(B, T)"
    if not isinstance(ids, Tensor) or ids.dtype not in (torch.long, torch.int):
        raise TypeError(f"{name} must be an int64 or int32 tensor of token ids {shape}, got "
                        f"{ids.dtype if isinstance(ids, Tensor) else type(ids).__name__}")
    if ids.ndim != ndim or ids.shape[-1] < 1:
        raise ValueError(f"{name} must have shape {shape} with T >= 1, got {tuple(ids.shape)}")


def _check_index(name: str, value: int, low: int, high: int) -> None:
    """``value`` an int in ``[low, high)``."""
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value < high:
        raise ValueError(f"{name} must be an int in [{low}, {high}), got {value!r}")


def _out_dtype(x: Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)  # bf16 → float32; float64 stays


def _trace(model: nn.Module, input_ids: Tensor) -> tuple[list[Tensor], Tensor, Tensor]:
    """A plain forward of ``input_ids`` ``(B, T)``: the L+1 streams ``(B, T, d)`` and RoPE's cos,
    sin."""
    states: list[Tensor] = []
    rope: list[Tensor] = []

    def record(module: nn.Module, args: tuple, output: Tensor) -> None:
        states.append(output.detach())  # (B, T, d)

    def record_rope(module: nn.Module, args: tuple) -> None:
        # Block(h, cos, sin, mask, …): cos, sin (1, T, 1, D), the same for every block
        rope[:] = args[1:3]

    handles = [model.embed_tokens.register_forward_hook(record),
               model.layers[0].register_forward_pre_hook(record_rope)]
    handles += [layer.register_forward_hook(record) for layer in model.layers]
    try:
        with _eval_mode(model), torch.no_grad():
            no_logits = torch.empty(0, dtype=torch.long, device=input_ids.device)  # skip the head
            model(input_ids, logits_to_keep=no_logits)
    finally:
        for handle in handles:
            handle.remove()
    return states, rope[0], rope[1]


def residual_stream(model: nn.Module, input_ids: Tensor) -> Tensor:
    """The residual stream of every layer ``(L+1, B, T, d)`` for ``input_ids`` ``(B, T)``, no grad.

    Index 0 is the token embeddings (block 0's input), index l the output of block l-1, before the
    final RMSNorm. The model runs in eval mode and returns to its mode; the hooks are removed
    afterwards.

    >>> from halluc_lab.model.config import ModelConfig
    >>> from halluc_lab.model.transformer import Transformer
    >>> model = Transformer(ModelConfig(vocab_size=16, hidden_size=8, n_layers=2, n_heads=2))
    >>> residual_stream(model, torch.tensor([[1, 2, 3]])).shape
    torch.Size([3, 1, 3, 8])
    """
    _check_ids("input_ids", input_ids, 2)
    states, _, _ = _trace(model, input_ids)
    return torch.stack(states).to(_out_dtype(states[0]))  # (L+1, B, T, d)


def deviation(model: nn.Module, clean_ids: Tensor, perturbed_ids: Tensor) -> Tensor:
    """Relative distance ‖h'_{l,t} − h_{l,t}‖ / ‖h_{l,t}‖ between two teacher-forced runs
    ``(L+1, B, T)``.

    ``clean_ids`` and ``perturbed_ids`` ``(B, T)``, the same shape (typically one token swapped).
    Positions before the first differing token are exactly 0: causal attention never sees the swap
    from there.
    """
    _check_ids("clean_ids", clean_ids, 2)
    _check_ids("perturbed_ids", perturbed_ids, 2)
    if clean_ids.shape != perturbed_ids.shape:
        raise ValueError("clean_ids and perturbed_ids must have the same shape, got "
                         f"{tuple(clean_ids.shape)} "
                         f"and {tuple(perturbed_ids.shape)}")
    h = residual_stream(model, clean_ids)  # (L+1, B, T, d)
    # (L+1, B, T, d): a separate run, so the same kernels
    h_pert = residual_stream(model, perturbed_ids)
    return (h_pert - h).norm(dim=-1) / h.norm(dim=-1)  # (L+1, B, T)


def _jacobian(model: nn.Module, input_ids: Tensor, source: int, target: int, first: int,
              last: int) -> Tensor:
    """∂h_last[target] / ∂h_first[source] ``(d, d)`` for one sequence ``(T,)``; arguments already
    checked."""
    states, cos, sin = _trace(model, input_ids[None])
    n = target + 1  # causal: positions after target cannot reach it
    h = states[first][0, :n]  # (n, d)
    d = h.shape[-1]
    # Row i of J is the gradient of output coordinate i: d copies of the sequence in one batch, copy
    # i's output i summed, one backward pass (jacrev's vmap has no batching rule for SDPA's
    # backward: 15× slower).
    x = h[source].expand(d, d).clone().requires_grad_(True)  # (d, d): copy i's stream at `source`
    with _eval_mode(model), torch.enable_grad():
        # the other positions, fixed
        before, after = h[:source].expand(d, -1, -1), h[source + 1:].expand(d, -1, -1)
        h_in = torch.cat([before, x[:, None], after], dim=1)  # (d, n, d)
        for i in range(first, last):
            # causal: no mask, no cache
            h_in = model.layers[i](h_in, cos[:, :n], sin[:, :n], None, None, i, None, 0)
        # (d, d): J[i, j] = ∂ out_i / ∂ in_j
        (J,) = torch.autograd.grad(h_in[:, target].diagonal().sum(), x)
    return J.to(_out_dtype(J))


def block_jacobian(model: nn.Module, input_ids: Tensor, layer: int, position: int) -> Tensor:
    """∂h_{layer+1}[position] / ∂h_layer[position] ``(d, d)``: block ``layer`` at one position.

    ``input_ids`` ``(T,)``: one sequence, run as the model runs it; the block's inputs at the other
    positions are held at that run's values, so the Jacobian holds the residual path (I), the MLP's
    and the position's own attention path (its query, key and value).
    ``J[i, j] = ∂ out_i / ∂ in_j``.
    """
    _check_ids("input_ids", input_ids, 1)
    _check_index("layer", layer, 0, len(model.layers))
    _check_index("position", position, 0, input_ids.shape[0])
    return _jacobian(model, input_ids, position, position, layer, layer + 1)


def stream_jacobian(model: nn.Module, input_ids: Tensor, source: int, target: int, *,
                    first: int = 0, last: int | None = None) -> Tensor:
    """∂h_last[target] / ∂h_first[source] ``(d, d)``: a small change of the stream at ``source``
    after ``first`` blocks, seen at ``target`` after ``last`` blocks (None = L, before the final
    norm).

    ``input_ids`` ``(T,)``: one sequence. The change goes through blocks first…last-1, carried
    across positions by attention; the streams at the other positions after ``first`` blocks are
    held at the run's values. ``source ≤ target`` (a later position cannot reach an earlier one),
    ``0 ≤ first < last ≤ L``.
    """
    _check_ids("input_ids", input_ids, 1)
    T, L = input_ids.shape[0], len(model.layers)
    last = L if last is None else last
    _check_index("target", target, 0, T)
    _check_index("source", source, 0, T)
    if source > target:
        raise ValueError(f"source must be <= target: under the causal mask position {source} "
                         "cannot reach the "
                         f"earlier position {target} (the Jacobian would be zero), got "
                         f"source={source}, "
                         f"target={target}")
    _check_index("last", last, 1, L + 1)
    _check_index("first", first, 0, last)
    return _jacobian(model, input_ids, source, target, first, last)
