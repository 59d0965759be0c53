"""RLVR with group baselines: rollouts as training rows whose log-probs are the engine's, the verifier's reward
(abstention threshold, <bksp> cost), bad settings, the reward rising on a toy task under every loss, determinism."""

import copy
import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch

from halluc_lab import recipes
from halluc_lab.stages import rlvr as rlvr_module
from halluc_lab.generation.backtrack import CONTEXTS, rollout, training_rows
from halluc_lab.training.data import IGNORE, pad
from halluc_lab.device import deterministic
from halluc_lab.model.transformer import Transformer
from halluc_lab.stages.reward_model import VerifierReward
from halluc_lab.stages.rlvr import (
    RLVRConfig,
    RLVRHistory,
    RLVR,
    rlvr,
)
from halluc_lab.stages.rlvr_rounds import CapturedUpdate, keep_rows, log_logprobs, pad_flags, round_rows
from tests.unit._tiny_lm import small_transformer
from halluc_lab.tasks import make_task
from halluc_lab.training.rlvr_losses import DAPO, GRPO, POLICY_LOSSES, DrGRPO, Listing3
from halluc_lab.model.tokenizer import Tokenizer
from tests.unit.test_backtrack import BKSP, FORCED, prompts, run, tiny
from tests.unit.test_preference import cache, same_weights, shared_cache, tiny_chain  # noqa: F401 (fixtures)

CPU = torch.device("cpu")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread: these models are tiny, and two threads spin-waiting on a busy two-core machine
    make a round forty times slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# -- round_rows + log_logprobs: the engine's log-probs, each sampled token once -----------------------------------
