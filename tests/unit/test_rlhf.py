"""PPO with a KL penalty (eager on the CPU; on CUDA its scoring and update replayed as graphs, checked against
the eager run bit for bit), RLHF's reward model, and the PPO recipe stage."""

import copy
import dataclasses
import math

import pytest
import torch

from halluc_lab import recipes
from halluc_lab.device import deterministic
from halluc_lab.stages.preference_data import sample_groups
from halluc_lab.stages.reward_model import RewardModel, pair_accuracy
from halluc_lab.stages.rlhf import PPO, PPOConfig, PPOHistory, RewardModelPlan, fit_reward_model, ppo
from tests.unit._tiny_lm import small_transformer
from tests.unit.test_preference import cache, same_weights, shared_cache, tiny_chain  # noqa: F401 (fixtures)
from tests.unit.test_reward_model import BOS, GOOD, PAD, V

CPU = torch.device("cpu")
PROMPTS = [[BOS, 5], [BOS, 6], [BOS, 7], [BOS, 8]]
CFG = PPOConfig(iterations=6, prompts_per_iteration=4, samples_per_prompt=8, max_new_tokens=4, epochs=2,
                minibatches=2, lr=1e-2, value_lr=1e-2, kl_coef=0.01)


def share_of_good(prompts, completions):
    """A trivially learnable reward: the share of GOOD tokens in the completion."""
    return [sum(t == GOOD for t in c) / len(c) for c in completions]


def run(device, **kw) -> tuple[PPOHistory, torch.nn.Module]:
    policy = small_transformer(V, seed=1).to(device).train()
    with deterministic():
        hist = ppo(policy, copy.deepcopy(policy).eval(), RewardModel.from_lm(policy, seed=0), PROMPTS, share_of_good,
                   CFG, pad_id=PAD, seed=0, **kw)
    return hist, policy


def test_a_few_ppo_rounds_raise_the_reward_of_a_trivially_learnable_task():
    hist, _ = run(CPU)
    assert len(hist.reward) == 6
    assert sum(hist.reward[-2:]) / 2 > sum(hist.reward[:2]) / 2 + 0.3
    assert hist.kl_k1[0] == 0 and hist.kl_k3[-1] > 0  # round 1 samples from π_ref itself
    assert all(0 <= c <= 1 for c in hist.clip_fraction) and hist.gold == []


def test_a_watched_gold_reward_is_recorded_and_not_optimised():
    bad = lambda prompts, completions: [-x for x in share_of_good(prompts, completions)]
    hist, _ = run(CPU, gold=bad)
    assert hist.gold == pytest.approx([-r for r in hist.reward])  # the same answers, judged by the watcher
    assert hist.gold[-1] < hist.gold[0]  # PPO pushed the optimised reward up, so the watched one down


