"""A tiny stand-in language model for testing the training loop without the lab's transformer."""

import json
import os
from dataclasses import asdict, dataclass

import torch
from safetensors.torch import load_file, save_file
from torch import nn


@dataclass(frozen=True)
class TinyConfig:
    vocab_size: int = 12  # tokens
    dim: int = 8  # embedding width


class TinyLM(nn.Module):
    """Embeddings, a causal running mean over the prefix, a norm gain and a linear head."""

    def __init__(self, config: TinyConfig = TinyConfig()):
        super().__init__()
        self.config = config
        self.emb = nn.Embedding(config.vocab_size, config.dim)
        self.mix = nn.Linear(2 * config.dim, config.dim)
        self.gain = nn.Parameter(torch.ones(config.dim))
        self.head = nn.Linear(config.dim, config.vocab_size)

    def forward(self, input_ids, position_ids=None, segment_ids=None):
        x = self.emb(input_ids)  # (B, T, D)
        n = torch.arange(1, x.shape[1] + 1, device=x.device, dtype=x.dtype)[None, :, None]
        ctx = x.cumsum(1) / n  # (B, T, D) causal: position t sees tokens <= t
        h = torch.tanh(self.mix(torch.cat([x, ctx], -1))) * self.gain
        return self.head(h)  # (B, T, V)

    def save_pretrained(self, directory):
        os.makedirs(directory, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.state_dict().items()},
                  os.path.join(directory, "model.safetensors"))
        with open(os.path.join(directory, "config.json"), "w") as f:
            json.dump(asdict(self.config), f)

    @classmethod
    def from_pretrained(cls, directory):
        with open(os.path.join(directory, "config.json")) as f:
            model = cls(TinyConfig(**json.load(f)))
        model.load_state_dict(load_file(os.path.join(directory, "model.safetensors")))
        return model


def small_transformer(vocab_size: int, seed: int = 0):
    """The lab's own decoder at a tiny size (2 layers, width 32), in eval mode."""
    from halluc_lab.model.config import ModelConfig
    from halluc_lab.model.transformer import Transformer

    cfg = ModelConfig(vocab_size=vocab_size, hidden_size=32, n_layers=2, n_heads=4, n_kv_heads=2,
                      max_positions=64, init_std=0.1)
    return Transformer(cfg, seed=seed).eval()
