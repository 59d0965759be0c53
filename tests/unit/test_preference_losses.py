"""The losses of chapters 9–10: Bradley–Terry, DPO, PPO's clipped surrogate, the KL estimators k1/k2/k3, GAE."""

import copy
import json
import math
import types

import pytest
import torch
import torch.nn.functional as F

from halluc_lab.training.losses import (bradley_terry_loss, dpo_loss, gae_advantages, kl_estimates, ppo_clipped_objective)

D = torch.float64


# -- Bradley–Terry (004 §9.1.2) ---------------------------------------------------------------------------
def test_bradley_terry_with_log_scores_is_p1_over_p1_plus_p2():
    p1, p2 = torch.tensor([0.2, 3.0, 7.5], dtype=D), torch.tensor([0.6, 1.0, 0.5], dtype=D)
    r1, r2 = p1.log(), p2.log()
    torch.testing.assert_close(torch.sigmoid(r1 - r2), p1 / (p1 + p2))  # 004's identity
    torch.testing.assert_close(bradley_terry_loss(r1, r2, reduction="none"), -(p1 / (p1 + p2)).log())


def test_bradley_terry_matches_the_closed_form_and_its_reductions():
    g = torch.Generator().manual_seed(0)
    rc, rr = torch.randn(2, 3, 4, generator=g, dtype=D)
    per = torch.log1p(torch.exp(-(rc - rr)))  # −log σ(z) = log(1 + e^{−z})
    torch.testing.assert_close(bradley_terry_loss(rc, rr, reduction="none"), per)
    torch.testing.assert_close(bradley_terry_loss(rc, rr, reduction="sum"), per.sum())
    torch.testing.assert_close(bradley_terry_loss(rc, rr), per.mean())


def test_bradley_terry_is_stable_for_large_margins():
    loss = bradley_terry_loss(torch.tensor([-500.0, 500.0]), torch.tensor([500.0, -500.0]), reduction="none")
    assert loss.tolist() == [1000.0, 0.0]


def test_bradley_terry_gradient_raises_the_chosen_score_and_lowers_the_rejected():
    rc = torch.tensor([0.3, -1.0], requires_grad=True)
    rr = torch.tensor([0.1, 2.0], requires_grad=True)
    bradley_terry_loss(rc, rr).backward()
    assert (rc.grad < 0).all() and (rr.grad > 0).all()  # a descent step moves r⁺ up and r⁻ down
    torch.testing.assert_close(rc.grad, -(1 - torch.sigmoid(rc - rr)).detach() / 2)  # −(1 − σ(z)) / n


@pytest.mark.parametrize("args, error", [
    ((torch.zeros(3), torch.zeros(2)), ValueError),
    ((torch.zeros(0), torch.zeros(0)), ValueError),
    (([1.0], torch.zeros(1)), TypeError),
])
def test_bradley_terry_rejects_mismatched_empty_or_non_tensor_scores(args, error):
    with pytest.raises(error, match="r_chosen"):
        bradley_terry_loss(*args)


def test_losses_reject_an_unknown_reduction():
    with pytest.raises(ValueError, match="reduction"):
        bradley_terry_loss(torch.zeros(1), torch.zeros(1), reduction="avg")


# -- preference data (004 §9.1.1) ----------------------------------------------------------
# 004 §9.1.1's record as printed; the line the PDF wrapped inside a string is rejoined.
RECORD_004 = """{
"prompt": [
  {"system": "You are a helpful, honest assistant."},
  {"role": "user", "content": "What color is the sky?"},
],
"chosen": [{"role": "assistant", "content": "Washington, D.C."}],
"rejected": [{"role": "assistant",
              "content": "? The capital of the United States is Washington, D.C."}]
}"""


