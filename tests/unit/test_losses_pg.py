"""Chapter 10's policy gradients with group baselines: group advantages, Listing 3, GRPO, Dr. GRPO, DAPO.

Expected values are worked out by hand in plain Python from the papers' formulas.
"""

import math

import pytest
import torch

from halluc_lab.training.rlvr_losses import (
    dapo_loss,
    dr_grpo_loss,
    group_advantages,
    grpo_loss,
    listing3_loss,
    ppo_clipped_objective,
)

D = torch.float64
HUGE = 1e4  # a padding log-prob: exp overflows to inf if it ever reaches the ratio
MASK = torch.tensor([[True, False, False], [True, True, True]])  # lengths 1 and 3


def _logp(rows, requires_grad=False):
    return torch.tensor(rows, dtype=D, requires_grad=requires_grad)


# -- group advantages ----------------------------------------------------------------------------------------
def test_group_advantages_mean_shift_per_prompt():
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 2.0, 2.0, 5.0]), 3, scale=False)
    assert adv.dtype == torch.float32
    expected = [1 - 1 / 3, -1 / 3, -1 / 3, 2 - 3, 2 - 3, 5 - 3]
    assert adv.tolist() == pytest.approx(expected, abs=1e-6)


def test_group_advantages_divide_by_the_bessel_std_plus_eps():
    rewards = [1.0, 0.0, 0.0, 2.0, 2.0, 5.0]
    adv = group_advantages(torch.tensor(rewards, dtype=D), 3, eps=1e-6)
    expected = []
    for group in (rewards[:3], rewards[3:]):
        mean = sum(group) / 3
        std = math.sqrt(sum((r - mean) ** 2 for r in group) / (3 - 1))  # n − 1: Bessel
        expected += [(r - mean) / (std + 1e-6) for r in group]
    assert adv.dtype == D
    assert adv.tolist() == pytest.approx(expected, rel=1e-12)
    two = group_advantages(torch.tensor([1.0, 0.0]), 2, eps=1e-6)  # std √½ (Bessel), not ½ (population)
    assert two.tolist() == pytest.approx([0.5 / (math.sqrt(0.5) + 1e-6), -0.5 / (math.sqrt(0.5) + 1e-6)], rel=1e-6)


@pytest.mark.parametrize("scale", [True, False])
def test_tied_groups_get_exactly_zero(scale):
    adv = group_advantages(torch.tensor([0.1, 0.1, 0.1, 0.7, 0.7, 0.7, 1.0, 0.0, 1.0]), 3, scale=scale)
    assert adv[:6].tolist() == [0.0] * 6
    assert adv[6:].abs().min() > 0


def test_groups_are_prompt_major_blocks():
    # rows 0, 1 are prompt 0 and rows 2, 3 prompt 1: both groups tie; strided grouping (0, 2), (1, 3) would not
    assert group_advantages(torch.tensor([1.0, 1.0, 0.0, 0.0]), 2).tolist() == [0.0] * 4
    assert group_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0]), 2, scale=False).tolist() == [0.5, -0.5, 0.5, -0.5]


def test_integer_rewards_give_float32():
    adv = group_advantages(torch.tensor([1, 0]), 2, scale=False)
    assert adv.dtype == torch.float32 and adv.tolist() == [0.5, -0.5]


@pytest.mark.parametrize("rewards, group_size, match", [
    (torch.zeros(4), 1, "at least 2 samples"),
    (torch.zeros(4), True, "at least 2 samples"),
    (torch.zeros(5), 2, "groups of 2"),
    (torch.zeros(2, 2), 2, "1-D"),
    (torch.zeros(0), 2, "non-empty"),
])
def test_group_advantages_reject_bad_input(rewards, group_size, match):
    with pytest.raises(ValueError, match=match):
        group_advantages(rewards, group_size)


def test_group_advantages_reject_a_bad_eps():
    with pytest.raises(ValueError, match="eps"):
        group_advantages(torch.zeros(4), 2, eps=0.0)


