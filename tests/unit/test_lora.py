"""LoRA through peft: adapters on the Hugging Face twin, trained by the lab's loop, merged back into the lab's model."""

import pytest
import torch

from halluc_lab.training.data import Batch, batches
from halluc_lab.extensions.lora import ALL_LINEAR, ATTENTION, MLP, AdaptedLM, LoraSpec, merge, trainable, with_lora
from halluc_lab.model.config import ModelConfig
from halluc_lab.model.transformer import Transformer
from halluc_lab.training.train import TrainConfig, train

pytest.importorskip("peft")

CONFIG = ModelConfig(vocab_size=20, hidden_size=32, n_layers=2, n_heads=4, n_kv_heads=2)


def base() -> Transformer:
    return Transformer(CONFIG, seed=0).eval()


def rows(n: int = 24, T: int = 10) -> Batch:
    ids = torch.randint(0, CONFIG.vocab_size, (n, T), generator=torch.Generator().manual_seed(1))
    return Batch(ids, ids.clone())


def fit(adapted: AdaptedLM, steps: int = 20) -> None:
    train(adapted, batches(rows(), 8, seed=0), TrainConfig(steps=steps, lr=3e-2, warmup_steps=1, weight_decay=0.0))


def test_fresh_adapters_change_nothing():
    """B starts at 0: the adapted twin computes the base model's logits."""
    model, x = base(), rows().input_ids[:4]
    adapted = with_lora(model, LoraSpec(rank=4), seed=0).eval()
    with torch.no_grad():
        torch.testing.assert_close(adapted(x), model(x), rtol=1e-5, atol=1e-5)


def test_only_the_adapters_train_and_their_count_is_r_times_d_in_plus_d_out():
    spec = LoraSpec(rank=3, targets=ATTENTION)
    adapted = with_lora(base(), spec, seed=0)
    n_trainable, n_all = trainable(adapted)
    assert n_trainable == CONFIG.n_layers * spec.parameters_per_block(CONFIG)
    d, kv = CONFIG.hidden_size, CONFIG.n_kv_heads * CONFIG.hidden_size // CONFIG.n_heads
    assert spec.parameters_per_block(CONFIG) == 3 * ((d + d) + (d + kv) + (d + kv) + (d + d))  # q, k, v, o
    assert n_all - n_trainable == sum(p.numel() for p in base().parameters())  # the base, frozen


def test_the_merged_model_computes_what_the_adapted_one_does():
    model, x = base(), rows().input_ids[:4]
    adapted = with_lora(model, LoraSpec(rank=4, alpha=8.0), seed=0)
    fit(adapted)
    adapted.eval()
    merged = merge(adapted).eval()
    with torch.no_grad():
        after = adapted(x)
        assert (after - model(x)).abs().max() > 1e-2  # training moved it
        torch.testing.assert_close(merged(x), after, rtol=1e-4, atol=1e-4)
    assert isinstance(merged, Transformer) and merged.config == model.config


def test_attention_only_adapters_leave_the_mlp_weights_untouched():
    model = base()
    adapted = with_lora(model, LoraSpec(rank=2, targets=ATTENTION), seed=0)
    fit(adapted, steps=5)
    merged = merge(adapted)
    before, after = model.state_dict(), merged.state_dict()
    mlp = [k for k in before if any(part in k for part in ("mlp", "ffn", "gate", "up", "down"))]
    attn = [k for k in before if any(part in k for part in ("attn", "attention", "wq", "q_proj"))]
    assert mlp and attn, sorted(before)
    assert all(torch.equal(before[k], after[k]) for k in mlp)
    assert any(not torch.equal(before[k], after[k]) for k in attn)


def test_the_seed_decides_the_adapters_and_the_global_random_state_is_left_alone():
    model = base()  # (building a module draws from the global generator: nn.Linear's default init)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    a = with_lora(model, LoraSpec(rank=2), seed=5)
    assert torch.equal(torch.rand(3), expected)
    b, c = with_lora(base(), LoraSpec(rank=2), seed=5), with_lora(base(), LoraSpec(rank=2), seed=6)
    sa, sb, sc = (m.state_dict() for m in (a, b, c))
    lora_keys = [k for k in sa if "lora_A" in k]
    assert lora_keys and all(torch.equal(sa[k], sb[k]) for k in lora_keys)
    assert any(not torch.equal(sa[k], sc[k]) for k in lora_keys)


@pytest.mark.parametrize("kwargs", [dict(rank=0), dict(rank=2.0), dict(alpha=0), dict(alpha=float("nan")),
                                    dict(targets=()), dict(targets=("lm_head",)), dict(targets=["q_proj"]),
                                    dict(targets=("q_proj", "q_proj")), dict(dropout=1.0)])
def test_bad_specs_are_rejected(kwargs):
    with pytest.raises(ValueError):
        LoraSpec(**kwargs)


def test_packed_rows_and_foreign_models_are_rejected():
    adapted = with_lora(base(), LoraSpec(rank=2), seed=0)
    x = rows().input_ids[:2]
    with pytest.raises(ValueError, match="padded rows"):
        adapted(x, segment_ids=torch.ones_like(x))
    with pytest.raises(TypeError):
        with_lora(torch.nn.Linear(2, 2), LoraSpec(), seed=0)
    with pytest.raises(TypeError):
        merge(base())
    assert set(ALL_LINEAR) == set(ATTENTION) | set(MLP)


def test_new_token_rows_train_beside_the_adapters_and_merge_into_the_embedding():
    model, new = base(), [17, 18, 19]
    adapted = with_lora(model, LoraSpec(rank=2, targets=ATTENTION), seed=0, new_tokens=new)
    n_trainable, _ = trainable(adapted)
    spec = LoraSpec(rank=2, targets=ATTENTION)
    assert n_trainable == CONFIG.n_layers * spec.parameters_per_block(CONFIG) + len(new) * CONFIG.hidden_size
    fit(adapted, steps=5)
    merged = merge(adapted)
    old_w, new_w = model.embed_tokens.weight, merged.embed_tokens.weight
    assert torch.equal(old_w[:17], new_w[:17]) and not torch.equal(old_w[17:], new_w[17:])
    x = rows().input_ids[:4]
    with torch.no_grad():
        torch.testing.assert_close(merged(x), adapted.eval()(x), rtol=1e-4, atol=1e-4)  # the tied head too


@pytest.mark.parametrize("bad", [[20], [-1], [3, 3], [True]])
def test_new_tokens_outside_the_vocabulary_are_rejected(bad):
    with pytest.raises(ValueError, match="new_tokens"):
        with_lora(base(), LoraSpec(rank=2), seed=0, new_tokens=bad)
