"""Preference pairs from the verifier, DPO with precomputed reference log-probs, RSFT, and their recipe stages."""

import copy
import dataclasses
import math
import os
import warnings

import pytest
import torch
from scipy import stats
from torch import nn

from halluc_lab import recipes
from halluc_lab.stages import preference
from halluc_lab.training import train as halluc_train
from halluc_lab.training.data import IGNORE, batches
from halluc_lab.evaluation.evaluate import score_answers
from halluc_lab.model.config import ModelConfig
from halluc_lab.stages.preference import (DPOLoss, PreferencePairs, SampleGroups, VerifierReward, best_of_n, build_pairs,
                                   pair_logps, precompute_reference_logps, rank_pairs, rsft_rows, sample_groups,
                                   soft_best_of_n)
from halluc_lab.tasks import Arithmetic, ArithmeticConfig, make_task
from halluc_lab.training.train import TrainConfig, train
from tests.unit._tiny_lm import small_transformer
from tests.unit.test_reward_model import BOS, PAD, V, separable_pairs

CPU = torch.device("cpu")


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


# -- the annotator: pairs ranked by the verifier, labels flipped at a rate ------------------------------------
def test_flip_rate_zero_gives_the_verifiers_ranking():
    rewards = [[1.0, -1.0, 0.0], [0.0, -1.0], [-1.0, 1.0]]
    pairs = rank_pairs(rewards, flip_rate=0.0, generator=gen(), pairs_per_prompt=3)
    assert all(rewards[g][hi] > rewards[g][lo] and not flipped for g, hi, lo, flipped in pairs)
    assert sorted((g, hi, lo) for g, hi, lo, _ in pairs) == [(0, 0, 1), (0, 0, 2), (0, 2, 1), (1, 0, 1), (2, 1, 0)]


def test_flip_rate_one_reverses_every_pair():
    pairs = rank_pairs([[1.0, -1.0, 0.0]] * 20, flip_rate=1.0, generator=gen())
    assert len(pairs) == 20 and all(flipped for *_, flipped in pairs)


def test_a_flip_rate_in_between_flips_that_share_in_expectation():
    n, rate = 4000, 0.3
    flips = [f for *_, f in rank_pairs([[1.0, 0.0]] * n, flip_rate=rate, generator=gen(1))]
    assert abs(sum(flips) / n - rate) < 4 * math.sqrt(rate * (1 - rate) / n)


def test_ties_are_dropped_and_identical_contents_count_once():
    assert rank_pairs([[1.0, 1.0, 1.0]], flip_rate=0.0, generator=gen(), pairs_per_prompt=5) == []
    keys = [[(5,), (5,), (6,)]]  # two samples wrote the same answer
    pairs = rank_pairs([[1.0, 1.0, -1.0]], keys, flip_rate=0.0, generator=gen(), pairs_per_prompt=5)
    assert [(hi, lo) for _, hi, lo, _ in pairs] == [(0, 2)]


def test_pairs_per_prompt_caps_the_pairs_and_the_draws_follow_the_generator():
    rewards = [[1.0, 0.0, -1.0, 0.5]] * 10
    a = rank_pairs(rewards, flip_rate=0.5, generator=gen(7), pairs_per_prompt=2)
    assert len(a) == 20 and a == rank_pairs(rewards, flip_rate=0.5, generator=gen(7), pairs_per_prompt=2)
    assert a != rank_pairs(rewards, flip_rate=0.5, generator=gen(8), pairs_per_prompt=2)


@pytest.mark.parametrize("rewards, kw, match", [
    ([[1.0], []], {}, r"rewards\[1\] is empty"),
    ([[1.0, float("nan")]], {}, "finite"),
    ([[1.0, 0.0]], {"flip_rate": 1.5}, "flip_rate"),
    ([[1.0, 0.0]], {"pairs_per_prompt": 0}, "pairs_per_prompt"),
])
def test_rank_pairs_rejects_empty_groups_non_finite_rewards_and_bad_settings(rewards, kw, match):
    with pytest.raises(ValueError, match=match):
        rank_pairs(rewards, generator=gen(), **{"flip_rate": 0.0, **kw})


