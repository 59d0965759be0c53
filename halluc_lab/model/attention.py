"""Scaled dot-product attention, the causal mask and multi-head attention with MHA/GQA/MQA.

Chapter 4 of the book. Documents: 000 §3.1–3.3 (scaled dot-product attention, multi-head
attention, the causal mask), 001 App. A (eqs. 14–16, the single-head toy example, Listing 5),
004 ch. 5 (§5.1 worked example, §5.1.1 self-attention, §5.1.2 masked attention, §5.1.3
multi-head attention, §5.2 MQA/GQA).

Tensors are laid out as PyTorch's and Hugging Face's: ``(B, H, T, D)`` — batch, heads, time,
head dimension. The documents write one head with tokens as rows, ``softmax(QKᵀ/√d_k) V``
(004 §5.1.1), which is the same computation on a ``(T, D)`` slice.

Where the code departs from the documents:

- 001 App. A's worked example (scores 2, 1, 3) does not divide by √d_h although eq. (14) does;
  :func:`scaled_dot_product_attention` takes ``scale=1.0`` to reproduce it.
- 004 §5.1.2 writes ``softmax((QᵀK + M)/√d_k)``; the product is ``QKᵀ`` (``QᵀK`` is ``d_k × d_k``)
  and the mask is added after scaling, as in 000 §3.3 (the same thing, since ``M`` is 0 or −∞).
- A row whose every key is masked has no distribution to normalise; the documents do not say
  what happens. Here it gets zero weights and a zero output (never NaN), as PyTorch's
  ``scaled_dot_product_attention`` does on CPU.
- Projections are named ``q_proj``/``k_proj``/``v_proj``/``o_proj`` and have no bias, as in
  Hugging Face's ``LlamaAttention``, so weights convert one to one.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from halluc_lab.model.positional import apply_rope

Tensor = torch.Tensor


def causal_mask(T_q: int, T_k: int | None = None, *,
                device: torch.device | str | None = None) -> Tensor:
    """Boolean causal mask, True where a query may attend to a key (000 §3.3, 004 §5.1.2).

    With ``T_k > T_q`` the queries are the *last* ``T_q`` of ``T_k`` positions (decoding with a
    KV cache): query ``i`` sits at absolute position ``T_k - T_q + i`` and sees keys ``j`` up to it.

    Shapes: returns ``(T_q, T_k)``.

    >>> causal_mask(2, 3).int().tolist()
    [[1, 1, 0], [1, 1, 1]]
    """
    T_k = T_q if T_k is None else T_k
    for name, value in (("T_q", T_q), ("T_k", T_k)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if T_k < T_q:
        raise ValueError("T_k must be >= T_q (queries are the last T_q keys), got "
                         f"T_q={T_q}, T_k={T_k}")
    q_pos = torch.arange(T_k - T_q, T_k, device=device)  # (T_q,) absolute query positions
    k_pos = torch.arange(T_k, device=device)  # (T_k,)
    return k_pos[None, :] <= q_pos[:, None]  # (T_q, T_k)


def _allowed_and_bias(mask: Tensor | None, causal: bool, T_q: int, T_k: int,
                      device: torch.device) -> tuple[Tensor | None, Tensor | None]:
    """Split a mask into a boolean 'allowed' part (with the causal mask folded in) and an additive
    part."""
    allowed = causal_mask(T_q, T_k, device=device) if causal else None  # (T_q, T_k)
    bias = None
    if mask is not None:
        if mask.dtype == torch.bool:
            allowed = mask if allowed is None else allowed & mask
        else:  # a float mask (checked by _check_mask)
            bias = mask
    return allowed, bias


def _check_qkv(q: Tensor, k: Tensor, v: Tensor) -> None:
    """Clear errors for what torch would report as a bare shape or dtype mismatch."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got "
                            f"{t.dtype if isinstance(t, Tensor) else type(t).__name__}")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k and v must share one dtype, got {q.dtype}, {k.dtype} and {v.dtype}; "
                        "cast them first (e.g. k.to(q.dtype))")
    if q.ndim < 2 or k.ndim != q.ndim or v.ndim != q.ndim:
        raise ValueError(f"q, k, v must have the same rank >= 2, got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share the head dimension, got {q.shape[-1]} and "
                         f"{k.shape[-1]}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same number of positions, got {k.shape[-2]} and "
                         f"{v.shape[-2]}")
    if k.shape[:-2] != v.shape[:-2]:
        raise ValueError("k and v must share leading (batch, head) dimensions, got "
                         f"{tuple(k.shape)} and {tuple(v.shape)}")
    try:
        torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    except RuntimeError:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} leading dimensions do "
                         "not broadcast; "
                         "for grouped-query attention expand k and v with repeat_kv first"
                         ) from None


