"""Where one decode step of a large model goes as its context grows (chapter 6's 975 M-parameter model).

Chapter 6 measures the engine's CUDA-graph step of a bf16 decoder (hidden 2048, 16 layers, 16 query
and 4 KV heads) growing from 2.3 ms at 16 cached tokens to 5.7 ms at 8,192, while reading its cache
takes about 0.06 ms at the card's bandwidth. This script takes the step apart, in one run:

- one engine step (batch 1, greedy, graph-replayed) at contexts 16, 1,024 and 8,192, with PyTorch's
  deterministic algorithms on (as the book runs) and off, each with the library's KV write
  (``index_put_`` with the deterministic sort skipped, :func:`halluc_lab.device.distinct_indices`: each
  row writes its own slot), with plain ``index_put_`` (sorted when deterministic algorithms are on), with
  a one-hot ``torch.where`` over the layer (the library's write until 2026-11-27), and with no write at
  all (timing only: the cache is then wrong);
- one layer's decode attention at 8,192 + 80 keys as the model calls it
  (``F.scaled_dot_product_attention`` with a boolean mask and ``enable_gqa=True``), against the same
  call without a mask and against a mask with the KV heads repeated, times 16 layers.

Needs a CUDA GPU. ``python benchmarks/decode_attention.py``
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from common import best_time, environment

from halluc_lab.model import kv_cache
from halluc_lab.device import set_deterministic
from halluc_lab.generation.engine_core import Engine
from halluc_lab.generation.sampling import SamplingParams
from halluc_lab.model.config import ModelConfig
from halluc_lab.model.transformer import Transformer

CONTEXTS = (16, 1024, 8192)
CONFIG = ModelConfig(vocab_size=512, hidden_size=2048, n_layers=16, n_heads=16, n_kv_heads=4, tie_embeddings=False,
                     max_positions=max(CONTEXTS) + 256)


def index_put_write(self, layer, k_new, v_new, slots):
    """The KV write as plain ``index_put_``: with deterministic algorithms on, it sorts its indices."""
    self.k[layer].index_put_((self._rows, slots), k_new.to(self.k.dtype))
    self.v[layer].index_put_((self._rows, slots), v_new.to(self.v.dtype))


def one_hot_write(self, layer, k_new, v_new, slots):
    """The KV write as a one-hot select over the whole layer for a decode step (one slot per row); a prefill
    (several slots per row) as plain ``index_put_``."""
    if slots.shape[1] > 1:
        return index_put_write(self, layer, k_new, v_new, slots)
    hit = (torch.arange(self.capacity, device=slots.device)[None, :] == slots)[:, :, None, None]  # (B, T, 1, 1)
    self.k[layer].copy_(torch.where(hit, k_new.to(self.k.dtype), self.k[layer]))
    self.v[layer].copy_(torch.where(hit, v_new.to(self.v.dtype), self.v[layer]))


def no_write(self, layer, k_new, v_new, slots):
    """No KV write: the step's time without it (its tokens are then wrong)."""


def step_ms(model: Transformer, context: int, device: torch.device) -> float:
    """Milliseconds of one graph-replayed engine step over ``context`` cached tokens (best of 5 × 8 steps)."""
    eng = Engine(model, 1, context + 80)
    prompt = torch.randint(0, CONFIG.vocab_size, (context,), generator=torch.Generator().manual_seed(0)).tolist()
    eng.start([prompt], 70, SamplingParams(greedy=True))
    eng.step(), eng.step()  # the first step captures the graph
    return best_time(lambda: [eng.step() for _ in range(8)], device, 5) / 8 * 1e3


def attention_ms(device: torch.device, **kwargs) -> float:
    """Milliseconds of 16 layers' decode attention at 8,192 + 80 keys, called with ``kwargs``."""
    q = torch.randn(1, 16, 1, 128, device=device, dtype=torch.bfloat16)
    k = torch.randn(1, 4, max(CONTEXTS) + 80, 128, device=device, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    if kwargs.pop("repeat_kv", False):
        k, v = k.repeat_interleave(4, 1), v.repeat_interleave(4, 1)
    if kwargs.pop("mask", False):
        kwargs["attn_mask"] = torch.ones(1, 1, 1, k.shape[2], dtype=torch.bool, device=device)
    calls = lambda n: [F.scaled_dot_product_attention(q, k, v, **kwargs) for _ in range(n)]
    calls(3)  # warm up
    return best_time(lambda: calls(160), device, 1) / 160 * CONFIG.n_layers * 1e3


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("decode_attention.py needs a CUDA GPU")
    device = torch.device("cuda")
    env = environment(device)
    print(f"{env['device']}, torch {env['torch']}, {env['date']}")
    model = Transformer(CONFIG, seed=0).to(device, dtype=torch.bfloat16).eval()
    library_write = kv_cache.KVCache.write
    writes = (("index_put_, distinct indices (library)", library_write), ("index_put_", index_put_write),
              ("one-hot where", one_hot_write), ("no write", no_write))
    print("| deterministic | KV write | " + " | ".join(f"t = {c}" for c in CONTEXTS) + " |")
    print("|---|---|" + "---|" * len(CONTEXTS))
    with torch.no_grad():
        try:
            for deterministic in (True, False):
                set_deterministic(deterministic)
                for name, write in writes:
                    kv_cache.KVCache.write = write
                    cells = " | ".join(f"{step_ms(model, c, device):.3f} ms" for c in CONTEXTS)
                    print(f"| {deterministic} | {name} | {cells} |", flush=True)
        finally:
            kv_cache.KVCache.write = library_write
            set_deterministic(True)
        for label, kwargs in (("boolean mask + enable_gqa (the model's call)", {"mask": True, "enable_gqa": True}),
                              ("no mask + enable_gqa", {"enable_gqa": True}),
                              ("boolean mask, KV heads repeated", {"mask": True, "repeat_kv": True})):
            print(f"attention, 16 layers, {label}: {attention_ms(device, **kwargs):.3f} ms")


if __name__ == "__main__":
    main()