def hand_groups():
    """Two prompts of three samples: rewards +1 / 0 / −1 and all ties."""
    return SampleGroups(prompts=((BOS, 5), (BOS, 6)), completions=(((7,), (4,), (8,)), ((9,), (9,), (9,))),
                        rewards=torch.tensor([[1.0, 0.0, -1.0], [-1.0, -1.0, -1.0]]), pad_id=PAD)


def test_build_pairs_labels_by_the_verifier_and_as_gold_undoes_the_flips():
    clean = build_pairs(hand_groups(), pairs_per_prompt=3)
    assert len(clean) == 3 and clean.gold == (True,) * 3  # the tied prompt gives none
    assert set(zip(clean.chosen, clean.rejected)) == {((7,), (4,)), ((7,), (8,)), ((4,), (8,))}
    noisy = build_pairs(hand_groups(), pairs_per_prompt=3, flip_rate=1.0)
    assert noisy.gold == (False,) * 3 and noisy.chosen == clean.rejected
    assert noisy.as_gold().chosen == clean.chosen and noisy.as_gold().gold == clean.gold
    with pytest.raises(ValueError, match="tie"):
        build_pairs(dataclasses.replace(hand_groups(), rewards=torch.zeros(2, 3)))


def test_sample_groups_scores_each_sample_with_the_verifier():
    task = Arithmetic(ArithmeticConfig(max_digits=1))
    tok = task.tokenizer()
    lm = small_transformer(tok.vocab_size)
    examples = task.examples("train", 5, seed=0)
    g = sample_groups(lm, tok, task, examples, n_samples=3, seed=0, lam=2.0)
    assert g.rewards.shape == (5, 3) and len(g.completions) == 5 and all(len(c) == 3 for c in g.completions)
    assert g.prompts[0] == (tok.bos_id, *tok.encode(examples[0].prompt))
    texts = [tok.decode(c) for cs in g.completions for c in cs]
    expected = score_answers(task, [e.prompt for e in examples for _ in range(3)], texts).rewards(2.0)
    assert g.rewards.flatten().tolist() == list(expected)
    again = sample_groups(lm, tok, task, examples, n_samples=3, seed=0, lam=2.0)
    assert again.completions == g.completions  # the seed decides the samples


