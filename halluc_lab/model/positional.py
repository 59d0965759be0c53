"""Positional encodings: sinusoidal, RoPE, and RoPE's context-extension methods.

Chapter 5 of the book. Documents: 000 §3.4, 001 App. A (RoPE, remark (i)), 004 ch. 7 (§7.1
permutation equivariance, §7.2 sinusoidal encoding and its rotation view, §7.3 RoPE, §7.4
position interpolation, §7.5 NTK-aware scaling, §7.6 YaRN).

Two layouts of RoPE. The documents rotate *adjacent* pairs ``(x_{2k}, x_{2k+1})`` by ``m·θ_k``
(004 §7.3, 001 App. A): :func:`apply_rope_interleaved`. Llama and Hugging Face rotate the pairs
``(x_k, x_{k+D/2})`` ("rotate half"): :func:`apply_rope`. They are the same map up to a fixed
permutation of the head dimension (:func:`interleaved_to_half`), so scores ``qᵀk`` agree when q
and k are permuted alike; converting weights between them permutes the rows of ``W_Q`` and ``W_K``.

Where the code departs from the documents:

- Frequencies follow Hugging Face's RoPE initialisation (``transformers.modeling_rope_utils``)
  operation by operation, in float32, so a converted model gives the same logits.
- Position interpolation divides the frequencies by ``s`` instead of the positions (HF's form;
  the angles ``m·θ/s`` are the same), so positions stay integers.
- YaRN (004 §7.6.1) as *written* blends the other way round from the YaRN paper and every
  implementation: it keeps low frequencies and scales high ones. ``RopeScaling(kind="yarn")``
  follows HF (high frequencies kept, low ones interpolated, a ramp that is linear in the plane
  index between HF's rounded bounds); :func:`yarn_paper_inv_freq` is the paper's ramp, linear in
  the usage ratio; :func:`yarn_document_inv_freq` is the document's formula as printed.
- 004 §7.2.2's shift matrix rotates a ``[sin, cos]`` pair the wrong way;
  :func:`sinusoidal_shift_matrix` is the matrix that satisfies ``PE(p+k) = R(k) PE(p)`` for the
  documents' ``[sin, cos]`` order.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

Tensor = torch.Tensor
ROPE_KINDS = ("none", "linear", "ntk", "yarn")


def _check_head_dim(head_dim: int, name: str = "head_dim") -> None:
    if not isinstance(head_dim, int) or isinstance(head_dim, bool) or head_dim < 2 or head_dim % 2:
        raise ValueError(f"{name} must be a positive even int (RoPE rotates pairs), got "
                         f"{head_dim!r}")


def _check_number(name: str, value: object, low: float, *, inclusive: bool = False,
                  what: str = "") -> None:
    """TypeError unless a real number; ValueError unless finite and above ``low`` (or equal, if
    inclusive)."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    if not (math.isfinite(value) and (value >= low if inclusive else value > low)):
        raise ValueError(f"{name} must be a finite number {'>=' if inclusive else '>'} "
                         f"{low}{what}, got {value!r}")


def _check_positions(positions: Tensor, ndims: tuple[int, ...] = (1, 2)) -> None:
    if not isinstance(positions, Tensor):
        raise TypeError("positions must be an integer torch.Tensor, "
                        f"got {type(positions).__name__}")
    if positions.is_floating_point() or positions.is_complex() or positions.dtype == torch.bool:
        raise ValueError(f"positions must be integers (token indices), got dtype {positions.dtype}")
    if positions.ndim not in ndims:
        raise ValueError(f"positions must have {' or '.join(f'{n}' for n in ndims)} dims, got "
                         f"{tuple(positions.shape)}")


# ----------------------------------------------------------------------------- sinusoidal (004
# §7.2)