def _check_scale(scale: float | None) -> None:
    """``scale`` is None or a finite number (NaN or inf would turn every weight into NaN)."""
    if scale is not None and (not isinstance(scale, numbers.Real) or isinstance(scale, bool)
                              or not math.isfinite(scale)):
        raise ValueError(f"scale must be a finite number or None (= 1/√D), got {scale!r}")


def _check_mask(mask: Tensor | None, q: Tensor, k: Tensor) -> None:
    """The mask must be bool or float and broadcast to the scores' shape ``(..., T_q, T_k)`` without
    growing it."""
    if mask is None:
        return
    if not isinstance(mask, Tensor) or not (mask.dtype == torch.bool or mask.is_floating_point()):
        raise TypeError("mask must be a bool tensor (True = keep) or an additive float tensor, got "
                        f"{mask.dtype if isinstance(mask, Tensor) else type(mask).__name__}")
    scores = (*torch.broadcast_shapes(q.shape[:-2], k.shape[:-2]), q.shape[-2], k.shape[-2])
    try:
        fits = torch.broadcast_shapes(mask.shape, scores) == scores
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(f"mask must broadcast to the scores' shape {scores} (..., T_q, T_k), got "
                         f"{tuple(mask.shape)}")


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                                 causal: bool = False, *,
                                 scale: float | None = None) -> tuple[Tensor, Tensor]:
    """The readable reference: ``softmax(q kᵀ · scale + mask) v`` (000 Def. 3, 004 §5.1.1).

    Shapes: ``q`` ``(..., T_q, D)``, ``k`` ``(..., T_k, D)``, ``v`` ``(..., T_k, D_v)``; ``mask``
    boolean (True = keep) or additive float, broadcastable to ``(..., T_q, T_k)``; ``causal`` adds
    :func:`causal_mask`. ``scale`` defaults to ``1/√D``. Returns the output ``(..., T_q, D_v)`` and
    the weights ``(..., T_q, T_k)``. Rows with every key masked get zero weights and zero output.

    Example — 001 App. A's toy example (which omits the 1/√d scaling)::

        q = torch.tensor([[2., 1.]]); k = v = torch.tensor([[1., 0.], [0., 1.], [1., 1.]])
        out, w = scaled_dot_product_attention(q, k, v, scale=1.0)   # w ≈ [0.245, 0.090, 0.665]
    """
    _check_qkv(q, k, v)
    _check_mask(mask, q, k)
    _check_scale(scale)
    T_q, T_k = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale  # (..., T_q, T_k)
    allowed, bias = _allowed_and_bias(mask, causal, T_q, T_k, q.device)
    if bias is not None:
        scores = scores + bias.to(scores.dtype)  # additive mask: 0 keeps, -inf removes
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    # A row that is -inf everywhere has no softmax (0/0). Give it zero weights instead of NaN:
    # softmax a copy whose dead rows are 0, then zero those rows.
    dead = torch.isneginf(scores).all(dim=-1, keepdim=True)  # (..., T_q, 1)
    weights = torch.softmax(scores.masked_fill(dead, 0.0), dim=-1)  # (..., T_q, T_k)
    weights = weights.masked_fill(dead, 0.0)
    return weights @ v, weights  # (..., T_q, D_v), (..., T_q, T_k)