# -- DPO ---------------------------------------------------------------------------------------------------------
class CountingModel(nn.Module):
    """A model wrapper that counts its forward passes."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.calls = inner, 0

    def forward(self, *args, **kwargs):
        self.calls += 1
        return self.inner(*args, **kwargs)


def separable_preference_pairs(n=12):
    prompts, chosen, rejected = separable_pairs(n)
    return PreferencePairs(tuple(map(tuple, prompts)), tuple(map(tuple, chosen)), tuple(map(tuple, rejected)),
                           (True,) * n, PAD)


def test_reference_logps_are_computed_once_and_dpo_training_raises_the_chosen_relative_to_the_rejected():
    policy = small_transformer(V)
    reference = CountingModel(copy.deepcopy(policy))
    pairs = precompute_reference_logps(reference, separable_preference_pairs(12), chunk=5)
    assert reference.calls == 3 and pairs.reference.shape == (12, 2)
    loss = DPOLoss(beta=0.5, reference=pairs.reference)
    total, count = loss(policy, pairs.rows())
    assert int(count) == 12 and total.item() == pytest.approx(12 * math.log(2), rel=1e-5)  # π = π_ref: log 2 a pair
    train(policy, batches(pairs.rows(), 4, seed=0), TrainConfig(steps=15, lr=3e-3, warmup_steps=1, log_every=5),
          loss=loss)
    assert reference.calls == 3  # the reference never ran during training
    with torch.no_grad():
        margin = pair_logps(policy, pairs.rows()) - pairs.reference  # (P, 2) log π − log π_ref
    assert (margin[:, 0] - margin[:, 1] > 0).float().mean() > 0.9  # chosen up relative to rejected


def test_dpo_loss_finds_each_rows_reference_by_its_pair_number():
    policy = small_transformer(V)
    pairs = precompute_reference_logps(policy, separable_preference_pairs(6))
    rows = pairs.rows()
    shuffled = rows[torch.tensor([4, 1, 5])]  # rows in any order, as batches() draws them
    ref = torch.randn(6, 2)  # a made-up reference: each row must pick its own
    total, _ = DPOLoss(0.3, ref)(policy, shuffled)
    with torch.no_grad():
        p = pair_logps(policy, shuffled)
    idx = [4, 1, 5]
    expected = torch.nn.functional.softplus(-0.3 * ((p[:, 0] - ref[idx, 0]) - (p[:, 1] - ref[idx, 1]))).sum()
    torch.testing.assert_close(total.detach(), expected)


def test_dpo_loss_rejects_a_missing_reference_and_a_bad_beta():
    with pytest.raises(ValueError, match="precompute_reference_logps"):
        DPOLoss(0.1, None)
    with pytest.raises(ValueError, match="beta"):
        DPOLoss(0.0, torch.zeros(3, 2))
    with pytest.raises(ValueError, match=r"shape \(12, 2\)"):
        dataclasses.replace(separable_preference_pairs(12), reference=torch.zeros(3, 2))


# -- RSFT ---------------------------------------------------------------------------------------------------------
def test_best_of_n_picks_the_highest_reward_and_the_first_of_ties():
    rewards = torch.tensor([[0.0, 1.0, -1.0], [1.0, 0.0, 1.0], [-1.0, -1.0, -1.0]])
    assert best_of_n(rewards).tolist() == [1, 0, 0]
    with pytest.raises(ValueError, match="non-empty"):
        best_of_n(torch.zeros(3))


def test_soft_selection_frequencies_match_softmax_of_reward_over_beta():
    rewards = torch.tensor([1.0, 0.0, -1.0, 0.5])
    beta = 0.7
    picks = soft_best_of_n(rewards.expand(20_000, 4), beta, gen(3))
    observed = torch.bincount(picks, minlength=4).double()
    expected = torch.softmax(rewards.double() / beta, 0) * 20_000
    assert stats.chisquare(observed.numpy(), expected.numpy()).pvalue > 1e-3
    cold = soft_best_of_n(rewards.expand(1000, 4), 1e-3, gen(4))
    assert (cold == 0).all()  # β → 0: the best of N


def test_soft_selection_rejects_a_bad_beta_and_non_finite_rewards():
    for beta in (0.0, -1.0, float("inf"), None):
        with pytest.raises(ValueError, match="beta"):
            soft_best_of_n(torch.zeros(2, 3), beta, gen())
    with pytest.raises(ValueError, match="finite"):
        soft_best_of_n(torch.tensor([[0.0, float("nan")]]), 1.0, gen())


def test_rsft_rows_train_on_the_picked_completions_and_drop_low_rewards():
    g = hand_groups()
    rows = rsft_rows(g, torch.tensor([0, 1]), seq_len=16)
    assert rows.input_ids.shape == (1, 16)  # both sequences packed in one row
    assert rows.input_ids[0, :6].tolist() == [BOS, 5, 7, BOS, 6, 9]
    assert rows.labels[0, :6].tolist() == [IGNORE, IGNORE, 7, IGNORE, IGNORE, 9]
    kept = rsft_rows(g, torch.tensor([0, 1]), seq_len=16, min_reward=0.0)  # the second pick scores −1
    assert kept.input_ids[0, :4].tolist() == [BOS, 5, 7, PAD]
    with pytest.raises(ValueError, match="min_reward"):
        rsft_rows(g, torch.tensor([2, 1]), seq_len=16, min_reward=0.0)
    with pytest.raises(ValueError, match="one index per prompt"):
        rsft_rows(g, torch.tensor([0]), seq_len=16)


def test_methods_learn_from_one_half_of_the_held_out_prompts_and_are_measured_on_the_other():
    task = make_task(ArithmeticConfig(max_digits=2))
    learn = preference.preference_examples(task, 300, seed=0)
    assert len(learn) == 300 and learn == preference.preference_examples(task, 300, seed=0)  # seeded
    assert all(task.split(*task._parse_prompt(e.prompt)) == "heldout" for e in learn)  # no SFT training prompt
    evaluated = preference.evaluation_examples(task, 100, seed=0)
    assert len({e.prompt for e in evaluated}) == len(evaluated) > 50  # distinct
    assert not {e.prompt for e in evaluated} & {e.prompt for e in preference.preference_examples(task, 3000, seed=5)}


# -- the verifier as a reward ---------------------------------------------------------------------------------
def test_the_verifier_reward_is_plus_one_zero_minus_lambda_on_token_ids():
    task = Arithmetic(ArithmeticConfig(max_digits=1))
    tok = task.tokenizer()
    ex = task.examples("train", 1, seed=0)[0]
    prompt = [tok.bos_id, *tok.encode(ex.prompt)]
    right, abstain = tok.encode(ex.completion) + [tok.eos_id], [tok.abstain_id, tok.eos_id]
    wrong = tok.encode("0" if ex.completion != "0" else "1") + [tok.eos_id]
    assert VerifierReward(task, tok, lam=3.0)([prompt] * 3, [right, abstain, wrong]) == [1.0, 0.0, -3.0]


# -- recipe stages ---------------------------------------------------------------------------------------------------
DPO, RSFT = preference.DPO, preference.RSFT


def tiny_chain(stage, steps=6, **train):
    """Pre-training, SFT, then ``stage`` on arithmetic, small enough to train in seconds."""
    task = ArithmeticConfig(max_digits=2, n_pretrain_documents=200, equations_per_document=3)
    model = ModelConfig(vocab_size=make_task(task).tokenizer().vocab_size, hidden_size=32, n_layers=1, n_heads=2,
                        max_positions=64)
    pre = recipes.Recipe("arithmetic-pretrain", "smoke", task, model,
                         TrainConfig(steps=30, lr=1e-2, warmup_steps=3, log_every=10), 8, 48, recipes.Pretraining())
    sft = recipes.Recipe("arithmetic-sft-clean", "smoke", task, model,
                         TrainConfig(steps=60, lr=1e-2, warmup_steps=2, log_every=10), 8, 48,
                         recipes.SFT(n_examples=200), parent=pre, seed=1)
    return recipes.Recipe(f"arithmetic-{type(stage).__name__.lower()}", "smoke", task, model,
                          TrainConfig(steps=steps, lr=1e-3, warmup_steps=1, log_every=2, **train), 4, 48, stage,
                          parent=sft, seed=2)


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    """One cache for the module's stage tests: the parent chain trains once (the stages' names differ)."""
    root = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HALLUC_CACHE", str(root))
        yield root


@pytest.fixture
def cache(shared_cache):
    return shared_cache


def same_weights(a, b):
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def test_a_tiny_dpo_stage_trains_through_the_recipe_cache_and_loads_afterwards(cache):
    r = tiny_chain(DPO(n_prompts=64, samples=8, beta=0.1))
    assert "halluc_lab.stages.preference" in recipes.code_modules(r)  # its code is in the key
    first = recipes.load_recipe(r, CPU)
    assert first.trained_now and len(first.history.loss) == 6
    assert first.history.loss[0] == pytest.approx(math.log(2), abs=1e-4)  # step 1: π = π_ref
    parent = recipes.load_recipe(r.parent, CPU).model
    assert not same_weights(first.model, parent)
    again = recipes.load_recipe(r, CPU)
    assert not again.trained_now and same_weights(again.model, first.model)
    with pytest.raises(ValueError, match="steps"):
        recipes.training_rows(r)  # its rows exist only once the starting model has sampled them
    with pytest.raises(ValueError, match="fewer than batch_size=10000: draw more prompts"):
        recipes.load_recipe(dataclasses.replace(r, name="arithmetic-dpo-big", batch_size=10_000), CPU)


class Killed(Exception):
    pass


def _kill_at(monkeypatch, name, step):
    real = halluc_train.train

    def spy(model, data, cfg, **kw):
        def watched(i):
            if kw["desc"] == name and i == step:
                raise Killed(f"killed at step {i + 1}")
            return data(i)
        return real(model, watched, cfg, **kw)

    monkeypatch.setattr(preference, "train", spy)


def test_a_killed_dpo_run_resumes_from_its_checkpoint_with_the_rows_of_the_starting_model(cache, monkeypatch):
    r = tiny_chain(DPO(n_prompts=64, samples=8, beta=0.1), checkpoint_every=2)
    whole = recipes.load_recipe(dataclasses.replace(r, name=r.name + "-uninterrupted"), CPU)
    _kill_at(monkeypatch, r.name, 4)  # dies in step 5, after the checkpoint of step 4
    with pytest.raises(Killed):
        recipes.load_recipe(r, CPU)
    assert os.path.isdir(os.path.join(recipes.directory(r), "checkpoints"))
    monkeypatch.setattr(preference, "train", halluc_train.train)
    with warnings.catch_warnings():
        warnings.simplefilter("error", recipes.CacheWarning)
        resumed = recipes.load_recipe(r, CPU)  # no state survives in the process: the rows are built again
    assert resumed.trained_now and same_weights(resumed.model, whole.model)
    assert not os.path.exists(os.path.join(recipes.directory(r), "checkpoints"))


@pytest.mark.parametrize("beta", [None, 0.5], ids=["best-of-n", "soft"])
def test_a_tiny_rsft_stage_trains_through_the_recipe_cache(cache, beta):
    r = tiny_chain(RSFT(n_prompts=32, samples=4, beta=beta))
    trained = recipes.load_recipe(r, CPU)
    assert trained.trained_now and len(trained.history.loss) == 6
    assert all(math.isfinite(x) for x in trained.history.loss)


def test_stage_settings_are_checked():
    with pytest.raises(ValueError, match="beta"):
        DPO(n_prompts=4, beta=0.0)
    with pytest.raises(ValueError, match="flip_rate"):
        DPO(n_prompts=4, flip_rate=2.0)
    with pytest.raises(ValueError, match="samples"):
        DPO(n_prompts=4, samples=1)
    with pytest.raises(ValueError, match="beta"):
        RSFT(n_prompts=4, beta=-1.0)
    with pytest.raises(ValueError, match="n_prompts"):
        RSFT(n_prompts=0)


@pytest.mark.gpu
def test_a_dpo_stage_trains_on_cuda_with_its_step_captured_and_twice_gives_the_same_weights(cache):
    cuda = torch.device("cuda")
    r = tiny_chain(DPO(n_prompts=64, samples=8, beta=0.1))
    first = recipes.load_recipe(r, cuda, torch.bfloat16)
    assert first.trained_now and next(first.model.parameters()).is_cuda
    assert first.history.loss[0] == pytest.approx(math.log(2), abs=0.02)  # bf16 policy against an fp32 reference
    assert all(math.isfinite(x) for x in first.history.loss)
    first_dir = recipes.directory(r, torch.bfloat16)
    again = recipes.load_recipe(dataclasses.replace(r, name=r.name + "-again"), cuda, torch.bfloat16)
    assert recipes.directory(again.recipe, torch.bfloat16) != first_dir and again.trained_now
    assert same_weights(again.model, first.model)  # deterministic kernels, a captured step: bit-identical


def test_own_error_sequences_direct_adds_the_clean_example_beside_each_take_back():
    from halluc_lab.stages.preference import OwnErrorsSFT, own_error_sequences
    from halluc_lab.tasks import Arithmetic
    from halluc_lab.tasks.base import Example

    task = Arithmetic()
    tok = task.tokenizer()
    ex = Example("1 + 1 =", "2 3")
    answers = [[tok.encode("2 4 <eos>"), tok.encode("2 3 <eos>")]]  # one wrong, one right
    plain = own_error_sequences(tok, [ex], answers)
    direct = own_error_sequences(tok, [ex], answers, direct=True)
    control = own_error_sequences(tok, [ex], answers, take_back=False)
    decode = [tok.decode(s.ids) for s in direct]
    assert decode == ["<bos> 1 + 1 = 2 4 <bksp> 3 <eos>", "<bos> 1 + 1 = 2 3 <eos>",
                      "<bos> 1 + 1 = 2 3 <eos>"]
    assert len(plain) == 2 and len(control) == 2
    # the gold "3" after "2" is a direct target in the control and (only) with direct=True
    three = tok.encode("3")[0]
    def direct_target(seqs):
        return any(s.labels[i] == three and s.ids[i - 1] == tok.encode("2")[0]
                   for s in seqs for i in range(1, len(s.ids)))
    assert direct_target(control) and direct_target(direct) and not direct_target(plain[:1])
    with pytest.raises(ValueError, match="take_back must be True"):
        own_error_sequences(tok, [ex], answers, take_back=False, direct=True)
    with pytest.raises(ValueError, match="take_back must be True"):
        OwnErrorsSFT(4, take_back=False, direct=True)
    with pytest.raises(TypeError, match="direct must be a bool"):
        OwnErrorsSFT(4, direct=1)