def sinusoidal_encoding(positions: Tensor, d_model: int, base: float = 10000.0,
                        dtype: torch.dtype = torch.float32) -> Tensor:
    """Sinusoidal absolute encoding: ``PE(p, 2i) = sin(p/base^{2i/d})``, ``PE(p, 2i+1) = cos(...)``
    (004 §7.2).

    Shapes: ``positions`` ``(T,)`` integer → ``(T, d_model)``.

    >>> sinusoidal_encoding(torch.tensor([1]), 4, dtype=torch.float64)[0].round(decimals=5).tolist()
    [0.84147, 0.5403, 0.01, 0.99995]
    """
    _check_head_dim(d_model, "d_model")
    _check_positions(positions, (1,))
    omega = sinusoidal_frequencies(d_model, base, dtype)  # (d/2,)
    angles = positions.to(dtype)[:, None] * omega  # (T, d/2)
    # (T, d): sin, cos interleaved
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(-2)


def sinusoidal_frequencies(d_model: int, base: float = 10000.0,
                           dtype: torch.dtype = torch.float64) -> Tensor:
    """The angular frequencies ``ω_i = base^{-2i/d}``, ``i = 0 … d/2-1`` (004 §7.2; same bank as
    RoPE's)."""
    _check_head_dim(d_model, "d_model")
    _check_number("base", base, 1)
    return base ** (-torch.arange(0, d_model, 2, dtype=dtype) / d_model)  # (d/2,)


def rotation_matrix(angles: Tensor) -> Tensor:
    """Block-diagonal 2-D rotations ``diag(R(a_1), R(a_2), …)`` with
    ``R(a) = [[cos a, -sin a], [sin a, cos a]]``.

    Shapes: ``angles`` ``(D/2,)`` → ``(D, D)``. With ``angles = m·θ`` this is RoPE's ``R_{Θ,m}``
    (001 App. A, 004 §7.3) acting on adjacent pairs.
    """
    if angles.ndim != 1:
        raise ValueError(f"angles must be 1-D, got shape {tuple(angles.shape)}")
    c, s = angles.cos(), angles.sin()  # (D/2,)
    blocks = torch.stack([torch.stack([c, -s], -1), torch.stack([s, c], -1)], -2)  # (D/2, 2, 2)
    return torch.block_diag(*blocks)  # (D, D)


def sinusoidal_shift_matrix(k: int, d_model: int, base: float = 10000.0) -> Tensor:
    """The matrix with ``PE(p + k) = M PE(p)`` for every p, in the documents' ``[sin, cos]`` pair
    order.

    For a ``[sin a, cos a]`` pair, adding ``b`` to the angle is
    ``[[cos b, sin b], [-sin b, cos b]]``, i.e. ``R(-ω k)``; 004 §7.2.2 prints ``R(+ω k)``, which is
    right for ``[cos, sin]`` order only.
    """
    return rotation_matrix(-k * sinusoidal_frequencies(d_model, base))  # (d, d) float64


# ----------------------------------------------------------------------------- RoPE frequencies

