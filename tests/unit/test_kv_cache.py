"""The KV cache: its size, writes at per-row slots, rollback, and bad input."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from halluc_lab.model.kv_cache import KVCache


def small_cache(**kw) -> KVCache:
    args = dict(n_layers=2, batch_size=3, max_positions=8, n_kv_heads=2, head_dim=4)
    args.update(kw)
    return KVCache(**args)


@settings(max_examples=25, deadline=None)
@given(L=st.integers(1, 4), B=st.integers(1, 4), T=st.integers(1, 16), H=st.integers(1, 4),
       D=st.integers(1, 8), dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float64]))
def test_cache_bytes_are_2_L_B_T_Hkv_D_bytes(L, B, T, H, D, dtype):
    cache = KVCache(L, B, T, H, D, dtype=dtype)
    item = torch.tensor([], dtype=dtype).element_size()
    assert cache.nbytes == 2 * L * B * T * H * D * item
    assert cache.bytes_per_token == 2 * L * H * D * item
    assert cache.k.shape == (L, B, T, H, D)


def test_write_puts_each_row_at_its_own_length():
    cache = small_cache()
    cache.lengths.copy_(torch.tensor([0, 2, 5]))
    cache.bound = 5
    slots = cache.slots(2)
    assert slots.tolist() == [[0, 1], [2, 3], [5, 6]]
    k_new = torch.arange(3 * 2 * 2 * 4, dtype=torch.float32).view(3, 2, 2, 4)
    cache.write(1, k_new, -k_new, slots)
    for b, start in enumerate([0, 2, 5]):
        assert torch.equal(cache.k[1, b, start:start + 2], k_new[b])
        assert torch.equal(cache.v[1, b, start:start + 2], -k_new[b])
    assert cache.k[0].abs().sum() == 0  # the other layer is untouched
    cache.advance(2)
    assert cache.lengths.tolist() == [2, 4, 7] and cache.bound == 7


def test_read_returns_heads_first_views_of_the_first_slots():
    cache = small_cache()
    cache.k[0, :, :3] = torch.randn(3, 3, 2, 4)
    k, v = cache.read(0, 3)
    assert k.shape == (3, 2, 3, 4)  # (B, H_kv, n_keys, D)
    assert torch.equal(k, cache.k[0, :, :3].transpose(1, 2))
    assert k.data_ptr() == cache.k[0].data_ptr()  # a view, not a copy


def test_window_reads_only_what_rows_may_hold_unless_static():
    cache = small_cache()
    cache.bound = 3
    assert cache.window(2) == 5
    cache.static = True
    assert cache.window(2) == 8


def test_rollback_lowers_chosen_rows_and_the_bound():
    cache = small_cache()
    cache.lengths.copy_(torch.tensor([4, 6, 5]))
    cache.bound = 6
    cache.rollback([1, 2], [3, 1])
    assert cache.lengths.tolist() == [4, 3, 4] and cache.bound == 4
    cache.rollback(None, 1)
    assert cache.lengths.tolist() == [3, 2, 3]


@pytest.mark.parametrize("rows, n, match", [
    ([3], 1, "rows"), ([0, 0], 1, "repeat"), ([0], 5, r"\[0, 4\]"), ([0], -1, r"\[0, 4\]"),
    ([0, 1], [1], "one int per row"), ([0], 1.5, "n"),
])
def test_bad_rollback_raises_and_leaves_the_cache_as_it_was(rows, n, match):
    cache = small_cache()
    cache.lengths.copy_(torch.tensor([4, 6, 5]))
    cache.bound = 6
    with pytest.raises((ValueError, TypeError), match=match):
        cache.rollback(rows, n)
    assert cache.lengths.tolist() == [4, 6, 5] and cache.bound == 6


def test_a_full_row_refuses_more_tokens_and_changes_nothing():
    cache = small_cache()
    cache.lengths.copy_(torch.tensor([7, 2, 0]))
    cache.bound = 7
    assert cache.slots(1)[0].item() == 7
    with pytest.raises(ValueError, match="do not fit"):
        cache.slots(2)
    assert cache.lengths.tolist() == [7, 2, 0]


def test_a_stale_bound_is_refreshed_before_refusing():
    cache = small_cache()
    cache.lengths.copy_(torch.tensor([1, 2, 0]))
    cache.bound = 8  # ran ahead (rows that stopped early)
    assert cache.slots(3)[1].tolist() == [2, 3, 4]
    assert cache.bound == 2


@pytest.mark.parametrize("kw", [dict(n_layers=0), dict(batch_size=-1), dict(max_positions=2.0),
                                dict(head_dim=True), dict(dtype=torch.long)])
def test_bad_shapes_or_dtype_raise(kw):
    with pytest.raises((ValueError, TypeError)):
        small_cache(**kw)


def test_shrink_lowers_lengths_on_the_device_without_checks():
    cache = small_cache()
    cache.lengths.copy_(torch.tensor([4, 6, 5]))
    cache.shrink(torch.tensor([2, 0]), torch.tensor([3, 1]))
    assert cache.lengths.tolist() == [3, 6, 2]


def test_first_rows_share_keys_and_values_but_keep_their_own_lengths():
    cache = small_cache()
    part = cache.first_rows(2)
    assert part.batch_size == 2 and part.k.data_ptr() == cache.k.data_ptr()
    slots = part.slots(3)
    part.write(0, torch.ones(2, 3, 2, 4), 2 * torch.ones(2, 3, 2, 4), slots)
    part.advance(3)
    assert cache.k[0, :2, :3].eq(1).all() and cache.v[0, :2, :3].eq(2).all() and cache.k[0, 2].eq(0).all()
    assert part.lengths.tolist() == [3, 3] and cache.lengths.tolist() == [0, 0, 0]


def test_copy_rows_fans_rows_out_in_place_even_when_source_and_target_overlap():
    cache = small_cache(batch_size=4)
    cache.k[:, 0], cache.k[:, 1] = 1.0, 2.0
    cache.v[:, 0], cache.v[:, 1] = -1.0, -2.0
    cache.set_lengths([3, 5, 0, 0])
    cache.copy_rows(torch.tensor([0, 0, 1, 1]))
    assert [float(cache.k[0, b, 0, 0, 0]) for b in range(4)] == [1.0, 1.0, 2.0, 2.0]
    assert [float(cache.v[1, b, 7, 1, 3]) for b in range(4)] == [-1.0, -1.0, -2.0, -2.0]
    assert cache.lengths.tolist() == [3, 3, 5, 5] and cache.bound == 5


def test_copy_rows_copies_only_the_first_n_positions():
    cache = small_cache()
    cache.k[:, 0] = 1.0
    cache.copy_rows(torch.tensor([0, 0]), n_positions=2)
    assert cache.k[:, 1, :2].eq(1).all() and cache.k[:, 1, 2:].eq(0).all()


@pytest.mark.parametrize("call, match", [
    (lambda c: c.first_rows(4), "n_rows"), (lambda c: c.first_rows(0), "n_rows"),
    (lambda c: c.copy_rows(torch.tensor([0, 3])), r"\[0, 2\]"), (lambda c: c.copy_rows(torch.tensor([0.0])), "source"),
    (lambda c: c.copy_rows(torch.tensor([0, 0, 0, 0])), "source"), (lambda c: c.copy_rows([0], 9), "n_positions"),
    (lambda c: c.set_lengths([1, 2]), "one int per row"), (lambda c: c.set_lengths([1, 2, 9]), r"lengths\[2\]"),
])
def test_bad_row_operations_raise_and_change_nothing(call, match):
    cache = small_cache()
    cache.set_lengths([1, 2, 3])
    with pytest.raises(ValueError, match=match):
        call(cache)
    assert cache.lengths.tolist() == [1, 2, 3] and cache.bound == 3 and cache.k.abs().sum() == 0


def test_step_cost_counts_the_matmuls_pytorch_counts():
    from torch.utils.flop_counter import FlopCounterMode

    from halluc_lab.model.kv_cache import step_cost
    from halluc_lab.model.config import ModelConfig
    from halluc_lab.model.transformer import Transformer

    config = ModelConfig(vocab_size=50, hidden_size=32, n_layers=2, n_heads=4, n_kv_heads=2, tie_embeddings=False)
    model = Transformer(config)
    cache = model.new_cache(2, 16)
    with torch.no_grad():
        model(torch.zeros(2, 5, dtype=torch.long), cache=cache)
        counter = FlopCounterMode(display=False)
        with counter:
            model(torch.zeros(2, 3, dtype=torch.long), cache=cache)
    counts = counter.get_flop_counts()["Global"]
    dense = sum(v for op, v in counts.items() if "mm" in str(op) and "bmm" not in str(op))
    cost = step_cost(config, n_new=3, n_cached=5, batch=2)
    assert cost.dense_flops == dense
    assert cost.scores == 2 * (6 + 7 + 8)  # each new query sees the 5 cached keys and the new ones up to itself
    assert cost.attention_flops == 2 * 2 * 4 * 4 * 8 * (6 + 7 + 8)  # L · H · 4D · scores
    assert cost.kv_write_bytes == 2 * 3 * (2 * 2 * 2 * 8 * 2)


def test_step_cost_rejects_bad_counts():
    from halluc_lab.model.kv_cache import step_cost
    from halluc_lab.model.config import ModelConfig

    config = ModelConfig(vocab_size=50, hidden_size=32, n_layers=1, n_heads=2)
    for kw in (dict(n_new=0), dict(n_new=1, n_cached=-1), dict(n_new=1, batch=0)):
        with pytest.raises(ValueError):
            step_cost(config, **kw)