def check_log(model, ps, out, context, width, banned=()):
    """log_logprobs of round_rows equal the rollout's recorded log-probs where it sampled, and are 0 elsewhere."""
    G = len(out.token_lists()) // len(ps)
    repeated = [ps[i // G] for i in range(len(out.token_lists()))]  # prompt-major, as rlvr repeats them
    rows = round_rows(repeated, out.token_lists(), out.sampled_lists(), width, bksp_id=BKSP, context=context, pad_id=0)
    N, M = out.tokens.shape
    assert rows.shape == (N, width) and M <= width
    sampled = torch.nn.functional.pad(out.sampled_mask, (0, width - M))  # (N, width)
    n_sampled = int(sampled.sum())
    assert rows.slot.shape == (n_sampled,) == ((rows.labels != IGNORE).sum(),)
    assert sorted(rows.slot.tolist()) == sampled.flatten().nonzero()[:, 0].tolist()  # each sampled token once
    with torch.no_grad():
        lp = log_logprobs(model, rows, banned)
    assert lp.shape == (N, width) and lp.dtype == torch.float32
    recorded = torch.nn.functional.pad(out.logprobs, (0, width - M))
    torch.testing.assert_close(lp[sampled], recorded[sampled], atol=1e-5, rtol=0)
    assert (lp[~sampled] == 0).all()
    return rows, lp


@pytest.mark.parametrize("context", CONTEXTS)
def test_round_rows_give_the_engines_log_probs_of_rollouts_with_sampled_take_backs(context):
    model, ps = tiny(bksp_boost=2.0), prompts(4)
    out = rollout(model, ps, 12, bksp_id=BKSP, context=context, generator=torch.Generator().manual_seed(4),
                  n_samples=3)
    assert (out.tokens == BKSP).sum() >= 5 and out.sampled_mask.sum() == out.lengths.sum()
    rows, _ = check_log(model, ps, out, context, width=15)
    if context == "keep":
        assert rows.input_ids.shape[0] == 12  # one row per rollout
    else:
        assert rows.input_ids.shape[0] > 12  # each <bksp> closes a branch of its own


def test_keep_rows_of_a_round_are_training_rows_padded_with_their_slots_in_order():
    """The keep context's rows are laid out for the whole round at once: the same tensors as training_rows + pad."""
    g = torch.Generator().manual_seed(0)
    draw = lambda lo, hi: int(torch.randint(lo, hi + 1, (), generator=g))  # noqa: E731
    for _ in range(50):
        R, width = draw(1, 12), draw(1, 9)
        ps = [[1, *torch.randint(5, 30, (draw(0, 6),), generator=g).tolist()] for _ in range(R)]
        logs = [torch.randint(0, 30, (draw(0, width),), generator=g).tolist() for _ in range(R)]
        flags = [(torch.rand(len(t), generator=g) < 0.8).tolist() for t in logs]
        rows = round_rows(ps, logs, flags, width, bksp_id=BKSP, context="keep", pad_id=0)
        seqs = [r for p, t, f in zip(ps, logs, flags) for r in training_rows(p, t, f, BKSP, "keep")]
        expected = pad(seqs, 0)
        assert torch.equal(rows.input_ids, expected.input_ids) and torch.equal(rows.labels, expected.labels)
        assert rows.slot.tolist() == [i * width + j for i, f in enumerate(flags) for j, s in enumerate(f) if s]
        assert rows.shape == (R, width) and rows.slot.dtype == torch.long
        assert torch.equal(pad_flags(flags, width),
                           torch.tensor([f + [False] * (width - len(f)) for f in flags]).view(R, width))
    with pytest.raises(ValueError, match="prompt"):
        round_rows([[]], [[5]], [[True]], 2, bksp_id=BKSP, context="keep", pad_id=0)
    with pytest.raises(ValueError, match="one length"):
        round_rows([[1]], [[5, 6]], [[True]], 2, bksp_id=BKSP, context="keep", pad_id=0)


@pytest.mark.parametrize("context", CONTEXTS)
@pytest.mark.parametrize("args, match", [
    (([], [], [], 2), "at least one rollout"),
    (([[1]], [[5, 6, 7]], [[True] * 3], 2), "3 tokens does not fit in width=2"),  # would spill into the next row
    (([[1], [1]], [[5]], [[True]], 2), "as long"),
])
def test_round_rows_refuse_an_empty_round_a_log_wider_than_the_width_and_ragged_lists(context, args, match):
    with pytest.raises(ValueError, match=match):
        round_rows(*args, bksp_id=BKSP, context=context, pad_id=0)


@pytest.mark.parametrize("context", CONTEXTS)
def test_forced_tokens_are_context_not_targets_and_get_no_log_prob(context):
    model, ps = tiny(bksp_boost=2.0), prompts(4)
    out = run(model, ps, context, forced=FORCED, steps=14, n_samples=2)
    assert not out.sampled_mask[out.lengths[:, None] > torch.arange(out.tokens.shape[1])].all()  # some were forced
    check_log(model, ps, out, context, width=14)


@pytest.mark.parametrize("context", CONTEXTS)
def test_with_bksp_masked_the_log_probs_are_the_masked_policys(context):
    model, ps = tiny(bksp_boost=50.0), prompts(4)
    out = rollout(model, ps, 8, bksp_id=BKSP, context=context, allow_bksp=False,
                  generator=torch.Generator().manual_seed(2), n_samples=2)
    assert not (out.tokens == BKSP).any()
    rows, lp = check_log(model, ps, out, context, width=out.tokens.shape[1], banned=(BKSP,))
    with torch.no_grad():  # the unmasked policy gives its mass to <bksp>: other numbers
        gain = (lp - log_logprobs(model, rows))[out.sampled_mask]
    assert (gain >= 0).all() and gain.mean() > 1


# -- the verifier's reward ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def kb():
    """The smoke knowledge-base walk, one answerable prompt, and a correct, an abstained and a wrong completion."""
    task = make_task(recipes.TASK_PLANS[("kb_walk", "smoke")].world)
    tok = task.tokenizer()
    e = next(e for e in task.examples("heldout", 32, seed=0) if "<abstain>" not in e.completion)
    gold = tok.encode(e.completion)
    other = next(t for t in map(tok.token_id, tok.symbols[:5]) if t != gold[-1])  # another entity
    completions = {"correct": [*gold, tok.eos_id], "abstained": [tok.abstain_id, tok.eos_id],
                   "wrong": [*gold[:-1], other, tok.eos_id]}
    return task, tok, [tok.bos_id, *tok.encode(e.prompt)], completions, other


def rewards_of(kb, lam, bksp_cost=0.0, completions=None):
    task, tok, prompt, named, _ = kb
    completions = completions or named
    values = VerifierReward(task, tok, lam, bksp_cost)([prompt] * len(completions), list(completions.values()))
    return dict(zip(completions, values))


@pytest.mark.parametrize("lam", [0.0, 0.5, 1.0, 3.0])
def test_the_verifier_pays_one_for_correct_nothing_for_abstaining_and_minus_lambda_for_wrong(kb, lam):
    assert rewards_of(kb, lam) == {"correct": 1.0, "abstained": 0.0, "wrong": -lam}


@pytest.mark.parametrize("lam", [0.25, 1.0, 3.0, 9.0])
def test_answering_pays_in_expectation_exactly_when_p_exceeds_lambda_over_one_plus_lambda(kb, lam):
    r = rewards_of(kb, lam)
    threshold = lam / (1 + lam)
    gain = lambda p: p * r["correct"] + (1 - p) * r["wrong"] - r["abstained"]  # answer vs abstain
    assert gain(threshold) == pytest.approx(0.0, abs=1e-12)
    for p in [k / 40 for k in range(41)] + [threshold - 1e-3, threshold + 1e-3]:
        if abs(p - threshold) > 1e-9:
            assert (gain(p) > 0) == (p > threshold), p


def test_each_bksp_costs_bksp_cost_and_the_verdict_is_on_the_text_it_leaves(kb):
    _, tok, _, named, other = kb
    b, eos = tok.bksp_id, tok.eos_id
    gold = named["correct"][:-1]
    completions = {"corrected": [*gold[:-1], other, b, gold[-1], eos],  # a take-back that fixes the answer
                   "twice": [b, *gold[:-1], other, b, gold[-1], eos],  # the first <bksp> erases nothing, still costs
                   "still_wrong": [*gold, b, other, eos],  # a take-back that breaks it
                   "abstained": [other, b, tok.abstain_id, eos], "clean": named["correct"]}
    assert rewards_of(kb, 3.0, 0.0, completions) == {"corrected": 1.0, "twice": 1.0, "still_wrong": -3.0,
                                                     "abstained": 0.0, "clean": 1.0}
    assert rewards_of(kb, 3.0, 0.25, completions) == pytest.approx(
        {"corrected": 0.75, "twice": 0.5, "still_wrong": -3.25, "abstained": -0.25, "clean": 1.0})


@pytest.mark.parametrize("bad", [{"lam": -0.5}, {"bksp_cost": -0.1}, {"lam": math.nan}, {"bksp_cost": math.inf},
                                 {"lam": True}])
def test_the_verifier_refuses_a_negative_or_odd_lambda_or_bksp_cost(kb, bad):
    task, tok, *_ = kb
    with pytest.raises(ValueError, match=next(iter(bad))):
        VerifierReward(task, tok, **{"lam": 1.0, "bksp_cost": 0.0, **bad})


# -- settings -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad, error, match", [
    ({"samples_per_prompt": 1}, ValueError, "at least 2 samples"),
    ({"samples_per_prompt": True}, ValueError, "samples_per_prompt"),
    ({"context": "undo"}, ValueError, "context"),
    ({"allow_bksp": 1}, TypeError, "allow_bksp"),
    ({"fused_decode": "yes"}, TypeError, "fused_decode"),
    ({"captured_update": 1}, TypeError, "captured_update"),
    ({"captured_update": True, "context": "erase"}, ValueError, "captured_update needs context='keep'"),
    ({"prompts_per_iteration": 6, "minibatches": 4}, ValueError, "minibatches=4 equal shares"),
    ({"beta": -0.1}, ValueError, "beta"),
    ({"beta": math.nan}, ValueError, "beta"),
    ({"iterations": 0}, ValueError, "iterations"),
    ({"lr": 0.0}, ValueError, "lr"),
])
def test_rlvr_config_refuses_bad_settings(bad, error, match):
    with pytest.raises(error, match=match):
        RLVRConfig(**bad)