def test_ppo_rejects_bad_settings_and_a_shared_reference():
    for bad in ({"clip": 0.0}, {"iterations": 0}, {"gamma": 1.5}, {"kl_coef": -0.1}, {"lr": float("nan")}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            PPOConfig(**bad)
    with pytest.raises(ValueError, match="split into minibatches=3 equal ones"):
        PPOConfig(prompts_per_iteration=4, samples_per_prompt=4, minibatches=3)
    policy = small_transformer(V)
    with pytest.raises(ValueError, match="own"):
        ppo(policy, policy, RewardModel.from_lm(policy), [[BOS]], lambda p, c: [0.0] * len(c), PPOConfig(),
            pad_id=PAD, seed=0)
    with pytest.raises(ValueError, match="one finite number per completion"):
        ppo(policy, copy.deepcopy(policy), RewardModel.from_lm(policy), PROMPTS, lambda p, c: [math.nan] * len(c),
            CFG, pad_id=PAD, seed=0)
    with pytest.raises(TypeError, match="value 0 is str '0.5'"):
        ppo(policy, copy.deepcopy(policy), RewardModel.from_lm(policy), PROMPTS,
            lambda p, c: ["0.5"] * len(c), CFG, pad_id=PAD, seed=0)
    with pytest.raises(ValueError, match="cuda_graph=True needs the models on a CUDA device"):
        ppo(policy, copy.deepcopy(policy), RewardModel.from_lm(policy), PROMPTS, share_of_good, CFG, pad_id=PAD,
            seed=0, cuda_graph=True)


@pytest.mark.usefixtures("cache")
def test_the_reward_model_of_rlhf_learns_the_verifiers_ranking():
    sft = recipes.load_recipe(tiny_chain(RLHF_STAGE).parent, CPU)
    ex = sft.task.examples("heldout", 64, seed=3)
    groups = sample_groups(sft.model, sft.tokenizer, sft.task, ex, 4, seed=0)
    plan = RewardModelPlan(flip_rate=0.0, samples=4, steps=40, lr=3e-3, batch_size=16)
    rm, pairs = fit_reward_model(sft.model, groups, plan, seed=0)
    again, _ = fit_reward_model(sft.model, groups, plan, seed=0)
    assert same_weights(rm, again)  # deterministic: a notebook refits exactly the stage's reward model
    assert pair_accuracy(rm, pairs.rows()) > 0.7
    with pytest.raises(ValueError, match="samples"):
        RewardModelPlan(samples=1)


# -- the recipe stage ------------------------------------------------------------------------------------------------
ROUNDS = PPOConfig(prompts_per_iteration=8, samples_per_prompt=4, kl_coef=0.1, value_lr=1e-3)
RLHF_STAGE = PPO(n_prompts=64, config=ROUNDS, reward_model=RewardModelPlan(samples=4, steps=20, lr=1e-3, batch_size=8))


@pytest.mark.parametrize("stage", [PPO(n_prompts=64, config=ROUNDS), RLHF_STAGE], ids=["verifier", "rlhf"])
@pytest.mark.usefixtures("cache")
def test_a_tiny_ppo_stage_trains_through_the_recipe_cache_and_keeps_its_round_history(stage):
    r = tiny_chain(stage, steps=4)
    assert "halluc_lab.stages.rlhf" in recipes.code_modules(r)  # its code is in the key
    first = recipes.load_recipe(r, CPU)
    assert first.trained_now and first.history.step == [1, 2, 3, 4]
    m = first.history.metrics
    assert set(m) == {f.name for f in dataclasses.fields(PPOHistory)} and all(len(v) == 4 for v in m.values())
    assert first.history.loss == pytest.approx([0.1 * k - r for r, k in zip(m["reward"], m["kl_k1"])])
    parent = recipes.load_recipe(r.parent, CPU).model
    if stage.reward_model is None:
        assert m["gold"] == m["reward"]  # the verifier is both what is optimised and what is watched
        with pytest.raises(ValueError, match="fits no reward model"):
            stage.reward_model_of(r, parent, None)
    else:  # a notebook refits the stage's reward model: the same samples, deterministic, the same bits
        rm, pairs = stage.reward_model_of(r, parent, None)
        assert len(pairs) > 0 and not same_weights(rm, RewardModel.from_lm(parent, seed=r.seed))
        assert same_weights(rm, stage.reward_model_of(r, parent, None)[0])
    assert not same_weights(first.model, parent)
    again = recipes.load_recipe(r, CPU)
    assert not again.trained_now and again.history == first.history and same_weights(again.model, first.model)
    with pytest.raises(ValueError, match="no rows"):
        recipes.training_rows(r)


def test_the_registry_has_ppo_and_rlhf_stages_from_clean_sft():
    for name in ("kb_walk-ppo", "kb_walk-rlhf", "arithmetic-ppo"):
        r = recipes.get(name, "full")
        assert isinstance(r.stage, recipes.PPO) and r.parent.name.endswith("sft-clean")
        assert r.stage.n_prompts == recipes.get(name.replace("rlhf", "dpo").replace("ppo", "dpo"), "full").stage.n_prompts
    assert recipes.get("kb_walk-rlhf", "smoke").stage.reward_model is not None
    assert recipes.get("kb_walk-ppo", "smoke").stage.reward_model is None
    with pytest.raises(TypeError, match="PPOConfig"):
        PPO(n_prompts=4, config={"kl_coef": 0.1})


# -- CUDA: the graphs replay what the eager code computes ---------------------------------------------------------
@pytest.mark.gpu
def test_ppo_on_cuda_replays_graphs_that_match_the_eager_run_bit_for_bit_and_repeat_exactly():
    cuda = torch.device("cuda")
    graphed, policy_g = run(cuda)
    again, policy_a = run(cuda)
    eager, policy_e = run(cuda, cuda_graph=False)
    assert sum(graphed.reward[-2:]) / 2 > sum(graphed.reward[:2]) / 2 + 0.3
    assert graphed == again and same_weights(policy_g, policy_a)  # every recorded number, bit for bit
    assert graphed == eager and same_weights(policy_g, policy_e)
    bf16, _ = run(cuda, autocast_dtype=torch.bfloat16)
    assert all(math.isfinite(x) for x in bf16.kl_k3 + bf16.value_loss)


@pytest.mark.gpu
@pytest.mark.usefixtures("cache")
def test_a_ppo_stage_trains_on_cuda_and_twice_gives_the_same_weights():
    cuda = torch.device("cuda")
    r = tiny_chain(RLHF_STAGE, steps=3)
    first = recipes.load_recipe(r, cuda, torch.bfloat16)
    again = recipes.load_recipe(dataclasses.replace(r, name=r.name + "-again"), cuda, torch.bfloat16)
    assert first.trained_now and again.trained_now and same_weights(again.model, first.model)
    assert first.history.metrics == again.history.metrics