@dataclass(frozen=True)
class RopeScaling:
    """How RoPE's frequencies are changed to read past the training context (004 §7.4–7.6)."""

    # "none" | "linear" (position interpolation, §7.4) | "ntk" (NTK-aware base, §7.5) | "yarn"
    # (§7.6)
    kind: str = "none"
    factor: float = 1.0  # s = L'/L, the context extension factor; >= 1 (1 with kind "none")
    # L, the training context; needed by "yarn" (its ramp counts rotations in L)
    original_max_positions: int | None = None
    # YaRN: planes that turn more than this many times in L keep their frequency (paper's β)
    beta_fast: float = 32.0
    # YaRN: planes that turn fewer than this many times in L are fully interpolated (paper's α)
    beta_slow: float = 1.0
    # YaRN's multiplier on cos and sin; None = 0.1 ln s + 1 (= √(1/t), §7.6.2)
    attention_factor: float | None = None
    # YaRN: round the ramp's bounds to whole planes (floor/ceil), as HF does by default
    truncate: bool = True

    def __post_init__(self) -> None:
        if self.kind not in ROPE_KINDS:
            raise ValueError(f"kind must be one of {ROPE_KINDS}, got {self.kind!r}")
        _check_number("factor", self.factor, 1, inclusive=True,
                      what=" (the context extension L'/L)")
        if self.kind == "none" and self.factor != 1:
            raise ValueError(f"factor must be 1 with kind='none', got {self.factor!r}")
        L = self.original_max_positions
        if (L is not None or self.kind == "yarn") and (not isinstance(L, int)
                                                       or isinstance(L, bool) or L < 1):
            raise ValueError("original_max_positions must be a positive int (or None, unless "
                             "kind='yarn'), "
                             f"got {L!r}")
        _check_number("beta_slow", self.beta_slow, 0)
        _check_number("beta_fast", self.beta_fast, 0)
        if not self.beta_slow < self.beta_fast:
            raise ValueError(f"need 0 < beta_slow < beta_fast, got beta_slow={self.beta_slow}, "
                             f"beta_fast={self.beta_fast}")
        if self.attention_factor is not None:
            _check_number("attention_factor", self.attention_factor, 0, what=" or None")
        if not isinstance(self.truncate, bool):
            raise TypeError(f"truncate must be a bool, got {self.truncate!r}")


def _base_inv_freq(head_dim: int, base: float) -> Tensor:
    """``1 / base^{2i/D}`` in float32, the same operations as Hugging Face's default RoPE init."""
    # (D/2,)
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(dtype=torch.float) / head_dim
    return 1.0 / (base ** exponents)  # (D/2,)


def ntk_aware_base(base: float, factor: float, head_dim: int) -> float:
    """NTK-aware base ``b' = b · s^{D/(D-2)}`` (004 §7.5): the lowest frequency is divided by
    exactly s."""
    _check_head_dim(head_dim)
    _check_number("base", base, 1)
    _check_number("factor", factor, 1, inclusive=True, what=" (the context extension L'/L)")
    return base * factor ** (head_dim / (head_dim - 2))


def yarn_attention_factor(factor: float) -> float:
    """YaRN's ``√(1/t) = 0.1 ln s + 1`` (004 §7.6.2); multiplying cos and sin by it scales logits by
    ``1/t``."""
    _check_number("factor", factor, 0)
    return 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0