@pytest.mark.parametrize("bad, error, match", [
    ({"policy_loss": object()}, TypeError, "policy_loss"),
    ({"policy_loss": GRPO}, TypeError, "policy_loss"),  # the class, not a loss
    ({"lam": -1.0}, ValueError, "lam"),
    ({"bksp_cost": -0.5}, ValueError, "bksp_cost"),
    ({"config": {"beta": 0.1}}, TypeError, "RLVRConfig"),
    ({"n_prompts": 0}, ValueError, "n_prompts"),
])
def test_the_rlvr_stage_refuses_bad_settings(bad, error, match):
    with pytest.raises(error, match=match):
        RLVR(**{"n_prompts": 4, **bad})


def test_the_stage_has_no_rows():
    with pytest.raises(ValueError, match="no rows"):
        RLVR(n_prompts=4).rows(None)


def test_listing3_has_no_kl_term():
    logp, mask = torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="no KL term"):
        Listing3()(logp, logp, torch.tensor([1.0, -1.0]), mask, kl=torch.zeros(2, 3), beta=0.1, max_tokens=3)
    assert Listing3()(logp, logp, torch.tensor([1.0, -1.0]), mask, kl=None, beta=0.0, max_tokens=3).item() == 0


# -- a toy problem: the first token of the answer should be TARGET ----------------------------------------------------
TOK = Tokenizer([f"w{i}" for i in range(11)])  # 16 tokens, the five special ones first
TARGET = TOK.token_id("w4")
PROMPTS = [[TOK.bos_id, 5 + i % 4, 9 + i % 3] for i in range(8)]
TOY = RLVRConfig(iterations=30, prompts_per_iteration=4, samples_per_prompt=8, max_new_tokens=4, lr=1e-2)


