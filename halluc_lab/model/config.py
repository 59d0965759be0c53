"""The shape of the lab's decoder: :class:`ModelConfig`, checked when made.

Chapters 6 and 7 of the book. Vocabulary, width, depth, query and key/value heads (MHA, GQA, MQA:
004 ch. 5), the SwiGLU width, RoPE's base and scaling (004 §7.3–7.6), the context, a tied or untied
head, the normalisation's ε, the initialisation's std, and fused or readable kernels. The model is
:mod:`halluc_lab.model.transformer`; the KV cache and the Hugging Face conversion read the same
fields.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from halluc_lab.model.positional import RopeScaling


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the decoder. Variants: ``dataclasses.replace(config, n_kv_heads=1)``."""

    vocab_size: int  # V: tokens the embedding and the head know
    hidden_size: int = 128  # d_model: width of the residual stream
    n_layers: int = 4  # L: transformer blocks
    n_heads: int = 4  # query heads; head_dim = hidden_size / n_heads
    # key/value heads: n_heads = MHA, 1 = MQA, between = GQA; None = n_heads
    n_kv_heads: int | None = None
    intermediate_size: int | None = None  # SwiGLU hidden width; None = 4 · hidden_size
    rope_theta: float = 10000.0  # RoPE base (θ_k = base^{-2k/D}, 004 §7.3)
    # context extension (linear / ntk / yarn, 004 §7.4–7.6); None = plain
    rope_scaling: RopeScaling | None = None
    max_positions: int = 2048  # context the model is meant for (HF max_position_embeddings)
    tie_embeddings: bool = True  # the head reuses the embedding matrix (W_out = W_embᵀ)
    norm_eps: float = 1e-5  # ε inside RMSNorm's square root
    init_std: float = 0.02  # std of the normal initialisation of weights
    # fused kernels (PyTorch SDPA, F.rms_norm); False = the readable reference code
    fast: bool = True

    def __post_init__(self) -> None:
        if self.n_kv_heads is None:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        if self.intermediate_size is None:
            object.__setattr__(self, "intermediate_size", 4 * self.hidden_size)
        for name in ("vocab_size", "hidden_size", "n_layers", "n_heads", "n_kv_heads",
                     "intermediate_size", "max_positions"):
            value = getattr(self, name)
            if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
            object.__setattr__(self, name, int(value))  # a numpy integer: the int a cache key holds
        if self.hidden_size % self.n_heads:
            raise ValueError(f"hidden_size={self.hidden_size} must be divisible by "
                             f"n_heads={self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_kv_heads must divide n_heads={self.n_heads}, "
                             f"got {self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError("head_dim = hidden_size / n_heads must be even for RoPE, got "
                             f"{self.head_dim}")
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, RopeScaling):
            raise TypeError("rope_scaling must be a positional.RopeScaling or None, got "
                            f"{type(self.rope_scaling).__name__}")
        # rope_theta: θ_k must fall with k
        for name, low in (("rope_theta", 1), ("norm_eps", 0), ("init_std", 0)):
            value = getattr(self, name)
            if not isinstance(value, numbers.Real) or isinstance(value, bool):
                raise TypeError(f"{name} must be a real number, got "
                                f"{type(value).__name__} {value!r}")
            if not (math.isfinite(value) and value > low):
                raise ValueError(f"{name} must be a finite number > {low}, got {value!r}")
        for name in ("tie_embeddings", "fast"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")

    @property
    def head_dim(self) -> int:
        """D, the width of one head."""
        return self.hidden_size // self.n_heads