def _yarn_hf_inv_freq(head_dim: int, base: float, s: RopeScaling) -> Tensor:
    """HF's YaRN: a ramp linear in the plane index between the planes turning beta_fast and
    beta_slow times in L."""
    def plane_with_rotations(n: float) -> float:  # k such that L / (2π base^{2k/D}) = n
        return (head_dim * math.log(s.original_max_positions / (n * 2 * math.pi))
                / (2 * math.log(base)))

    low, high = plane_with_rotations(s.beta_fast), plane_with_rotations(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # HF's guard against a zero-width ramp
    pos_freqs = base ** (torch.arange(0, head_dim, 2).to(dtype=torch.float) / head_dim)  # (D/2,)
    # 0 = keep
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # weight of the unscaled frequency ("extrapolation")
    return (1.0 / (s.factor * pos_freqs)) * (1 - keep) + (1.0 / pos_freqs) * keep  # (D/2,)


def rope_frequencies(head_dim: int, base: float = 10000.0,
                     scaling: RopeScaling | None = None) -> tuple[Tensor, float]:
    """RoPE's inverse frequencies ``θ_k`` ``(D/2,)`` (float32, CPU) and the factor to multiply
    cos/sin by.

    ``θ_k = base^{-2k/D}`` (001 App. A, 004 §7.3); ``scaling`` applies position interpolation
    (``θ/s``), the NTK-aware base, or YaRN, matching Hugging Face's ``linear``, ``dynamic`` (at the
    length where its factor equals s) and ``yarn`` initialisations.

    Example::

        inv_freq, attn = rope_frequencies(
            64, scaling=RopeScaling("yarn", 4.0, original_max_positions=256))
    """
    _check_head_dim(head_dim)
    _check_number("base", base, 1)
    s = RopeScaling() if scaling is None else scaling
    if not isinstance(s, RopeScaling):
        raise TypeError(f"scaling must be a RopeScaling or None, got {type(s).__name__}")
    if s.kind == "none":
        return _base_inv_freq(head_dim, base), 1.0
    if s.kind == "linear":  # PI, 004 §7.4: angles (m/s)·θ = m·(θ/s)
        return _base_inv_freq(head_dim, base) / s.factor, 1.0
    if s.kind == "ntk":  # 004 §7.5: same positions, larger base
        return _base_inv_freq(head_dim, ntk_aware_base(base, s.factor, head_dim)), 1.0
    attention = (yarn_attention_factor(s.factor) if s.attention_factor is None
                 else float(s.attention_factor))
    return _yarn_hf_inv_freq(head_dim, base, s), attention


# ----------------------------------------------------------------------------- YaRN by parts (004
# §7.6.1)

def wavelength(inv_freq: Tensor) -> Tensor:
    """Tokens per full turn of each plane, ``λ_k = 2π/θ_k`` (004 §7.6.1)."""
    return 2 * math.pi / inv_freq


def usage_ratio(inv_freq: Tensor, context: int) -> Tensor:
    """Turns each plane completes across a training window of ``context`` tokens,
    ``r_k = L θ_k / 2π``."""
    return context * inv_freq / (2 * math.pi)


def yarn_ramp(r: Tensor, alpha: float = 1.0, beta: float = 32.0) -> Tensor:
    """The ramp ``γ(r)``: 0 below α, 1 above β, linear in ``r`` between (004 §7.6.1, YaRN paper
    eq. 18)."""
    _check_number("alpha", alpha, 0)
    _check_number("beta", beta, 0)
    if not alpha < beta:
        raise ValueError(f"need 0 < alpha < beta, got alpha={alpha}, beta={beta}")
    return ((r - alpha) / (beta - alpha)).clamp(0, 1)


def yarn_paper_inv_freq(inv_freq: Tensor, factor: float, context: int,
                        alpha: float = 1.0, beta: float = 32.0) -> Tensor:
    """YaRN paper's by-parts frequencies ``(1-γ)θ/s + γθ``: planes that turn often in L are kept."""
    _check_number("factor", factor, 1, inclusive=True)
    g = yarn_ramp(usage_ratio(inv_freq, context), alpha, beta)  # (D/2,)
    return (1 - g) * inv_freq / factor + g * inv_freq


def yarn_document_inv_freq(inv_freq: Tensor, factor: float, context: int,
                           alpha: float = 1.0, beta: float = 32.0) -> Tensor:
    """004 §7.6.1 as printed, ``(1-γ)θ + γθ/s``: the reverse of the paper (keeps low
    frequencies)."""
    _check_number("factor", factor, 1, inclusive=True)
    g = yarn_ramp(usage_ratio(inv_freq, context), alpha, beta)  # (D/2,)
    return (1 - g) * inv_freq + g * inv_freq / factor


# ----------------------------------------------------------------------------- applying RoPE

def rope_cos_sin(positions: Tensor, inv_freq: Tensor,
                 attention_factor: float = 1.0) -> tuple[Tensor, Tensor]:
    """cos and sin of the angles ``m·θ_k`` in the rotate-half layout (each angle twice).

    Shapes: ``positions`` ``(T,)`` or ``(B, T)`` integer, ``inv_freq`` ``(D/2,)`` → cos, sin of
    shape ``(T, D)`` or ``(B, T, D)``, on ``inv_freq``'s device, multiplied by ``attention_factor``.
    Computed as Hugging Face's ``LlamaRotaryEmbedding.forward`` does, in float32 (float64 if
    ``inv_freq`` is float64); elementwise, so autocast does not lower it.

    Example::

        inv_freq, af = rope_frequencies(16)
        cos, sin = rope_cos_sin(torch.arange(10), inv_freq, af)     # (10, 16) each
    """
    _check_positions(positions)
    if inv_freq.ndim != 1 or not inv_freq.is_floating_point():
        raise ValueError(f"inv_freq must be a 1-D float tensor, got shape {tuple(inv_freq.shape)} "
                         f"{inv_freq.dtype}")
    # float64 only for exact checks
    dtype = torch.float64 if inv_freq.dtype == torch.float64 else torch.float32
    angles = positions.to(inv_freq.device, dtype)[..., None] * inv_freq.to(dtype)  # (..., T, D/2)
    emb = torch.cat([angles, angles], dim=-1)  # (..., T, D)
    return emb.cos() * attention_factor, emb.sin() * attention_factor


def rotate_half(x: Tensor) -> Tensor:
    """``[x1, x2] → [-x2, x1]`` on the last dimension (Llama's pairing of ``x_k`` with
    ``x_{k+D/2}``)."""
    x1, x2 = x.chunk(2, dim=-1)  # (..., D/2) each
    return torch.cat([-x2, x1], dim=-1)


def _broadcastable_cos_sin(x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    if x.shape[-1] % 2:
        raise ValueError(f"x's last dimension must be even (RoPE rotates pairs), got {x.shape[-1]}")
    if cos.shape != sin.shape or cos.shape[-1] != x.shape[-1]:
        raise ValueError(f"cos and sin must have the same shape ending in {x.shape[-1]}, got "
                         f"{tuple(cos.shape)}, {tuple(sin.shape)}")
    # (B, T, D) from (B, T) positions: add the head axis, as HF's unsqueeze_dim=1
    if x.ndim == 4 and cos.ndim == 3:
        cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, D)
    return cos.to(x.dtype), sin.to(x.dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate ``x`` ``(B, H, T, D)`` by RoPE, rotate-half form (Llama, HF):
    ``x·cos + rotate_half(x)·sin``.

    ``cos``/``sin`` from :func:`rope_cos_sin`: ``(T, D)``, ``(B, T, D)`` (a head axis is inserted)
    or any shape broadcastable to x. Same result as HF's ``apply_rotary_pos_emb``.
    """
    cos, sin = _broadcastable_cos_sin(x, cos, sin)
    return x * cos + rotate_half(x) * sin  # (B, H, T, D)


def apply_rope_interleaved(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """RoPE as the documents write it: rotate adjacent pairs ``(x_{2k}, x_{2k+1})`` by ``m θ_k``
    (004 §7.3).

    Takes the same ``cos``/``sin`` as :func:`apply_rope` (angle k sits at index k in the first
    half). ``x̃_{2k} = x_{2k} cos − x_{2k+1} sin``, ``x̃_{2k+1} = x_{2k+1} cos + x_{2k} sin``.
    """
    cos, sin = _broadcastable_cos_sin(x, cos, sin)
    half = x.shape[-1] // 2
    c, s = cos[..., :half], sin[..., :half]  # (..., T, D/2): one angle per pair
    even, odd = x[..., 0::2], x[..., 1::2]  # (..., T, D/2) each
    return torch.stack([even * c - odd * s, odd * c + even * s], dim=-1).flatten(-2)  # (..., T, D)


def interleaved_to_half(x: Tensor) -> Tensor:
    """Permute the last dimension so adjacent pairs ``(2k, 2k+1)`` land at ``(k, k + D/2)``.

    ``apply_rope(interleaved_to_half(x)) == interleaved_to_half(apply_rope_interleaved(x))``: the
    two layouts are the same rotation, and ``qᵀk`` is unchanged when q and k are permuted alike.
    """
    _check_head_dim(x.shape[-1], "x.shape[-1]")
    return torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)


def half_to_interleaved(x: Tensor) -> Tensor:
    """Inverse of :func:`interleaved_to_half`."""
    _check_head_dim(x.shape[-1], "x.shape[-1]")
    first, second = x.chunk(2, dim=-1)  # (..., D/2) each
    return torch.stack([first, second], dim=-1).flatten(-2)


# ------------------------------------------------------------------------ RoPE as a bilinear form

def _rotations(theta: Tensor):
    """u -> R_u = rotation_matrix(u·θ), 001 App. A's adjacent-pair rotations (d_h, d_h)."""
    return lambda u: rotation_matrix(u * theta)


def rotation_composition_error(theta: Tensor, T: int) -> float:
    """max over t, s < T of |R_tᵀ R_s − R_{s−t}|: RoPE's scores depend on s − t alone (001 A)."""
    R = _rotations(theta)
    return max(float((R(t).T @ R(s) - R(s - t)).abs().max()) for t in range(T) for s in range(T))


def rope_head_scores(H: Tensor, W_Q: Tensor, W_K: Tensor, theta: Tensor) -> Tensor:
    """(T, T) scores a(t, s) = (R_t W_Q h_t)ᵀ (R_s W_K h_s) / √d_h of one head, rows t (001 App. A
    eq. (14)), from the rotated projections; ``H`` (d, T) holds h_1 … h_T as columns, ``W_Q`` and
    ``W_K`` are (d_h, d), ``theta`` (d_h/2,)."""
    T, R = H.shape[1], _rotations(theta)
    q, k = W_Q @ H, W_K @ H  # (d_h, T)
    return torch.stack([torch.stack([(R(t) @ q[:, t]) @ (R(s) @ k[:, s]) for s in range(T)])
                        for t in range(T)]) / math.sqrt(W_Q.shape[0])


def rope_bilinear_scores(H: Tensor, W_Q: Tensor, W_K: Tensor, theta: Tensor) -> Tensor:
    """The same scores as the bilinear form h_tᵀ (W_Qᵀ R_{s−t} W_K) h_s / √d_h, (T, T) rows t."""
    T, R = H.shape[1], _rotations(theta)
    scores = torch.stack([torch.stack([H[:, t] @ (W_Q.T @ R(s - t) @ W_K) @ H[:, s]
                                       for s in range(T)]) for t in range(T)])  # (T, T)
    return scores / math.sqrt(W_Q.shape[0])


def rope_column_head(H: Tensor, W_Q: Tensor, W_K: Tensor, W_V: Tensor, theta: Tensor,
                     masked_triangle: str) -> Tensor:
    """001 App. A Remark 3 in its columns convention: V_k softmax(K_kᵀQ_k / √d_h), the softmax
    down each column (over keys s), with one triangle of K_kᵀQ_k set to −∞: "upper" masks the
    keys s < t (as Remark 3 says), "lower" the keys s > t (causal). Returns (d_h, T)."""
    if masked_triangle not in ("upper", "lower"):
        raise ValueError(f"masked_triangle must be 'upper' or 'lower', got {masked_triangle!r}")
    T, R = H.shape[1], _rotations(theta)
    q, k = W_Q @ H, W_K @ H  # (d_h, T)
    Q_k = torch.stack([R(t) @ q[:, t] for t in range(T)], 1)  # (d_h, T)
    K_k = torch.stack([R(s) @ k[:, s] for s in range(T)], 1)
    S = K_k.T @ Q_k / math.sqrt(W_Q.shape[0])  # (T, T): row s (key), column t (query)
    s_idx, t_idx = torch.meshgrid(torch.arange(T), torch.arange(T), indexing="ij")
    S = S.masked_fill(s_idx < t_idx if masked_triangle == "upper" else s_idx > t_idx, -math.inf)
    return (W_V @ H) @ torch.softmax(S, dim=0)  # (d_h, T)