def test_004_preference_record_is_not_json_and_its_system_turn_has_no_role():
    with pytest.raises(json.JSONDecodeError) as err:
        json.loads(RECORD_004)
    # the comma before the prompt's closing bracket
    assert (err.value.lineno, err.value.colno, err.value.msg) == (5, 1, "Expecting value")
    record = json.loads(RECORD_004.replace('"},\n],', '"}\n],'))
    assert [sorted(turn) for turn in record["prompt"]] == [["system"], ["content", "role"]]
    assert not [turn for turn in record["prompt"] if turn.get("role") == "system"]  # none by role


# -- DPO (Rafailov et al. eq. 7; 004 eq. 9.1) -------------------------------------------------------------
def test_dpo_matches_the_closed_form_on_hand_made_logps():
    pc, pr, rc, rr = (torch.tensor([x], dtype=D) for x in (-1.0, -3.0, -2.0, -2.0))
    t = dpo_loss(pc, pr, rc, rr, beta=0.5)
    z = 0.5 * ((-1.0 - -2.0) - (-3.0 - -2.0))  # β [(π_c − ref_c) − (π_r − ref_r)] = 1
    assert t.loss.item() == pytest.approx(math.log1p(math.exp(-z)), rel=1e-12)
    assert t.chosen_rewards.item() == pytest.approx(0.5) and t.rejected_rewards.item() == pytest.approx(-0.5)
    assert not t.chosen_rewards.requires_grad


def test_dpo_is_004_listing_with_preference_label_one():
    g = torch.Generator().manual_seed(1)
    pc, pr, rc, rr = torch.randn(4, 6, generator=g, dtype=D)
    beta = 0.7
    logits = beta * (pc - rc) - beta * (pr - rr)  # 004's dpo_loss with p = 1
    torch.testing.assert_close(dpo_loss(pc, pr, rc, rr, beta).loss, -torch.log(torch.sigmoid(logits)).mean())


def test_dpo_matches_trl_sigmoid_loss():
    trl = pytest.importorskip("trl")
    g = torch.Generator().manual_seed(2)
    pc, pr, rc, rr = torch.randn(4, 5, generator=g)
    stand_in = types.SimpleNamespace(beta=0.3, label_smoothing=0.0, loss_type="sigmoid", reference_free=False,
                                     f_divergence_type="reverse_kl", f_divergence_params={}, use_weighting=False,
                                     accelerator=types.SimpleNamespace(device=torch.device("cpu")))
    try:
        losses, chosen, rejected = trl.DPOTrainer.dpo_loss(stand_in, pc, pr, rc, rr)[:3]
    except (AttributeError, TypeError) as e:
        pytest.skip(f"this trl's DPOTrainer.dpo_loss has another interface ({type(e).__name__}: {e})")
    ours = dpo_loss(pc, pr, rc, rr, 0.3, reduction="none")
    torch.testing.assert_close(ours.loss, losses)
    torch.testing.assert_close(ours.chosen_rewards, chosen)
    torch.testing.assert_close(ours.rejected_rewards, rejected)


def test_dpo_gradient_raises_the_chosen_logp_relative_to_the_rejected():
    pc = torch.tensor([-4.0, -1.0], requires_grad=True)
    pr = torch.tensor([-2.0, -6.0], requires_grad=True)
    dpo_loss(pc, pr, torch.full((2,), -3.0), torch.full((2,), -3.0), beta=0.2).loss.backward()
    assert (pc.grad < 0).all() and (pr.grad > 0).all()
    torch.testing.assert_close(pc.grad, -pr.grad)  # only the margin matters


def test_dpo_with_beta_to_zero_is_log_2_with_slope_minus_beta_over_2():
    pc, pr, rc, rr = (torch.tensor([x], dtype=D) for x in (-1.0, -5.0, -2.0, -2.5))
    margin = (-1.0 + 2.0) - (-5.0 + 2.5)  # 3.5
    beta = 1e-6
    z = beta * margin  # softplus(−z) = log 2 − z/2 + z²/8 + O(z⁴): flat, gradient → 0 as β → 0
    assert dpo_loss(pc, pr, rc, rr, beta).loss.item() == pytest.approx(math.log(2) - z / 2 + z * z / 8, abs=1e-15)