def toy_policy(seed=0) -> Transformer:
    return small_transformer(TOK.vocab_size, seed)


def first_is_target(prompts, completions, **kw):
    """+1 when the rollout's first emitted token is TARGET, else 0."""
    return [float(list(c[:1]) == [TARGET]) for c in completions]


def train_toy(loss=None, device=CPU, reward=first_is_target, seed=0, **cfg) -> tuple[RLVRHistory, Transformer]:
    """RLVR on the toy task (GRPO unless ``loss``), TOY's settings changed by ``cfg``; the history and the policy."""
    loss = GRPO() if loss is None else loss
    policy = toy_policy().to(device)
    with deterministic():
        hist = rlvr(policy, copy.deepcopy(policy).eval(), PROMPTS, reward, dataclasses.replace(TOY, **cfg), loss,
                    tok=TOK, seed=seed, **({"autocast_dtype": torch.bfloat16} if device.type == "cuda" else {}))
    return hist, policy


def mean(xs):
    return sum(xs) / len(xs)


@pytest.mark.parametrize("loss, cfg", [
    (GRPO(), {}), (DrGRPO(), {}), (DAPO(), {}), (Listing3(), {}),
    (GRPO(), {"minibatches": 2}),  # the second step's ratio is against π_old from a forward pass
    (DAPO(), {"minibatches": 4, "context": "erase"}),
    (GRPO(), {"allow_bksp": False}),
], ids=["grpo", "dr_grpo", "dapo", "listing3", "grpo-2-minibatches", "dapo-4-minibatches-erase", "grpo-no-bksp"])
def test_rlvr_raises_the_reward_of_a_toy_task(loss, cfg):
    hist, _ = train_toy(loss, **cfg)
    assert mean(hist.reward[-5:]) > mean(hist.reward[:5]) + 0.4
    assert {f.name for f in dataclasses.fields(RLVRHistory)} == set(dataclasses.asdict(hist))
    assert all(len(series) == TOY.iterations for series in dataclasses.asdict(hist).values())
    assert all(0 <= x <= 1 for x in hist.abstained + hist.bksp_rate + hist.zero_groups)
    assert all(1 <= n <= TOY.max_new_tokens for n in hist.length)
    assert all(k >= 0 for k in hist.kl) and hist.kl[-1] > 0
    if cfg.get("minibatches", 1) == 1:
        assert hist.kl[0] == 0  # round 1's only step is measured before it: π = π_ref
    if cfg.get("allow_bksp", True):
        assert mean(hist.bksp_rate) > 0
    else:
        assert hist.bksp_rate == [0.0] * TOY.iterations


def test_a_kl_term_holds_the_policy_nearer_the_reference():
    free, _ = train_toy(GRPO())
    held, _ = train_toy(GRPO(), beta=0.5)
    assert mean(held.reward[-5:]) > mean(held.reward[:5]) + 0.3
    assert held.kl[0] == 0 and all(k >= 0 for k in held.kl) and held.kl[-1] > 0.01
    assert sum(held.kl) < sum(free.kl)
    with pytest.raises(ValueError, match="no KL term"):
        train_toy(Listing3(), beta=0.1, iterations=1)


