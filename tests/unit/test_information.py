"""halluc_lab.foundations.information: entropy, cross-entropy, KL, perplexity and surprisal."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from halluc_lab.foundations import information
from halluc_lab.foundations.information import (
    check_distribution,
    cross_entropy,
    entropy,
    kl_divergence,
    perplexity,
    sequence_perplexity,
    sum_tolerance,
    surprisal,
)


def random_dists(shape, seed, dtype=torch.float64, zeros=False):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(*shape, generator=g, dtype=dtype) * 2
    if zeros:
        logits[..., 0] = -math.inf  # a zero-probability outcome in every row
    return torch.softmax(logits, dim=-1)


# --- values ----------------------------------------------------------------------------------

def test_uniform_over_k_has_entropy_log_k_and_perplexity_k():
    for k in (1, 2, 8, 10, 1000):
        u = torch.full((k,), 1 / k, dtype=torch.float64)
        assert entropy(u).item() == pytest.approx(math.log(k), abs=1e-12)
        assert entropy(u, unit="bits").item() == pytest.approx(math.log2(k), abs=1e-12)
        assert perplexity(u).item() == pytest.approx(k, rel=1e-12)


def test_three_bits_is_perplexity_eight():
    u = torch.full((8,), 1 / 8)
    assert entropy(u, unit="bits").item() == pytest.approx(3.0, abs=1e-6)
    assert 2 ** entropy(u, unit="bits").item() == pytest.approx(perplexity(u).item(), rel=1e-6)


def test_zero_times_log_zero_is_zero():
    p = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
    assert entropy(p).item() == 0.0
    assert cross_entropy(p, torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64)).item() == pytest.approx(math.log(2))
    assert kl_divergence(p, p).item() == 0.0


def test_model_zero_where_data_has_mass_gives_infinite_cross_entropy_and_kl():
    p = torch.tensor([0.5, 0.5], dtype=torch.float64)
    q = torch.tensor([1.0, 0.0], dtype=torch.float64)
    assert cross_entropy(p, q).item() == math.inf
    assert kl_divergence(p, q).item() == math.inf
    assert not torch.isnan(kl_divergence(p, q))


def test_entropy_matches_torch_distributions_categorical():
    p = random_dists((4, 3, 7), seed=0)
    expected = torch.distributions.Categorical(probs=p).entropy()
    torch.testing.assert_close(entropy(p), expected, rtol=1e-12, atol=1e-12)


def test_kl_matches_torch_kl_div_and_distributions():
    p, q = random_dists((5, 6), seed=1), random_dists((5, 6), seed=2)
    ours = kl_divergence(p, q)
    by_dist = torch.distributions.kl_divergence(torch.distributions.Categorical(probs=p),
                                                torch.distributions.Categorical(probs=q))
    by_fn = F.kl_div(q.log(), p, reduction="none").sum(-1)  # F.kl_div(input=log q, target=p)
    torch.testing.assert_close(ours, by_dist, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours, by_fn, rtol=1e-12, atol=1e-12)


def test_cross_entropy_with_one_hot_target_matches_f_cross_entropy():
    logits = torch.randn(6, 9, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    targets = torch.tensor([0, 3, 8, 1, 1, 5])
    onehot = F.one_hot(targets, 9).to(torch.float64)
    ours = cross_entropy(onehot, torch.softmax(logits, -1))
    torch.testing.assert_close(ours, F.cross_entropy(logits, targets, reduction="none"))


def test_bits_are_nats_over_ln2():
    p, q = random_dists((3, 5), seed=4), random_dists((3, 5), seed=5)
    for fn, args in ((entropy, (p,)), (cross_entropy, (p, q)), (kl_divergence, (p, q))):
        torch.testing.assert_close(fn(*args, unit="bits"), fn(*args, unit="nats") / math.log(2))
    torch.testing.assert_close(surprisal(p, unit="bits"), -torch.log2(p))


def test_dim_argument_reduces_the_named_dimension():
    p = random_dists((4, 6), seed=6)
    torch.testing.assert_close(entropy(p.T.contiguous(), dim=0), entropy(p))
    torch.testing.assert_close(kl_divergence(p.T, p.flip(0).T, dim=0), kl_divergence(p, p.flip(0)))


def test_bfloat16_input_is_computed_in_float32():
    p = random_dists((3, 50), seed=7, dtype=torch.float32)
    h = entropy(p.to(torch.bfloat16))
    assert h.dtype == torch.float32
    torch.testing.assert_close(h, entropy(p), atol=0.05, rtol=0)


def test_sequence_perplexity_is_exp_of_mean_negative_log_likelihood():
    lp = torch.log(torch.tensor([[0.5, 0.25, 1.0], [0.1, 0.1, 0.1]], dtype=torch.float64))
    mask = torch.tensor([[True, True, False], [True, True, True]])
    pooled = sequence_perplexity(lp, mask)
    expected = math.exp(-(math.log(0.5) + math.log(0.25) + 3 * math.log(0.1)) / 5)
    assert pooled.item() == pytest.approx(expected, rel=1e-12)
    per_row = sequence_perplexity(lp, mask, dim=-1)
    torch.testing.assert_close(per_row, torch.tensor([math.sqrt(8.0), 10.0], dtype=torch.float64))


def test_sequence_perplexity_of_a_ruled_out_token_is_infinite():
    lp = torch.tensor([-1.0, -math.inf])
    assert sequence_perplexity(lp).item() == math.inf
    assert sequence_perplexity(lp, torch.tensor([True, False])).item() == pytest.approx(math.e)


# --- properties ------------------------------------------------------------------------------

@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), v=st.integers(1, 12), zeros=st.booleans())
def test_cross_entropy_is_entropy_plus_kl(seed, v, zeros):
    p = random_dists((3, v), seed, zeros=zeros and v > 1)
    q = random_dists((3, v), seed + 1)
    torch.testing.assert_close(cross_entropy(p, q), entropy(p) + kl_divergence(p, q), rtol=1e-10, atol=1e-10)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), v=st.integers(1, 12))
def test_entropy_is_between_zero_and_log_v_and_kl_is_nonnegative(seed, v):
    p, q = random_dists((4, v), seed), random_dists((4, v), seed + 7)
    h = entropy(p)
    assert bool((h >= -1e-12).all()) and bool((h <= math.log(v) + 1e-12).all())
    assert bool((kl_divergence(p, q) >= 0).all())
    assert kl_divergence(p, p).abs().max().item() < 1e-12
    ppl = perplexity(p)
    assert bool((ppl >= 1 - 1e-12).all()) and bool((ppl <= v + 1e-9).all())


# --- bad input -------------------------------------------------------------------------------

@pytest.mark.parametrize("bad, match", [
    (torch.tensor([0.5, float("nan"), 0.5]), "non-finite"),
    (torch.tensor([0.5, float("inf")]), "non-finite"),
    (torch.tensor([1.5, -0.5]), "negative"),
    (torch.tensor([0.5, 0.6]), "sum to 1"),
    (torch.tensor([0.2, 0.2]), "sum to 1"),
])
def test_bad_distributions_are_rejected(bad, match):
    for fn in (entropy, perplexity, lambda p: cross_entropy(p, p), lambda p: kl_divergence(p, p)):
        with pytest.raises(ValueError, match=match):
            fn(bad)


def test_wrong_types_dims_units_and_shapes_are_rejected():
    p = torch.tensor([0.5, 0.5])
    with pytest.raises(TypeError, match="probs"):
        entropy(torch.tensor([1, 0]))
    with pytest.raises(TypeError, match="probs"):
        entropy([0.5, 0.5])
    with pytest.raises(ValueError, match="unit"):
        entropy(p, unit="bans")
    with pytest.raises(ValueError, match="dim"):
        entropy(p, dim=1)
    with pytest.raises(TypeError, match="dim"):
        entropy(p, dim=0.0)
    with pytest.raises(ValueError, match="scalar"):
        entropy(torch.tensor(1.0))
    with pytest.raises(ValueError, match="same shape"):
        kl_divergence(p, torch.tensor([0.2, 0.3, 0.5]))
    with pytest.raises(ValueError, match="above 1"):
        surprisal(torch.tensor([1.5]))
    with pytest.raises(ValueError, match="negative"):
        surprisal(torch.tensor([-0.1]))


def test_bad_log_probs_are_rejected():
    with pytest.raises(ValueError, match="≤ 0"):
        sequence_perplexity(torch.tensor([0.5]))
    with pytest.raises(ValueError, match="NaN"):
        sequence_perplexity(torch.tensor([float("nan")]))
    with pytest.raises(TypeError, match="token_log_probs"):
        sequence_perplexity(torch.tensor([-1]))
    with pytest.raises(ValueError, match="mask"):
        sequence_perplexity(torch.tensor([-1.0, -2.0]), torch.tensor([1, 0]))
    with pytest.raises(ValueError, match="no token"):
        sequence_perplexity(torch.tensor([-1.0]), torch.tensor([False]))


def test_an_empty_batch_of_distributions_gives_empty_results():
    empty = torch.zeros(0, 5)
    assert entropy(empty).shape == (0,)
    assert kl_divergence(empty, empty).shape == cross_entropy(empty, empty).shape == (0,)
    with pytest.raises(ValueError, match="no outcomes"):
        entropy(torch.zeros(3, 0))


def test_sum_tolerance_scales_with_precision():
    assert sum_tolerance(torch.float64) == 1e-6
    assert 1e-4 < sum_tolerance(torch.float32) < 2e-4
    assert sum_tolerance(torch.bfloat16) == 1e-2
    # a float32 softmax over a large vocabulary passes; float64 rows off by 1e-5 do not
    check_distribution(torch.softmax(torch.randn(4, 50_000), -1))
    with pytest.raises(ValueError, match="sum to 1"):
        check_distribution(torch.full((10,), 0.1, dtype=torch.float64) * (1 + 1e-5))


def test_total_variation_is_half_the_l1_distance_and_refuses_non_distributions():
    p, q = torch.tensor([0.2, 0.8]), torch.tensor([0.6, 0.4])
    assert information.total_variation(p, q).item() == pytest.approx(0.4)
    assert information.total_variation(p, p).item() == 0.0
    with pytest.raises(ValueError):
        information.total_variation(torch.tensor([0.5, 0.6]), q)


def test_sample_total_variation_does_not_depend_on_the_order_of_outcomes():
    a, b = ["x", "y", "y", "z"], ["z", "z", "x"]
    exact = (abs(1 * 3 - 1 * 4) + abs(2 * 3 - 0) + abs(1 * 3 - 2 * 4)) / (2 * 4 * 3)
    assert information.sample_total_variation(a, b) == exact
    assert information.sample_total_variation(a[::-1], b[::-1]) == exact
    assert information.sample_total_variation(a, a) == 0.0
    with pytest.raises(ValueError, match="both samples"):
        information.sample_total_variation([], b)
