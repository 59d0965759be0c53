"""LoRA on the lab's model through ``peft``: the Hugging Face twin carries the adapters, the merged
weights come back.

Chapter 12 (continual learning). Sources: 001 Part 4 §1 (updating a selected part of the parameters,
θ = θ_trainable ∪ θ_frozen, eq. 12); Hu et al. 2021 (LoRA); Biderman et al. 2024 (LoRA learns less
and forgets less)::

    # the twin, adapters on, base frozen
    lm = with_lora(model, LoraSpec(rank=8, targets=ATTENTION), seed=0)
    train(lm, data, cfg)  # the lab's loop, padded rows
    model2 = merge(lm)    # the lab's model again: its engine runs it

LoRA (Low-Rank Adaptation) freezes a weight matrix W (d_out × d_in) and learns a low-rank change
beside it: W' = W + (α/r) B A, with A (r × d_in) drawn at random and B (d_out × r) zero at the
start, so the adapted model starts as the base model and a rank-r update costs r (d_in + d_out)
parameters instead of d_in d_out. Merging adds (α/r) B A into W: the merged model computes what the
adapted one does, with no adapter left.

The lab's model and ``peft`` meet through :func:`halluc_lab.model.hf_convert.to_hf` (a
``LlamaForCausalLM`` with the same weights, whose linear layers are named as ``peft`` expects) and
:func:`~halluc_lab.model.hf_convert.from_hf`. :class:`AdaptedLM` lets the lab's training loop drive
the twin (``input_ids`` in, logits out). It has no packed attention: train it on padded rows
(:func:`halluc_lab.training.data.pad`); right padding is after every real token, so a causal model's
real positions never see it, and its labels are IGNORE.

A grown vocabulary (:func:`halluc_lab.extensions.continual.grow_vocabulary`) brings new tokens whose
embedding rows start at random; with the backbone frozen they would stay so.
``with_lora(..., new_tokens=ids)`` trains those rows as well, through ``peft``'s trainable tokens
(the tied head shares them); the old rows stay frozen.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from halluc_lab.model import hf_convert
from halluc_lab.model.transformer import Transformer

# the attention's projections (Hugging Face names)
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")  # the SwiGLU's
# every linear layer of a block (the head is tied to the embedding: not adapted)
ALL_LINEAR = ATTENTION + MLP


@dataclass(frozen=True)
class LoraSpec:
    """Where the adapters go and how big they are."""

    rank: int = 8  # r: the rank of B A
    alpha: float = 16.0  # α: the update is scaled by α / r
    targets: tuple[str, ...] = ALL_LINEAR  # which linear layers of every block get an adapter
    dropout: float = 0.0  # dropout on the adapter's input (0: the run is deterministic)

    def __post_init__(self):
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(f"rank must be an int >= 1, got {self.rank!r}")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or not (
                math.isfinite(self.alpha) and self.alpha > 0):
            raise ValueError(f"alpha must be a positive finite number, got {self.alpha!r}")
        if (not isinstance(self.targets, tuple) or not self.targets
                or set(self.targets) - set(ALL_LINEAR)
                or len(set(self.targets)) != len(self.targets)):
            raise ValueError("targets must be a non-empty tuple of distinct names from "
                             f"{ALL_LINEAR}, got {self.targets!r}")
        if not (isinstance(self.dropout, (int, float)) and 0.0 <= self.dropout < 1.0):
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")

    def config(self, new_tokens: Sequence[int] = ()):
        """The ``peft.LoraConfig`` of this spec; ``new_tokens``: token ids whose embedding rows
        train too (peft's trainable tokens; with a tied head, the head's rows are the same rows)."""
        from peft import LoraConfig

        tokens = ({"trainable_token_indices": {"embed_tokens": list(new_tokens)}} if new_tokens
                  else {})
        return LoraConfig(r=self.rank, lora_alpha=self.alpha, target_modules=list(self.targets),
                          lora_dropout=self.dropout, bias="none", **tokens)

    def parameters_per_block(self, model_config) -> int:
        """Trainable parameters one block gets: r (d_in + d_out) per adapted layer.

        >>> from halluc_lab.model.config import ModelConfig
        >>> LoraSpec(rank=2, targets=("q_proj",)).parameters_per_block(
        ...     ModelConfig(vocab_size=8, hidden_size=16))
        64
        """
        d, f = model_config.hidden_size, model_config.intermediate_size
        kv = model_config.n_kv_heads * (d // model_config.n_heads)
        shapes = {"q_proj": (d, d), "k_proj": (d, kv), "v_proj": (d, kv), "o_proj": (d, d),
                  "gate_proj": (d, f), "up_proj": (d, f), "down_proj": (f, d)}
        return sum(self.rank * sum(shapes[t]) for t in self.targets)


class AdaptedLM(nn.Module):
    """The Hugging Face twin with its adapters, called as the lab's loop calls a model: ids (and
    positions) → logits."""

    def __init__(self, peft_model: nn.Module):
        super().__init__()
        self.peft = peft_model

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                segment_ids: torch.Tensor | None = None) -> torch.Tensor:
        if segment_ids is not None:
            raise ValueError("AdaptedLM has no packed attention: train it on padded rows "
                             "(halluc_lab.training.data.pad), "
                             "not packed ones")
        return self.peft(input_ids=input_ids, position_ids=position_ids).logits  # (B, T, V)


def with_lora(model: Transformer, spec: LoraSpec, *, seed: int,
              new_tokens: Sequence[int] = ()) -> AdaptedLM:
    """The twin of ``model`` (a copy, float32, on ``model``'s device) with LoRA adapters on
    ``spec.targets`` of every block, every base weight frozen. The adapters' A matrices are drawn
    with ``seed`` (B starts at 0, so the adapted model computes what ``model`` does); the global
    random state is left as it was.

    ``new_tokens``: ids whose embedding rows train as well (a grown vocabulary's new names, which a
    frozen embedding would leave at their random start); every other row stays frozen. :func:`merge`
    writes them into the embedding."""
    from peft import get_peft_model

    if not isinstance(model, Transformer):
        raise TypeError(f"model must be the lab's Transformer, got {type(model).__name__}")
    new_tokens = list(new_tokens)
    vocab = model.config.vocab_size
    if any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab
           for t in new_tokens) \
            or len(set(new_tokens)) != len(new_tokens):
        raise ValueError(f"new_tokens must be distinct token ids in [0, {vocab - 1}], got "
                         f"{new_tokens[:8]!r}")
    device = next(model.parameters()).device
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        # peft asks transformers a question under a name that transformers 5 has deprecated
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*",
                                category=FutureWarning)
        torch.manual_seed(seed)
        adapted = get_peft_model(hf_convert.to_hf(model), spec.config(new_tokens))
    return AdaptedLM(adapted).to(device)


def trainable(model: nn.Module) -> tuple[int, int]:
    """(trainable parameters, all parameters) of a model."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


def merge(adapted: AdaptedLM) -> Transformer:
    """The lab's model with each adapter's (α/r) B A added into its weight (a copy, float32, on the
    adapted model's device): it computes what ``adapted`` does, and the lab's engine and evaluation
    run it."""
    if not isinstance(adapted, AdaptedLM):
        raise TypeError(f"merge takes what with_lora returned, got {type(adapted).__name__}")
    device = next(adapted.parameters()).device
    merged = copy.deepcopy(adapted.peft).merge_and_unload()  # the adapted model keeps its adapters
    return hf_convert.from_hf(merged).to(device)