def dense(prompts, completions, **kw):
    """A reward that rarely ties within a group: the first token's id, scaled."""
    return [c[0] / TOK.vocab_size for c in completions]


@dataclasses.dataclass(frozen=True)
class SpyGRPO(GRPO):
    """GRPO that keeps what each call of the loss received."""

    calls: list = dataclasses.field(default_factory=list, compare=False)

    def __call__(self, logp, logp_old, advantages, mask, **kw):
        self.calls.append(SimpleNamespace(logp=logp.detach().clone(), old=logp_old.clone(), adv=advantages.clone(),
                                          mask=mask.clone(), grad=logp.requires_grad, **kw))
        return super().__call__(logp, logp_old, advantages, mask, **kw)


@pytest.mark.parametrize("minibatches", [1, 2])
def test_pi_old_is_the_policy_before_the_rounds_first_step(monkeypatch, minibatches):
    """With one minibatch the ratio is the step's own (ρ = 1); with more, π_old comes from a forward pass before
    the round's first step, so the first minibatch's ratio is 1 and the later ones' is not."""
    forwards = []

    def logged(model, rows, banned=()):
        out = log_logprobs(model, rows, banned)
        forwards.append(SimpleNamespace(model=model, logp=out.detach().clone(), grad=torch.is_grad_enabled()))
        return out

    monkeypatch.setattr(rlvr_module, "log_logprobs", logged)
    loss = SpyGRPO()
    hist, policy = train_toy(loss, reward=dense, iterations=2, minibatches=minibatches)
    k = minibatches
    assert len(loss.calls) == 2 * k and all(c.grad and c.max_tokens == TOY.max_new_tokens for c in loss.calls)
    assert hist.zero_groups[0] == 0  # every group carries signal: every step moves the policy
    per_round = 3 * k if k > 1 else 2 * k  # π_ref's forwards, π_old's (several minibatches only), the steps'
    assert len(forwards) == 2 * per_round
    for r in range(2):
        fs = forwards[r * per_round:(r + 1) * per_round]
        ref = [f for f in fs if f.model is not policy]
        old = [f for f in fs if f.model is policy and not f.grad]
        steps = [f for f in fs if f.model is policy and f.grad]
        assert len(ref) == len(steps) == k and not any(f.grad for f in ref)
        calls = loss.calls[r * k:(r + 1) * k]
        for c, f in zip(calls, steps, strict=True):
            assert torch.equal(c.logp, f.logp) and c.adv.shape == (c.logp.shape[0],)
            assert c.adv.view(-1, TOY.samples_per_prompt).sum(1).abs().max() < 1e-4  # A against the group's mean
        if k == 1:
            assert not old and torch.equal(calls[0].old, calls[0].logp)  # ρ = 1
            continue
        for c, o in zip(calls, old, strict=True):
            assert torch.equal(c.old, o.logp)
        torch.testing.assert_close(calls[0].old, calls[0].logp, atol=1e-6, rtol=0)  # no step yet: ρ = 1
        assert (calls[1].old - calls[1].logp).abs().max() > 1e-3  # the first step moved π: ρ ≠ 1
        if r == 0:  # before any step π_old is π_ref
            for o, f in zip(old, ref, strict=True):
                assert torch.equal(o.logp, f.logp)
    assert (hist.kl[0] > 0) == (minibatches > 1)  # a later minibatch is measured after the first step


def test_the_reward_sees_each_prompt_g_times_in_a_row_and_the_whole_log():
    seen = []

    def spy(prompts, completions, **kw):
        seen.append((prompts, completions))
        return first_is_target(prompts, completions)

    train_toy(reward=spy, iterations=3)
    assert len(seen) == 3
    for ps, cs in seen:
        assert len(ps) == len(cs) == TOY.prompts_per_iteration * TOY.samples_per_prompt
        groups = [ps[i:i + TOY.samples_per_prompt] for i in range(0, len(ps), TOY.samples_per_prompt)]
        assert all(g[0] in PROMPTS and all(p == g[0] for p in g) for g in groups)
        assert all(1 <= len(c) <= TOY.max_new_tokens for c in cs)
    assert any(TOK.bksp_id in c for _, cs in seen for c in cs)  # the log, take-backs included, not the text
    assert sorted(map(tuple, (g for p, _ in seen[:2] for g in p[::TOY.samples_per_prompt]))) == sorted(map(tuple, PROMPTS))