# -- Listing 3 ---------------------------------------------------------------------------------------------
def test_listing3_is_the_mean_over_masked_tokens_only():
    logp = _logp([[-0.5, HUGE, -HUGE], [-1.0, -2.0, -3.0]], requires_grad=True)
    adv = torch.tensor([2.0, -1.0], dtype=D)
    loss = listing3_loss(logp, adv, MASK)
    assert loss.item() == pytest.approx(-(-0.5 * 2 + (-1 - 2 - 3) * -1) / 4)  # 4 masked tokens
    naive = -((torch.tensor([[-0.5, 0, 0], [-1.0, -2.0, -3.0]]) * torch.tensor([[2.0], [-1.0]])).mean())
    assert naive.item() == pytest.approx(-5 / 6) and loss.item() == pytest.approx(-5 / 4)  # padding counted: /6
    loss.backward()
    torch.testing.assert_close(logp.grad, _logp([[-2 / 4, 0, 0], [1 / 4, 1 / 4, 1 / 4]]))  # −A/4 on the mask
    per_token = listing3_loss(logp, adv[:, None].expand(2, 3).clone(), MASK)  # (B, T) advantages: the same
    assert per_token.item() == pytest.approx(loss.item())


def test_listing3_with_no_masked_token_is_zero():
    assert listing3_loss(torch.ones(2, 3), torch.ones(2), torch.zeros(2, 3, dtype=torch.bool)).item() == 0.0


# -- GRPO, Dr. GRPO, DAPO: values by hand ---------------------------------------------------------------------
# ρ = exp(logp − logp_old); row 0 (A = +1): ρ = 1.1; row 1 (A = −1): ρ = 0.9, 1.5, 1.0.
RATIOS = [[1.1, None, None], [0.9, 1.5, 1.0]]
ADV = [1.0, -1.0]


def _ratio_batch(requires_grad=False):
    logp = _logp([[math.log(r) if r else HUGE for r in row] for row in RATIOS], requires_grad)
    return logp, torch.zeros(2, 3, dtype=D), torch.tensor(ADV, dtype=D)


def _by_hand_terms(eps_low, eps_high):
    """−min(ρA, clip(ρ, 1 − ε_low, 1 + ε_high) A) per masked token, by row."""
    return [[-min(r * a, min(max(r, 1 - eps_low), 1 + eps_high) * a) for r in row if r]
            for row, a in zip(RATIOS, ADV)]


def test_grpo_averages_each_sequence_then_the_sequences():
    terms = _by_hand_terms(0.2, 0.2)  # [[−1.1], [0.9, 1.5, 1.0]]: ρ = 1.5 with A < 0 is not clipped
    expected = (sum(terms[0]) / 1 + sum(terms[1]) / 3) / 2
    assert grpo_loss(*_ratio_batch(), MASK).item() == pytest.approx(expected, rel=1e-12)


def test_dr_grpo_divides_by_a_constant():
    terms = _by_hand_terms(0.2, 0.2)
    expected = (sum(terms[0]) + sum(terms[1])) / (2 * 5)
    assert dr_grpo_loss(*_ratio_batch(), MASK, max_tokens=5).item() == pytest.approx(expected, rel=1e-12)


def test_dapo_divides_by_the_number_of_tokens():
    terms = _by_hand_terms(0.2, 0.28)
    expected = (sum(terms[0]) + sum(terms[1])) / 4
    assert dapo_loss(*_ratio_batch(), MASK).item() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("loss", [lambda *a: grpo_loss(*a), lambda *a: dr_grpo_loss(*a, max_tokens=3),
                                  lambda *a: dapo_loss(*a)])
def test_padding_log_probs_reach_neither_the_value_nor_the_gradient(loss):
    logp, logp_old, adv = _ratio_batch(requires_grad=True)
    value = loss(logp, logp_old, adv, MASK)
    value.backward()
    assert math.isfinite(value.item()) and torch.isfinite(logp.grad).all()
    assert logp.grad[0, 1:].tolist() == [0.0, 0.0]
    other = logp.detach().clone()
    other[0, 1:] = torch.tensor([-HUGE, 3.0])
    assert loss(other, logp_old, adv, MASK).item() == value.item()


def test_the_three_normalisations_differ_on_lengths_1_and_3():
    z = torch.zeros(2, 3, dtype=D)
    adv = torch.tensor([1.0, -1.0], dtype=D)  # per-token loss −1 on row 0 (1 token), +1 on row 1 (3 tokens)
    assert grpo_loss(z, z, adv, MASK).item() == pytest.approx((-1 + 3 / 3) / 2)  # per sequence: 0
    assert dr_grpo_loss(z, z, adv, MASK, max_tokens=3).item() == pytest.approx((-1 + 3) / (2 * 3))  # 1/3
    assert dapo_loss(z, z, adv, MASK).item() == pytest.approx((-1 + 3) / 4)  # per token: 1/2