def test_dpo_with_large_beta_is_a_hinge_on_the_margin():
    beta = 1e3
    right = dpo_loss(*(torch.tensor([x], dtype=D) for x in (-1.0, -2.0, -1.5, -1.5)), beta).loss  # margin +1
    wrong = dpo_loss(*(torch.tensor([x], dtype=D) for x in (-2.0, -1.0, -1.5, -1.5)), beta).loss  # margin −1
    assert right.item() < 1e-300 and wrong.item() == pytest.approx(beta * 1.0)  # softplus(−βΔ) → β max(0, −Δ)


def test_dpo_label_smoothing_averages_the_loss_of_both_labels():
    g = torch.Generator().manual_seed(3)
    pc, pr, rc, rr = torch.randn(4, 7, generator=g, dtype=D)
    eps = 0.2
    forward = dpo_loss(pc, pr, rc, rr, 0.4, reduction="none").loss
    backward = dpo_loss(pr, pc, rr, rc, 0.4, reduction="none").loss  # the labels flipped
    smoothed = dpo_loss(pc, pr, rc, rr, 0.4, label_smoothing=eps, reduction="none").loss
    torch.testing.assert_close(smoothed, (1 - eps) * forward + eps * backward)


@pytest.mark.parametrize("beta", [0, -0.1, float("nan"), float("inf"), True, "0.1"])
def test_dpo_rejects_a_beta_that_is_not_positive_and_finite(beta):
    with pytest.raises(ValueError, match="beta"):
        dpo_loss(*torch.zeros(4, 2), beta)


def test_dpo_rejects_mismatched_or_empty_logps_and_bad_smoothing():
    with pytest.raises(ValueError, match="one shape"):
        dpo_loss(torch.zeros(2), torch.zeros(2), torch.zeros(3), torch.zeros(2), 0.1)
    with pytest.raises(ValueError, match="empty"):
        dpo_loss(*torch.zeros(4, 0), 0.1)
    with pytest.raises(ValueError, match="label_smoothing"):
        dpo_loss(*torch.zeros(4, 2), 0.1, label_smoothing=0.5)


# -- PPO's clipped surrogate (Schulman et al. 2017, eq. 7) ----------------------------------------------------
@pytest.mark.parametrize("ratio, advantage, expected, has_gradient", [
    (1.1, 1.0, 1.1, True),    # inside the clip: ρA
    (1.1, -1.0, -1.1, True),
    (1.5, 1.0, 1.2, False),   # above 1 + ε with A > 0: clipped, no push further up
    (1.5, -1.0, -1.5, True),  # above with A < 0: the unclipped (worse) term, pulled back
    (0.5, 1.0, 0.5, True),    # below 1 − ε with A > 0: the unclipped term, pushed back up
    (0.5, -1.0, -0.8, False),  # below with A < 0: clipped, no push further down
])
def test_clipped_objective_on_hand_made_ratios(ratio, advantage, expected, has_gradient):
    logp_new = torch.tensor([[math.log(ratio)]], dtype=D, requires_grad=True)
    obj = ppo_clipped_objective(logp_new, torch.zeros(1, 1, dtype=D), torch.tensor([[advantage]], dtype=D),
                                torch.tensor([[True]]), clip=0.2)
    assert obj.item() == pytest.approx(expected)
    obj.sum().backward()
    assert (logp_new.grad.abs().item() > 0) == has_gradient


def test_clipped_objective_is_zero_off_the_mask_even_where_the_ratio_overflows():
    obj = ppo_clipped_objective(torch.tensor([[1000.0, 0.0]]), torch.zeros(1, 2), torch.ones(1, 2),
                                torch.tensor([[False, True]]), clip=0.2)
    assert obj.tolist() == [[0.0, 1.0]]