def test_the_same_seed_gives_the_same_history_and_weights_and_another_seed_does_not():
    cfg = {"iterations": 6, "minibatches": 2, "context": "erase"}
    a, policy_a = train_toy(GRPO(), **cfg)
    b, policy_b = train_toy(GRPO(), **cfg)
    assert a == b and same_weights(policy_a, policy_b)
    c, policy_c = train_toy(GRPO(), seed=1, **cfg)
    assert c != a and not same_weights(policy_a, policy_c)


@pytest.mark.parametrize("reward, match", [
    (lambda p, c, **kw: [0.0] * (len(c) - 1), "one finite number per completion"),
    (lambda p, c, **kw: [math.nan] + [0.0] * (len(c) - 1), "one finite number per completion"),
    (lambda p, c, **kw: [math.inf] * len(c), "one finite number per completion"),
    (lambda p, c, **kw: ["1"] * len(c), "value 0 is str '1'"),
    (lambda p, c, **kw: [None] * len(c), "value 0 is NoneType None"),
])
def test_rlvr_refuses_a_reward_of_the_wrong_count_or_not_finite(reward, match):
    with pytest.raises((ValueError, TypeError), match=match):
        train_toy(reward=reward, iterations=1)


def test_rlvr_refuses_a_shared_reference_a_foreign_loss_and_no_prompts():
    policy = toy_policy()
    with pytest.raises(ValueError, match="of its own"):
        rlvr(policy, policy, PROMPTS, first_is_target, TOY, GRPO(), tok=TOK, seed=0)
    for loss in (lambda *a, **k: torch.zeros(()), "grpo", GRPO):
        with pytest.raises(TypeError, match="loss must be one of"):
            rlvr(policy, copy.deepcopy(policy), PROMPTS, first_is_target, TOY, loss, tok=TOK, seed=0)
    with pytest.raises(ValueError, match="at least one prompt"):
        rlvr(policy, copy.deepcopy(policy), [], first_is_target, TOY, GRPO(), tok=TOK, seed=0)
    assert len(POLICY_LOSSES) == 4


# -- CUDA -----------------------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_rlvr_on_cuda_in_bf16_raises_the_reward_and_repeats_exactly():
    cuda = torch.device("cuda")
    hist, policy = train_toy(GRPO(), device=cuda, minibatches=2)
    assert mean(hist.reward[-5:]) > mean(hist.reward[:5]) + 0.4
    assert all(math.isfinite(x) for series in dataclasses.asdict(hist).values() for x in series)
    again, policy_again = train_toy(GRPO(), device=cuda, minibatches=2)
    assert again == hist and same_weights(policy, policy_again)


@pytest.mark.gpu
def test_rlvr_with_fused_rollouts_raises_the_reward_and_repeats_exactly():
    cuda = torch.device("cuda")
    hist, policy = train_toy(GRPO(), device=cuda, fused_decode=True)
    assert mean(hist.reward[-5:]) > mean(hist.reward[:5]) + 0.4
    again, policy_again = train_toy(GRPO(), device=cuda, fused_decode=True)
    assert again == hist and same_weights(policy, policy_again)  # compiled kernels are deterministic too


@pytest.mark.gpu
@pytest.mark.parametrize("minibatches", [1, 2])
def test_rlvr_with_a_captured_update_raises_the_reward_and_repeats_exactly(minibatches):
    cuda = torch.device("cuda")
    hist, policy = train_toy(GRPO(), device=cuda, minibatches=minibatches, captured_update=True, fused_decode=True)
    assert mean(hist.reward[-5:]) > mean(hist.reward[:5]) + 0.4
    again, policy_again = train_toy(GRPO(), device=cuda, minibatches=minibatches, captured_update=True,
                                    fused_decode=True)
    assert again == hist and same_weights(policy, policy_again)
    eager, _ = train_toy(GRPO(), device=cuda, minibatches=minibatches, fused_decode=True, iterations=1)
    assert eager.reward == hist.reward[:1] and eager.length == hist.length[:1]  # the first rollouts: no update yet