def test_an_empty_row_counts_in_no_mean_over_sequences():
    z = torch.zeros(3, 3, dtype=D)
    mask = torch.cat([MASK, torch.zeros(1, 3, dtype=torch.bool)])
    adv = torch.tensor([1.0, -1.0, 7.0], dtype=D)
    assert grpo_loss(z, z, adv, mask).item() == pytest.approx((-1 + 1) / 2)
    assert dr_grpo_loss(z, z, adv, mask, max_tokens=3).item() == pytest.approx((-1 + 3) / (3 * 3))
    assert dapo_loss(z, z, adv, mask).item() == pytest.approx((-1 + 3) / 4)
    nothing = torch.zeros(3, 3, dtype=torch.bool)
    assert grpo_loss(z, z, adv, nothing).item() == 0.0 and dapo_loss(z, z, adv, nothing).item() == 0.0


def test_clip_higher_lets_a_ratio_of_1_25_through():
    logp = _logp([[math.log(1.25)]], requires_grad=True)
    old, adv, m = torch.zeros(1, 1, dtype=D), torch.tensor([1.0], dtype=D), torch.tensor([[True]])
    grpo = grpo_loss(logp, old, adv, m)
    assert grpo.item() == pytest.approx(-1.2)  # clipped at 1 + 0.2: constant, no gradient
    grpo.backward()
    assert logp.grad.item() == 0.0
    logp.grad = None
    dapo = dapo_loss(logp, old, adv, m)
    assert dapo.item() == pytest.approx(-1.25)  # inside 1 + 0.28: ρA, gradient −ρA
    dapo.backward()
    assert logp.grad.item() == pytest.approx(-1.25)
    low = _logp([[math.log(0.75)]])  # the lower bound stays 1 − 0.2 for both, with A < 0
    assert grpo_loss(low, old, -adv, m).item() == pytest.approx(0.8)
    assert dapo_loss(low, old, -adv, m).item() == pytest.approx(0.8)


def test_ppo_clip_high_none_is_the_symmetric_clip():
    logp, old, adv = torch.tensor([[0.5, -0.5, 0.1]]), torch.zeros(1, 3), torch.tensor([[1.0, -1.0, 1.0]])
    m = torch.ones(1, 3, dtype=torch.bool)
    torch.testing.assert_close(ppo_clipped_objective(logp, old, adv, m, 0.2),
                               ppo_clipped_objective(logp, old, adv, m, 0.2, clip_high=0.2))
    assert ppo_clipped_objective(logp, old, adv, m, 0.2, clip_high=0.5)[0, 0].item() == pytest.approx(1.5)


# -- gradients --------------------------------------------------------------------------------------------------
def test_on_policy_gradients_are_minus_a_over_the_normaliser():
    g = torch.Generator().manual_seed(0)
    logp = (-torch.rand(3, 4, generator=g, dtype=D)).requires_grad_()
    adv = torch.randn(3, generator=g, dtype=D)
    mask = torch.tensor([[True, False, False, False], [True, True, True, False], [True, True, True, True]])
    lengths, n = [1, 3, 4], 8

    def grad(fn):
        logp.grad = None
        fn(logp, logp.detach(), adv, mask).backward()  # ρ = 1: the REINFORCE gradient
        return logp.grad

    def expected(norm):  # −A_i / norm(i) on the mask, 0 off it
        return torch.tensor([[-adv[i].item() / norm(i) if mask[i, t] else 0.0 for t in range(4)] for i in range(3)],
                            dtype=D)

    torch.testing.assert_close(grad(grpo_loss), expected(lambda i: lengths[i] * 3))  # −A/(|o_i|·B)
    torch.testing.assert_close(grad(lambda *a: dr_grpo_loss(*a, max_tokens=6)), expected(lambda i: 3 * 6))
    torch.testing.assert_close(grad(dapo_loss), expected(lambda i: n))
    torch.testing.assert_close(grad(lambda lp, _, a, m: listing3_loss(lp, a, m)), expected(lambda i: n))