def fused_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                    causal: bool = False, *, scale: float | None = None) -> Tensor:
    """Fast path with the interface of :func:`scaled_dot_product_attention`, output only.

    Calls ``torch.nn.functional.scaled_dot_product_attention`` (fused kernels on GPU). Two details
    keep it equal to the reference: PyTorch's ``is_causal`` aligns the mask top-left, so when
    ``T_q != T_k`` the bottom-right :func:`causal_mask` is passed explicitly; and rows with every
    key masked are set to zero whatever the kernel returns.
    """
    _check_qkv(q, k, v)
    _check_mask(mask, q, k)
    _check_scale(scale)
    T_q, T_k = q.shape[-2], k.shape[-2]
    if mask is None and (not causal or T_q == T_k):
        # (..., T_q, D_v)
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    allowed, bias = _allowed_and_bias(mask, causal, T_q, T_k, q.device)
    if bias is not None:
        attn_mask = bias.to(q.dtype)
        if allowed is not None:
            attn_mask = attn_mask.masked_fill(~allowed, float("-inf"))
        live = ~torch.isneginf(attn_mask).all(dim=-1, keepdim=True)  # (..., T_q, 1)
    else:
        attn_mask = allowed
        live = allowed.any(dim=-1, keepdim=True)  # (..., T_q, 1)
    # PyTorch's kernel wants (T_q or 1, T_k)
    attn_mask = attn_mask if attn_mask.ndim >= 2 else attn_mask[None]
    # (..., T_q, D_v)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale)
    return torch.where(live, out, torch.zeros((), dtype=out.dtype, device=out.device))


def repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """Share each key/value head with ``n_rep`` query heads:
    ``(B, H_kv, T, D) → (B, H_kv·n_rep, T, D)``.

    Query head ``h`` reads key/value head ``h // n_rep`` (grouped-query attention, 004 §5.2),
    the same order as Hugging Face's ``repeat_kv``.
    """
    if not isinstance(n_rep, int) or isinstance(n_rep, bool) or n_rep < 1:
        raise ValueError(f"n_rep must be a positive int, got {n_rep!r}")
    if x.ndim != 4:
        raise ValueError(f"x must have shape (B, H_kv, T, D), got {tuple(x.shape)}")
    if n_rep == 1:
        return x
    B, H_kv, T, D = x.shape
    return x[:, :, None].expand(B, H_kv, n_rep, T, D).reshape(B, H_kv * n_rep, T, D)  # (B, H, T, D)