def test_the_captured_updates_rows_give_the_eager_rows_and_log_probs():
    """Rows laid out from the rollouts' tensors (where they are: on the device when captured), padded to the fixed
    width and read by a gather: round_rows' rows, and the log-probs round_rows + log_logprobs give."""
    model, ps = tiny(bksp_boost=2.0), prompts(6)
    cfg = dataclasses.replace(TOY, prompts_per_iteration=6, samples_per_prompt=2, max_new_tokens=14)
    out = run(model, ps, "keep", forced=FORCED, steps=14, n_samples=2)
    repeated = [p for p in ps for _ in range(2)]
    want_rows = round_rows(repeated, out.token_lists(), out.sampled_lists(), 14, bksp_id=BKSP, context="keep",
                           pad_id=0)
    W = want_rows.input_ids.shape[1]
    for banned in ((), (BKSP,)):
        update = CapturedUpdate(model, model, None, GRPO(), cfg, ps, banned, None, pad_id=0)
        rows = update.rows(torch.arange(6).repeat_interleave(2), out)
        assert rows["ids"].shape == rows["labels"].shape == (12, update.width) and update.width >= W
        assert torch.equal(rows["ids"][:, :W], want_rows.input_ids) and (rows["ids"][:, W:] == 0).all()
        assert torch.equal(rows["labels"][:, :W], want_rows.labels) and (rows["labels"][:, W:] == IGNORE).all()
        with torch.no_grad():
            got = update.logprobs(model, rows)
            want = log_logprobs(model, want_rows, banned)
        assert got.shape == want.shape == (12, 14)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def test_keep_rows_lay_out_prompts_and_logs_padded_past_their_lengths():
    """Row i: its prompt's first n_prompt[i] ids, its log's first n_log[i] tokens, then pads; labels on the sampled
    log tokens. Whatever the padded tensors hold past the lengths is never read."""
    prompts_ = torch.tensor([[1, 7, 9], [1, 8, 99]])  # 99: past row 1's prompt
    logs = torch.tensor([[5, 3, 6], [4, 98, 98]])  # 98: past row 1's log
    sampled = torch.tensor([[True, False, True], [True, True, True]])
    ids, labels = keep_rows(prompts_, torch.tensor([3, 2]), logs, torch.tensor([3, 1]), sampled, 7, pad_id=0)
    assert ids.tolist() == [[1, 7, 9, 5, 3, 6, 0], [1, 8, 4, 0, 0, 0, 0]]
    assert labels.tolist() == [[IGNORE] * 3 + [5, IGNORE, 6, IGNORE], [IGNORE, IGNORE, 4] + [IGNORE] * 4]


def test_a_captured_update_is_refused_on_the_cpu():
    with pytest.raises(ValueError, match="captured_update replays a CUDA graph"):
        train_toy(GRPO(), captured_update=True, iterations=1)


def test_fused_rollouts_are_refused_on_the_cpu():
    with pytest.raises(ValueError, match="fused=True"):
        train_toy(GRPO(), fused_decode=True, iterations=1)


# -- the recipe stage -----------------------------------------------------------------------------------------------
@pytest.mark.usefixtures("cache")
def test_a_tiny_rlvr_stage_trains_through_the_recipe_cache_and_keeps_its_round_history():
    stage = recipes.RLVR(n_prompts=16, config=RLVRConfig(prompts_per_iteration=4, samples_per_prompt=4, minibatches=2),
                         lam=3.0, bksp_cost=0.5)
    r = tiny_chain(stage, steps=3)
    assert "halluc_lab.stages.rlvr" in recipes.code_modules(r)  # its code is in the key
    first = recipes.load_recipe(r, CPU)
    assert first.trained_now and first.history.step == [1, 2, 3] and first.history.lr == [r.train.lr] * 3
    m = first.history.metrics
    assert set(m) == {f.name for f in dataclasses.fields(RLVRHistory)} and all(len(v) == 3 for v in m.values())
    assert first.history.loss == [-x for x in m["reward"]]
    assert all(-3.0 - 0.5 * n <= x <= 1 for x, n in zip(m["reward"], m["length"]))
    parent = recipes.load_recipe(r.parent, CPU).model
    assert not same_weights(first.model, parent)
    again = recipes.load_recipe(r, CPU)
    assert not again.trained_now and again.history == first.history and same_weights(again.model, first.model)