def test_clipped_objective_rejects_bad_clip_mask_and_shapes():
    x, m = torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool)
    for clip in (0, -0.2, float("nan")):
        with pytest.raises(ValueError, match="clip"):
            ppo_clipped_objective(x, x, x, m, clip)
    with pytest.raises(ValueError, match="mask"):
        ppo_clipped_objective(x, x, x, m.float(), 0.2)
    with pytest.raises(ValueError, match="one shape"):
        ppo_clipped_objective(x, x, torch.zeros(2, 2), m, 0.2)


# -- k1, k2, k3 (Schulman 2020) ---------------------------------------------------------------------------------
P = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=D)
REF = torch.tensor([0.25, 0.35, 0.3, 0.1], dtype=D)
KL = float((P * (P / REF).log()).sum())


def test_k1_k2_k3_per_token_on_hand_made_logps():
    logp, logp_ref = P.log()[None], REF.log()[None]
    k = kl_estimates(logp, logp_ref, torch.ones(1, 4, dtype=torch.bool))
    r = REF / P
    torch.testing.assert_close(k.k1[0], -r.log())
    torch.testing.assert_close(k.k2[0], 0.5 * r.log() ** 2)
    torch.testing.assert_close(k.k3[0], r - 1 - r.log())
    assert (k.k3 >= 0).all() and (k.k1 < 0).any()  # k3 is never negative, k1 can be


def test_k1_and_k3_are_unbiased_and_k2_close_under_the_sampling_distribution():
    k = kl_estimates(P.log()[None], REF.log()[None], torch.ones(1, 4, dtype=torch.bool))
    expect = lambda x: float((P * x[0]).sum())  # E_{x~p}
    assert expect(k.k1) == pytest.approx(KL, rel=1e-12)
    assert expect(k.k3) == pytest.approx(KL, rel=1e-12)
    assert expect(k.k2) == pytest.approx(KL, rel=0.25)  # second-order accurate only


def test_k3_mean_over_samples_approaches_the_exact_kl():
    g = torch.Generator().manual_seed(0)
    x = torch.multinomial(P, 200_000, replacement=True, generator=g)[None]  # (1, N) tokens sampled from p
    k3 = kl_estimates(P.log()[x], REF.log()[x], torch.ones_like(x, dtype=torch.bool)).k3
    stderr = float(k3.std()) / math.sqrt(k3.numel())
    assert abs(float(k3.mean()) - KL) < 4 * stderr


def test_kl_estimates_are_zero_off_the_mask():
    k = kl_estimates(torch.tensor([[-1.0, -2.0]]), torch.tensor([[-3.0, 0.0]]), torch.tensor([[True, False]]))
    assert all(float(x[0, 1]) == 0 for x in k) and all(float(x[0, 0]) != 0 for x in k)


# -- GAE (Schulman et al. 2016) ------------------------------------------------------------------------------------
def _gae_reference(rewards, values, gamma, lam):
    """One episode, the definition: A_t = Σ_l (γλ)^l δ_{t+l}, V after the last step = 0."""
    T = len(rewards)
    v = list(values) + [0.0]
    deltas = [rewards[t] + gamma * v[t + 1] - v[t] for t in range(T)]
    return [sum((gamma * lam) ** l * deltas[t + l] for l in range(T - t)) for t in range(T)]


@pytest.mark.parametrize("gamma, lam", [(1.0, 0.95), (0.9, 0.5), (1.0, 1.0), (0.99, 0.0)])
def test_gae_matches_the_definition_on_rows_of_different_lengths(gamma, lam):
    g = torch.Generator().manual_seed(4)
    rewards, values = torch.randn(2, 3, 6, generator=g, dtype=D)
    lengths = [6, 3, 1]
    mask = torch.arange(6)[None, :] < torch.tensor(lengths)[:, None]
    adv, ret = gae_advantages(rewards, values, mask, gamma, lam)
    for b, n in enumerate(lengths):
        expected = _gae_reference(rewards[b, :n].tolist(), values[b, :n].tolist(), gamma, lam)
        assert adv[b, :n].tolist() == pytest.approx(expected, rel=1e-10)
        assert adv[b, n:].abs().sum() == 0 and ret[b, n:].abs().sum() == 0
    torch.testing.assert_close(ret, (adv + values) * mask)