@dataclass(frozen=True)
class AttentionConfig:
    """Shape of one multi-head attention layer (000 §3.2, 004 §5.1.3 and §5.2)."""

    d_model: int  # width of the residual stream the layer reads and writes
    n_heads: int  # number of query heads
    # key/value heads: n_heads = MHA, 1 = MQA, in between = GQA; None = n_heads
    n_kv_heads: int | None = None
    head_dim: int | None = None  # per-head width d_h; None = d_model // n_heads (004 §5.1.3)
    fast: bool = True  # use fused_attention (PyTorch's kernel); False = the readable reference

    def __post_init__(self) -> None:
        for name in ("d_model", "n_heads", "n_kv_heads", "head_dim"):
            value = getattr(self, name)
            if value is None and name in ("n_kv_heads", "head_dim"):
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
            object.__setattr__(self, name, int(value))  # a numpy integer: a plain int
        if not isinstance(self.fast, bool):
            raise TypeError(f"fast must be a bool, got {type(self.fast).__name__} {self.fast!r}")
        if self.n_kv_heads is not None and self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_kv_heads must divide n_heads={self.n_heads}, "
                             f"got {self.n_kv_heads}")
        if self.head_dim is None and self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                             "give head_dim")

    @property
    def kv_heads(self) -> int:
        """Number of key/value heads actually used."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def dim(self) -> int:
        """Per-head width d_h."""
        return self.d_model // self.n_heads if self.head_dim is None else self.head_dim

    @property
    def kv_values_per_token(self) -> int:
        """Numbers a KV cache stores per token for this layer: one key and one value per KV head."""
        return 2 * self.kv_heads * self.dim


class MultiHeadAttention(nn.Module):
    """Multi-head self-attention with ``n_kv_heads`` key/value heads (MHA, GQA or MQA).

    ``forward(x)`` is :meth:`project` (linear maps, split into heads, optional RoPE) followed by
    :meth:`attend` (repeat KV heads, attention, merge heads, output projection); a KV cache can sit
    between the two. Shapes: ``x`` ``(B, T, d_model)`` → ``(B, T, d_model)``.

    Example::

        mha = MultiHeadAttention(AttentionConfig(d_model=64, n_heads=8, n_kv_heads=2))
        y = mha(torch.randn(2, 5, 64))              # (2, 5, 64), causal by default
    """

    def __init__(self, config: AttentionConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        # W_Q for all heads at once
        self.q_proj = nn.Linear(c.d_model, c.n_heads * c.dim, bias=False)
        # W_K, one block per KV head
        self.k_proj = nn.Linear(c.d_model, c.kv_heads * c.dim, bias=False)
        # W_V, one block per KV head
        self.v_proj = nn.Linear(c.d_model, c.kv_heads * c.dim, bias=False)
        # W_O after concatenating heads
        self.o_proj = nn.Linear(c.n_heads * c.dim, c.d_model, bias=False)

    def project(self, x: Tensor, cos: Tensor | None = None,
                sin: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Queries ``(B, H, T, D)``, keys and values ``(B, H_kv, T, D)``, rotated by RoPE if cos/sin
        given."""
        if x.ndim != 3 or x.shape[-1] != self.config.d_model:
            raise ValueError(f"x must have shape (B, T, {self.config.d_model}), got "
                             f"{tuple(x.shape)}")
        if (cos is None) != (sin is None):
            raise ValueError("cos and sin must be given together")
        B, T, _ = x.shape
        c = self.config
        q = self.q_proj(x).view(B, T, c.n_heads, c.dim).transpose(1, 2)  # (B, H, T, D)
        k = self.k_proj(x).view(B, T, c.kv_heads, c.dim).transpose(1, 2)  # (B, H_kv, T, D)
        v = self.v_proj(x).view(B, T, c.kv_heads, c.dim).transpose(1, 2)  # (B, H_kv, T, D)
        if cos is not None:
            # RoPE on q and k only (004 §7.3)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return q, k, v

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
               causal: bool = True, need_weights: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Attention over (possibly cached) keys and values, heads merged and projected:
        ``(B, T_q, d_model)``."""
        n_rep = self.config.n_heads // self.config.kv_heads
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)  # (B, H, T_k, D)
        if need_weights or not self.config.fast:
            out, weights = scaled_dot_product_attention(q, k, v, mask, causal)  # (B, H, T_q, D)
        else:
            out, weights = fused_attention(q, k, v, mask, causal), None  # (B, H, T_q, D)
        B, H, T_q, D = out.shape
        # concat heads, then W_O: (B, T_q, d_model)
        y = self.o_proj(out.transpose(1, 2).reshape(B, T_q, H * D))
        return (y, weights) if need_weights else y

    def forward(self, x: Tensor, cos: Tensor | None = None, sin: Tensor | None = None, *,
                mask: Tensor | None = None, causal: bool = True,
                need_weights: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Self-attention of ``x`` ``(B, T, d_model)``; with ``need_weights`` also the
        ``(B, H, T, T)`` weights."""
        q, k, v = self.project(x, cos, sin)
        return self.attend(q, k, v, mask, causal, need_weights)
