"""The lab's language model: a compact Llama-style decoder, readable top to bottom.

Chapters 6 and 7 of the book. Documents: 000 §3.1–3.5 (attention, multi-head attention, the
causal mask, RoPE, the transformer block), 001 Part 1 (the causal transformer as a map) and
Part 3 §1 (the model with a KV cache), 004 ch. 5 (multi-head attention, MQA/GQA) and §7.3 (RoPE).

The pieces: token embedding → ``n_layers`` pre-norm blocks (RMSNorm → self-attention with RoPE
and grouped-query heads → residual; RMSNorm → SwiGLU MLP → residual) → RMSNorm → a head that is
tied to the embedding or not; their shape is a :class:`~halluc_lab.model.config.ModelConfig`.
``model(input_ids)`` returns next-token logits ``(B, T, V)``.

Three ways to call it:

- training: ``model(input_ids)`` — causal attention over the whole sequence;
- packed training: ``model(input_ids, segment_ids=seg)`` — several sequences share a row,
  attention is block-diagonal-causal (a token sees only earlier tokens of its own segment) and
  positions restart at 0 in every segment, so packed and unpacked logits are equal;
- generation: ``model(new_ids, cache=cache)`` — keys and values of earlier tokens come from a
  :class:`~halluc_lab.model.kv_cache.KVCache`; the new ones are written to it (004 §6.2).

``logits_to_keep`` (Hugging Face's name) applies the head only where logits are used: the last k
positions, chosen positions, or none (a prefill that only fills the cache). The head is the largest
matrix of a small model, ``(B, T, V)`` its largest activation; nanoGPT's generation does the same.

Padding: right padding needs nothing — under the causal mask a real token never sees the pad
tokens after it; ignore the logits at pad positions. Rows of different lengths in generation
are handled by the cache's per-row lengths (the engine right-pads prompts and rolls the pads
back), so left padding is never needed.

Weights convert both ways with Hugging Face ``LlamaForCausalLM``, and checkpoints are saved and
loaded in HF's format (``config.json`` + safetensors), by the conversion module of the package; it
imports this one, never the reverse, so the model itself needs neither ``transformers`` nor files.

Where the code departs from the documents:

- 000 §3.5 writes the block with LayerNorm and ``FFN(x) = σ(xW₁+b₁)W₂+b₂``; the lab uses RMSNorm
  (no mean subtraction, no bias) and the SwiGLU MLP ``W_down(silu(x W_gate) ⊙ x W_up)`` of Llama,
  without biases, so that weights convert one to one with Hugging Face.
- ``W_Q, W_K, W_V`` of all heads are one matrix (``qkv_proj``) and ``W_gate, W_up`` another
  (``gate_up_proj``): the same maps, fewer kernel launches. The HF conversion splits them.
- Query/key/value heads follow :mod:`halluc_lab.model.attention` (query head h reads KV head
  ``h // (n_heads / n_kv_heads)``, 004 §5.2) and RoPE is
  :func:`halluc_lab.model.positional.apply_rope` (rotate-half layout, as Llama). ``fast=True`` calls
  PyTorch's fused attention; ``fast=False`` the readable
  :func:`halluc_lab.model.attention.scaled_dot_product_attention`. A test shows they agree.
- Output projections are initialised with std ``init_std/√(2·n_layers)`` (GPT-2's choice), so the
  residual stream does not grow with depth; the documents do not discuss initialisation.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from halluc_lab.model import attention
from halluc_lab.model.config import ModelConfig
from halluc_lab.model.kv_cache import KVCache
from halluc_lab.model.positional import apply_rope, rope_cos_sin, rope_frequencies

Tensor = torch.Tensor
_SDPA_GQA = tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 5)  # enable_gqa= exists


# ----------------------------------------------------------------------------- building blocks

def rms_norm_reference(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm, ``x / √(mean(x²) + ε) · w``, in float32 then back to x's dtype (as HF's
    LlamaRMSNorm)."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)  # (..., d)
    return weight * h.to(x.dtype)


class RMSNorm(nn.Module):
    """Root-mean-square normalisation with a learned gain (no mean subtraction, no bias)."""

    def __init__(self, dim: int, eps: float, fast: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps, self.fast = eps, fast

    def forward(self, x: Tensor) -> Tensor:
        if self.fast:  # one fused kernel where PyTorch has one; same formula
            out_dtype = (x.dtype if x.dtype == self.weight.dtype
                         else torch.promote_types(x.dtype, self.weight.dtype))
            return F.rms_norm(x.float(), x.shape[-1:], self.weight.float(), self.eps).to(out_dtype)
        return rms_norm_reference(x, self.weight, self.eps)


class SelfAttention(nn.Module):
    """Causal self-attention with RoPE and ``n_kv_heads`` key/value heads; reads and writes a KV
    cache."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        c = config
        self.n_heads, self.n_kv_heads = c.n_heads, c.n_kv_heads
        self.head_dim, self.fast = c.head_dim, c.fast
        # W_Q, W_K, W_V of every head stacked as one matrix: one matmul instead of three.
        self.qkv_proj = nn.Linear(c.hidden_size, (c.n_heads + 2 * c.n_kv_heads) * c.head_dim,
                                  bias=False)
        self.o_proj = nn.Linear(c.n_heads * c.head_dim, c.hidden_size, bias=False)  # W_O

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None,
                cache: KVCache | None = None, layer: int = 0, slots: Tensor | None = None,
                n_keys: int = 0) -> Tensor:
        B, T, _ = x.shape
        H, H_kv, D = self.n_heads, self.n_kv_heads, self.head_dim
        qk, v = self.qkv_proj(x).view(B, T, H + 2 * H_kv, D).split([H + H_kv, H_kv], dim=2)
        # RoPE on queries and keys, not values
        q, k = apply_rope(qk, cos, sin).split([H, H_kv], dim=2)
        q = q.transpose(1, 2)  # (B, H, T, D); k and v stay (B, T, H_kv, D), the cache's layout
        # 004 §6.2: store this step's keys/values, attend over all stored ones
        if cache is not None:
            cache.write(layer, k, v, slots)
            k, v = cache.read(layer, n_keys)  # (B, H_kv, n_keys, D)
        else:
            k, v = k.transpose(1, 2), v.transpose(1, 2)  # (B, H_kv, T, D)
        out = self.attend(q, k.to(q.dtype), v.to(q.dtype), mask)  # (B, H, T, D)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, H * D))  # concat heads, W_O: (B, T, d)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """``softmax(q kᵀ/√D + mask) v`` with KV heads shared by groups of query heads.

        q ``(B, H, T_q, D)``, k and v ``(B, H_kv, T_k, D)``, mask boolean ``(B, 1, T_q, T_k)`` or
        None (causal). Every query sees at least its own key, so no row is fully masked.
        """
        n_rep = self.n_heads // self.n_kv_heads
        if not self.fast:
            out, _ = attention.scaled_dot_product_attention(
                q, attention.repeat_kv(k, n_rep), attention.repeat_kv(v, n_rep), mask,
                causal=mask is None)
            return out
        # On CUDA, packed rows and prefills (a mask, several queries) go to SDPA's memory-efficient
        # kernel, which takes no grouped heads: expanded here, since with deterministic algorithms
        # on the other candidates fall back to a float32 math path (an H100 training step at full
        # scale: 8.7 → 5.8 ms). Decoding (one query) keeps them, and so does the CPU, whose kernels
        # have no such fallback.
        if n_rep > 1 and (not _SDPA_GQA or (mask is not None and q.shape[2] > 1 and q.is_cuda)):
            k, v = attention.repeat_kv(k, n_rep), attention.repeat_kv(v, n_rep)
        gqa = {"enable_gqa": True} if k.shape[1] != q.shape[1] else {}
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                              **gqa)


class MLP(nn.Module):
    """SwiGLU feed-forward: ``W_down(silu(x W_gate) ⊙ x W_up)`` (Llama's, without biases)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # (B, T, I) each
        return self.down_proj(F.silu(gate) * up)


class Block(nn.Module):
    """One pre-norm transformer block: ``h' = h + Attn(Norm(h))``, ``h'' = h' + MLP(Norm(h'))`` (000
    §3.5)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.norm_eps, config.fast)
        self.self_attn = SelfAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.norm_eps, config.fast)
        self.mlp = MLP(config)

    def forward(self, h: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None,
                cache: KVCache | None, layer: int, slots: Tensor | None, n_keys: int) -> Tensor:
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, mask, cache, layer, slots, n_keys)
        return h + self.mlp(self.post_attention_layernorm(h))


def segment_positions(segment_ids: Tensor) -> Tensor:
    """Position of each token within its segment: restarts at 0 where the id changes.
    ``(B, T) → (B, T)``.

    >>> segment_positions(torch.tensor([[1, 1, 1, 2, 2, 0]])).tolist()
    [[0, 1, 2, 0, 1, 0]]
    """
    B, T = segment_ids.shape
    t = torch.arange(T, device=segment_ids.device).expand(B, T)  # (B, T)
    starts = torch.ones_like(segment_ids, dtype=torch.bool)
    starts[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]  # (B, T) a segment begins here
    # (B, T) its first index
    first = torch.where(starts, t, torch.zeros_like(t)).cummax(dim=1).values
    return t - first


def segment_mask(segment_ids: Tensor) -> Tensor:
    """Block-diagonal-causal mask ``(B, 1, T, T)``: True where query i may see key j (j ≤ i, same
    segment)."""
    T = segment_ids.shape[1]
    same = segment_ids[:, :, None] == segment_ids[:, None, :]  # (B, T, T)
    return (same & attention.causal_mask(T, device=segment_ids.device))[:, None]  # (B, 1, T, T)


def _capturing(t: Tensor) -> bool:
    """True inside a CUDA-graph capture or a compiled graph, where a host sync (a value check)
    cannot run."""
    return torch.compiler.is_compiling() or (t.is_cuda and torch.cuda.is_current_stream_capturing())


def check_logits_to_keep(logits_to_keep: int | Tensor, B: int, T: int,
                         device: torch.device) -> slice | Tensor:
    """Check ``logits_to_keep`` (see :meth:`Transformer.forward`) for ``(B, T)`` inputs: a slice or
    positions."""
    if isinstance(logits_to_keep, Tensor):
        index = logits_to_keep.to(device)
        if index.dtype not in (torch.long, torch.int) or index.ndim not in (1, 2) or (
                index.ndim == 2 and index.shape[0] != B):
            raise ValueError("logits_to_keep must be an int, or an int tensor of positions (K,) "
                             f"or ({B}, K), "
                             f"got {index.dtype} {tuple(index.shape)}")
        if (index.numel() and not _capturing(index)
                and not 0 <= int(index.min()) <= int(index.max()) < T):
            raise ValueError(f"logits_to_keep positions must lie in [0, {T - 1}], got "
                             f"{index.tolist()}")
        return index
    if (not isinstance(logits_to_keep, int) or isinstance(logits_to_keep, bool)
            or not 0 <= logits_to_keep <= T):
        raise ValueError(f"logits_to_keep must be an int in [0, {T}] (0 = all positions) or a "
                         "tensor of positions, "
                         f"got {logits_to_keep!r}")
    return slice(T - logits_to_keep if logits_to_keep else 0, T)  # the last k (all for 0)


def keep_positions(h: Tensor, keep: slice | Tensor) -> Tensor:
    """``h`` ``(B, T, d)`` at the positions :func:`check_logits_to_keep` chose: ``(B, K, d)``."""
    if isinstance(keep, Tensor) and keep.ndim == 2:  # (B, K): row b's own positions
        return h.gather(1, keep[:, :, None].expand(*keep.shape, h.shape[-1]))
    return h[:, keep]  # (B, K, d)


# ----------------------------------------------------------------------------- the model

class Transformer(nn.Module):
    """The decoder:
    ``model(input_ids (B, T), position_ids, segment_ids, cache, *, logits_to_keep) -> (B, T, V)``.

    Example::

        model = Transformer(ModelConfig(vocab_size=512, hidden_size=64, n_layers=2, n_heads=4,
                                        n_kv_heads=2))
        logits = model(torch.randint(0, 512, (2, 10)))     # (2, 10, 512)
    """

    def __init__(self, config: ModelConfig, *, seed: int = 0) -> None:
        super().__init__()
        if not isinstance(config, ModelConfig):
            raise TypeError(f"config must be a ModelConfig, got {type(config).__name__}")
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.hidden_size, config.norm_eps, config.fast)
        self.lm_head = None if config.tie_embeddings else nn.Linear(config.hidden_size,
                                                                    config.vocab_size, bias=False)
        # RoPE frequencies stay float32 whatever dtype the weights are cast to (a bf16 θ_k would
        # shift every angle), so they are a plain attribute, not a buffer that .to() would cast.
        self._inv_freq, self.attention_factor = rope_frequencies(config.head_dim, config.rope_theta,
                                                                 config.rope_scaling)  # (D/2,)
        self.reset_parameters(seed)

    @torch.no_grad()
    def reset_parameters(self, seed: int = 0) -> None:
        """Normal(0, init_std) weights (output projections / √(2L)), unit norm gains; same on every
        device."""
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {seed!r}")
        # drawn on the CPU, so the weights do not depend on the device
        g = torch.Generator().manual_seed(seed)
        std = self.config.init_std
        residual_std = self.config.init_std / math.sqrt(2 * self.config.n_layers)
        for name, p in self.named_parameters():
            if name.endswith("layernorm.weight") or name == "norm.weight":
                p.fill_(1.0)
            else:
                s = residual_std if name.endswith(("o_proj.weight", "down_proj.weight")) else std
                p.copy_(torch.randn(p.shape, generator=g) * s)

    def inv_freq(self, device: torch.device) -> Tensor:
        """RoPE's θ_k ``(D/2,)`` in float32 on ``device`` (moved once and kept)."""
        if self._inv_freq.device != device:
            self._inv_freq = self._inv_freq.to(device)
        return self._inv_freq

    def forward(self, input_ids: Tensor, position_ids: Tensor | None = None,
                segment_ids: Tensor | None = None, cache: KVCache | None = None, *,
                logits_to_keep: int | Tensor = 0) -> Tensor:
        """Next-token logits ``(B, T, V)`` for ``input_ids`` ``(B, T)`` (token ids in
        ``[0, vocab_size)``).

        ``position_ids`` ``(B, T)`` or ``(T,)``: RoPE positions (default: 0…T-1, the
        segment-relative position with ``segment_ids``, the cache slot with ``cache``).
        ``segment_ids`` ``(B, T)`` ints: packed sequences, contiguous runs of equal id; they never
        attend to each other. ``cache``: a :class:`KVCache` with B rows; the tokens are appended to
        each row (written at slot ``cache.lengths[b] + i``) and every row's length grows by T.
        ``logits_to_keep``: 0 = every position; an int k = the last k, ``(B, k, V)``; a tensor of
        positions ``(K,)`` (the same in every row) or ``(B, K)`` (per row) gives ``(B, K, V)``; an
        empty ``(0,)`` tensor skips the head. Positions past ``config.max_positions`` (T, after what
        the cache holds) raise ValueError.
        """
        self._check_input_ids(input_ids)
        B, T = input_ids.shape
        device = input_ids.device
        # checked before the cache changes
        keep = check_logits_to_keep(logits_to_keep, B, T, device)
        self._check_context(T, cache)
        slots, n_keys = None, 0
        if cache is not None:
            if segment_ids is not None:
                raise ValueError("segment_ids (packing) and cache cannot be combined: generation "
                                 "has one sequence per row")
            if cache.batch_size != B or cache.n_layers != self.config.n_layers:
                raise ValueError(f"the cache has {cache.batch_size} rows and "
                                 f"{cache.n_layers} layers; "
                                 f"input_ids has {B} rows and the model "
                                 f"{self.config.n_layers} layers")
            slots = cache.slots(T)  # (B, T); raises if a row is full
            n_keys = cache.window(T)
            keys = torch.arange(n_keys, device=device)  # (n_keys,)
            # (B, 1, T, n_keys): key slot ≤ own slot
            mask = (keys[None, None, :] <= slots[:, :, None])[:, None]
            positions = slots if position_ids is None else position_ids
        elif segment_ids is not None:
            if segment_ids.shape != input_ids.shape:
                raise ValueError("segment_ids must have input_ids' shape "
                                 f"{tuple(input_ids.shape)}, got {tuple(segment_ids.shape)}")
            mask = segment_mask(segment_ids)  # (B, 1, T, T)
            positions = segment_positions(segment_ids) if position_ids is None else position_ids
        else:
            mask = None  # plain causal attention
            positions = torch.arange(T, device=device) if position_ids is None else position_ids
        h = self.embed_tokens(input_ids)  # (B, T, d)
        cos, sin = self._rope(positions, device, h.dtype)  # (B or 1, T, 1, D)
        for i, layer in enumerate(self.layers):
            h = layer(h, cos, sin, mask, cache, i, slots, n_keys)  # (B, T, d)
        if cache is not None:
            cache.advance(T)
        # (B, K, d): the norm is per position, so slice first
        h = self.norm(keep_positions(h, keep))
        # (B, K, V)
        return F.linear(h, self.embed_tokens.weight) if self.lm_head is None else self.lm_head(h)

    def _check_context(self, T: int, cache: KVCache | None) -> None:
        """ValueError for positions past ``config.max_positions``: T new ones after the cache's."""
        held = 0 if cache is None else cache.bound  # a host-side bound, no sync; 0 in a capture
        context = self.config.max_positions
        if held + T > context:
            cached = f", the cache holds up to {held}" if cache is not None else ""
            raise ValueError(f"a forward pass to position {held + T} is past the model's context, "
                             f"config.max_positions={context} (input_ids has T={T}{cached})")

    def _check_input_ids(self, input_ids: Tensor) -> None:
        """An int tensor ``(B, T)``, T ≥ 1, ids in ``[0, V)`` (one min/max sync, skipped in CUDA
        graph capture)."""
        if not isinstance(input_ids, Tensor):
            raise TypeError("input_ids must be a torch.Tensor of token ids (B, T), got "
                            f"{type(input_ids).__name__}")
        if input_ids.dtype not in (torch.long, torch.int):
            raise TypeError("input_ids must be an int64 or int32 tensor of token ids, got "
                            f"{input_ids.dtype}")
        if input_ids.ndim != 2 or input_ids.shape[1] < 1:
            raise ValueError("input_ids must have shape (B, T) with T >= 1, got "
                             f"{tuple(input_ids.shape)}")
        if input_ids.numel() == 0 or _capturing(input_ids):
            # no host sync inside a capture or a compiled graph: the engine checks its tokens itself
            return
        low, high = torch.stack(torch.aminmax(input_ids)).tolist()  # one sync
        V = self.config.vocab_size
        if low < 0 or high >= V:
            raise ValueError(f"input_ids must hold token ids in [0, {V - 1}] (vocab_size {V}), "
                             f"got ids from {low} to {high}")

    def _rope(self, positions: Tensor, device: torch.device, dtype: torch.dtype) -> tuple[Tensor,
                                                                                          Tensor]:
        """cos and sin ``(B or 1, T, 1, D)`` in the dtype the projections produce (cast once, not
        per layer)."""
        # (T, D) or (B, T, D)
        cos, sin = rope_cos_sin(positions, self.inv_freq(device), self.attention_factor)
        if cos.ndim == 2:
            cos, sin = cos[None], sin[None]  # (1, T, D)
        if torch.is_autocast_enabled(device.type):
            dtype = torch.get_autocast_dtype(device.type)
        # (B or 1, T, 1, D): one angle set for all heads
        return cos[:, :, None].to(dtype), sin[:, :, None].to(dtype)

    def new_cache(self, batch_size: int, max_positions: int | None = None,
                  dtype: torch.dtype | None = None) -> KVCache:
        """An empty :class:`KVCache` for this model on its device (default: max_positions, weight
        dtype)."""
        weight = self.embed_tokens.weight
        return KVCache.for_model(self.config, batch_size,
                                 max_positions or self.config.max_positions,
                                 dtype=dtype or weight.dtype, device=weight.device)