# -- the KL term -----------------------------------------------------------------------------------------------
def test_beta_adds_beta_times_the_mean_kl_with_each_normalisation():
    z = torch.zeros(2, 3, dtype=D)
    adv = torch.tensor([1.0, -1.0], dtype=D)
    kl_rows = [[0.3, 99.0, 99.0], [0.1, 0.2, 0.6]]  # 99: off the mask, ignored
    kl, beta = torch.tensor(kl_rows, dtype=D), 0.5
    grpo_kl = (kl_rows[0][0] / 1 + sum(kl_rows[1]) / 3) / 2
    token_kl = kl_rows[0][0] + sum(kl_rows[1])
    cases = [(grpo_loss, {}, grpo_kl), (dr_grpo_loss, {"max_tokens": 4}, token_kl / (2 * 4)),
             (dapo_loss, {}, token_kl / 4)]
    for fn, kw, mean_kl in cases:
        without = fn(z, z, adv, MASK, **kw).item()
        assert fn(z, z, adv, MASK, kl=kl, beta=beta, **kw).item() == pytest.approx(without + beta * mean_kl)
        assert fn(z, z, adv, MASK, kl=kl, **kw).item() == without  # beta = 0: kl is ignored


@pytest.mark.parametrize("fn, kw", [(grpo_loss, {}), (dr_grpo_loss, {"max_tokens": 3}), (dapo_loss, {})])
def test_kl_arguments_are_checked(fn, kw):
    z, adv = torch.zeros(2, 3), torch.zeros(2)
    with pytest.raises(ValueError, match="needs kl"):
        fn(z, z, adv, MASK, beta=0.1, **kw)
    for beta in (-0.1, float("nan"), float("inf"), True):
        with pytest.raises(ValueError, match="beta"):
            fn(z, z, adv, MASK, kl=z, beta=beta, **kw)
    with pytest.raises(ValueError, match="one shape"):
        fn(z, z, adv, MASK, kl=torch.zeros(2, 2), beta=0.1, **kw)


# -- bad input ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fn, kw", [(grpo_loss, {}), (dr_grpo_loss, {"max_tokens": 3}), (dapo_loss, {})])
def test_shapes_and_mask_are_checked(fn, kw):
    z, adv = torch.zeros(2, 3), torch.zeros(2)
    with pytest.raises(ValueError, match="one shape"):
        fn(z, torch.zeros(2, 2), adv, MASK, **kw)
    with pytest.raises(ValueError, match="advantages"):
        fn(z, z, torch.zeros(3), MASK, **kw)
    with pytest.raises(ValueError, match="logp"):
        fn(torch.zeros(3), torch.zeros(3), adv, MASK, **kw)
    with pytest.raises(ValueError, match="mask"):
        fn(z, z, adv, MASK.float(), **kw)
    with pytest.raises(ValueError, match="mask"):
        fn(z, z, adv, MASK[:, :2], **kw)


def test_listing3_checks_its_input():
    z = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="mask"):
        listing3_loss(z, torch.zeros(2), MASK.long())
    with pytest.raises(ValueError, match="advantages"):
        listing3_loss(z, torch.zeros(2, 2), MASK)
    with pytest.raises(TypeError, match="advantages"):
        listing3_loss(z, [0.0, 0.0], MASK)


def test_scalar_settings_are_checked():
    z, adv = torch.zeros(2, 3), torch.zeros(2)
    for max_tokens in (0, 2.5, True):
        with pytest.raises(ValueError, match="max_tokens"):
            dr_grpo_loss(z, z, adv, MASK, max_tokens=max_tokens)
    with pytest.raises(ValueError, match="clip"):
        grpo_loss(z, z, adv, MASK, clip=0.0)
    with pytest.raises(ValueError, match="clip_high"):
        dapo_loss(z, z, adv, MASK, clip_high=-0.1)


def test_numpy_integer_sizes_are_accepted_where_python_ints_are():
    import numpy as np

    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0])
    torch.testing.assert_close(group_advantages(rewards, np.int64(2)), group_advantages(rewards, 2))
    logp, mask = torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool)
    adv = torch.tensor([1.0, -1.0])
    torch.testing.assert_close(dr_grpo_loss(logp, logp, adv, mask, max_tokens=np.int64(4)),
                               dr_grpo_loss(logp, logp, adv, mask, max_tokens=4))