def test_gae_with_lambda_one_is_the_return_minus_the_value():
    rewards = torch.tensor([[0.0, 0.0, 2.0]], dtype=D)
    values = torch.tensor([[0.5, 1.0, 1.5]], dtype=D)
    adv, ret = gae_advantages(rewards, values, torch.ones(1, 3, dtype=torch.bool), gamma=1.0, lam=1.0)
    assert ret.tolist() == [[2.0, 2.0, 2.0]] and adv.tolist() == [[1.5, 1.0, 0.5]]


def test_gae_rejects_bad_gamma_lambda_and_shapes():
    x, m = torch.zeros(1, 3), torch.ones(1, 3, dtype=torch.bool)
    for gamma in (0.0, 1.5, float("nan")):
        with pytest.raises(ValueError, match="gamma"):
            gae_advantages(x, x, m, gamma=gamma)
    with pytest.raises(ValueError, match="lam"):
        gae_advantages(x, x, m, lam=-0.1)
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        gae_advantages(torch.zeros(3), torch.zeros(3), torch.ones(3, dtype=torch.bool))


def test_dpo_loss_is_the_mean_of_softplus_of_minus_the_scaled_margin():
    g = torch.Generator().manual_seed(5)
    pc, pr, rc, rr = torch.randn(4, 9, generator=g, dtype=D)
    torch.testing.assert_close(dpo_loss(pc, pr, rc, rr, 2.0).loss, F.softplus(-2.0 * ((pc - rc) - (pr - rr))).mean())


def test_004_listing_starts_the_policy_away_from_its_reference():
    """004 §9.2's listing draws ``pi_theta`` and ``pi_ref`` as two independent networks."""
    def policy():  # the listing's PolicyNetwork(10, 2)
        return torch.nn.Sequential(torch.nn.Linear(10, 128), torch.nn.ReLU(),
                                   torch.nn.Linear(128, 2), torch.nn.Softmax(dim=-1))

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(42)  # the listing's draws, in its order: the data, then the networks
        x = torch.randn(1000, 10)
        y1, y2, p = (torch.randint(0, 2, (1000,)) for _ in range(3))
        pi_theta, pi_ref = policy(), policy()
    won, lost = torch.where(p == 1, y1, y2), torch.where(p == 1, y2, y1)

    def logp(probs, y):
        return probs.gather(1, y[:, None])[:, 0].log()

    def terms(reference):
        with torch.no_grad():
            theta, ref = pi_theta(x).double(), reference(x).double()  # (1000, 2)
        out = dpo_loss(logp(theta, won), logp(theta, lost), logp(ref, won), logp(ref, lost),
                       beta=1.0, reduction="none")
        return out, (theta * (theta / ref).log()).sum(-1)  # and KL(π_θ ‖ π_ref) per context

    at_start, kl = terms(pi_ref)
    differ = y1 != y2
    assert float(at_start.loss[differ].mean()) == pytest.approx(0.711, abs=5e-4)  # log 2 = 0.693
    assert float(at_start.chosen_rewards.abs().mean()) == pytest.approx(0.129, abs=5e-4)
    assert float(at_start.chosen_rewards.abs().max()) == pytest.approx(0.670, abs=5e-4)
    assert float(kl.mean()) == pytest.approx(0.0127, abs=5e-5)
    copied, kl = terms(copy.deepcopy(pi_theta))  # the policy starts at its reference
    assert not copied.chosen_rewards.any() and not kl.any()
    log_2 = torch.full((1000,), math.log(2), dtype=torch.float64)
    assert torch.allclose(copied.loss, log_2, rtol=0, atol=1e-15)
