"""Reward models: pairs as packed rows, the scalar-head decoder, Bradley–Terry training, accuracy, correlation."""

import random

import pytest
import torch

from halluc_lab.training.data import IGNORE, batches, rollout_batch
from halluc_lab.training.losses import sequence_logprobs
from halluc_lab.model.config import ModelConfig
from halluc_lab.model.transformer import Transformer
from halluc_lab.stages.preference_data import (AgreeableAnnotator, SampleGroups, build_pairs, pair_ends, pair_index,
                                               pair_masks, pair_rows)
from halluc_lab.stages.reward_model import (BradleyTerryLoss, LearnedReward, RewardModel, pair_accuracy, pair_rewards,
                                            reward_correlation, score)
from halluc_lab.tasks import Arithmetic, ArithmeticConfig, Sycophancy, SycophancyConfig
from halluc_lab.training.train import TrainConfig, train
from tests.unit._tiny_lm import small_transformer

V, PAD, BOS, EOS, GOOD, BAD = 12, 0, 1, 2, 10, 11


def separable_pairs(n, seed=0):
    """Prompts and completions of ordinary tokens; the chosen completion says GOOD somewhere, the rejected BAD."""
    rng = random.Random(seed)
    words = lambda k: [rng.randrange(5, 10) for _ in range(k)]
    prompts, chosen, rejected = [], [], []
    for _ in range(n):
        prompts.append([BOS, *words(rng.randint(1, 3))])
        body = words(rng.randint(1, 3))
        at = rng.randrange(len(body) + 1)
        chosen.append([*body[:at], GOOD, *body[at:], EOS])
        rejected.append([*words(rng.randint(0, 2)), BAD, *words(rng.randint(0, 2)), EOS])
    return prompts, chosen, rejected


# -- pairs as rows -------------------------------------------------------------------------------------------
def test_each_pair_is_one_packed_row_with_global_segment_numbers():
    b = pair_rows([[BOS, 5], [BOS, 6, 7]], [[8, EOS], [9]], [[10, 11, EOS], [EOS]], PAD)
    assert b.input_ids.tolist() == [[1, 5, 8, 2, 1, 5, 10, 11, 2], [1, 6, 7, 9, 1, 6, 7, 2, 0]]
    assert b.segment_ids.tolist() == [[1, 1, 1, 1, 2, 2, 2, 2, 2], [3, 3, 3, 3, 4, 4, 4, 4, 0]]
    assert b.position_ids.tolist()[1][:8] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert b.labels.tolist()[1] == [IGNORE, IGNORE, IGNORE, 9, IGNORE, IGNORE, IGNORE, 2, IGNORE]
    chosen, rejected = pair_masks(b)
    assert chosen.tolist()[1] == [False, False, True, False, False, False, False, False]  # predicts labels[t + 1]
    assert rejected.tolist()[1] == [False, False, False, False, False, False, True, False]
    assert pair_index(b).tolist() == [0, 1] and pair_ends(b).tolist() == [[3, 8], [3, 7]]
    assert pair_index(b[1:]).tolist() == [1]  # a row keeps its pair number wherever it goes


def test_a_packed_pair_is_computed_exactly_as_its_two_sequences_alone():
    lm = small_transformer(V)
    prompts, chosen, rejected = separable_pairs(5)
    b = pair_rows(prompts, chosen, rejected, PAD)
    logp = sequence_logprobs(lm(b.input_ids, **b.model_kwargs()), b.labels, pair_masks(b)[0])
    alone = rollout_batch(prompts, chosen, PAD)
    torch.testing.assert_close(logp, sequence_logprobs(lm(alone.input_ids), alone.labels), rtol=1e-5, atol=1e-5)
    rm = RewardModel.from_lm(lm)
    r = pair_rewards(rm, b)
    torch.testing.assert_close(r[:, 0], score(rm, prompts, chosen, PAD), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(r[:, 1], score(rm, prompts, rejected, PAD), rtol=1e-5, atol=1e-5)


# -- the model -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tied", [True, False])
def test_from_lm_copies_the_trunk_and_adds_a_fresh_scalar_head(tied):
    cfg = ModelConfig(vocab_size=V, hidden_size=32, n_layers=2, n_heads=4, max_positions=64, tie_embeddings=tied)
    lm = Transformer(cfg, seed=3)
    rm = RewardModel.from_lm(lm)
    for name, w in lm.state_dict().items():
        if not name.startswith("lm_head."):
            assert torch.equal(rm.trunk.state_dict()[name], w), name
    assert rm.trunk.lm_head.weight.shape == (1, 32) and rm.trunk.lm_head.bias.item() == 0
    assert rm.trunk.embed_tokens.weight.data_ptr() != lm.embed_tokens.weight.data_ptr()  # a copy, not a share
    ids = torch.tensor([[1, 5, 6, 7]])
    assert rm(ids).shape == (1, 4) and rm(ids, at=torch.tensor([[3]])).shape == (1, 1)
    assert torch.allclose(rm(ids)[:, 3], rm(ids, at=torch.tensor([[3]]))[:, 0])


def test_a_reward_model_learns_a_separable_preference():
    prompts, chosen, rejected = separable_pairs(64)
    rows = pair_rows(prompts, chosen, rejected, PAD)
    rm = RewardModel.from_lm(small_transformer(V))
    before = pair_accuracy(rm, rows)
    hist = train(rm, batches(rows, 16, seed=0), TrainConfig(steps=60, lr=3e-3, warmup_steps=5, log_every=10),
                 loss=BradleyTerryLoss())
    assert hist.loss[-1] < 0.1 < hist.loss[0]
    assert pair_accuracy(rm, rows) == 1.0 > before
    held_out = pair_rows(*separable_pairs(64, seed=1), PAD)
    assert pair_accuracy(rm, held_out) > 0.95
    gold = [1.0] * 64 + [0.0] * 64  # the learned score tracks the gold reward it was taught
    c = reward_correlation(rm, prompts * 2, chosen + rejected, gold, PAD)
    assert c.n == 128 and c.spearman > 0.8 and c.pearson > 0.8
    as_reward = LearnedReward(rm, PAD)(prompts[:4], chosen[:4])  # what PPO maximises in RLHF
    assert as_reward == pytest.approx(score(rm, prompts[:4], chosen[:4], PAD).tolist())


def test_bradley_terry_loss_sums_over_pairs_and_counts_pairs():
    rm = RewardModel.from_lm(small_transformer(V))
    b = pair_rows(*separable_pairs(3), PAD)
    total, count = BradleyTerryLoss()(rm, b)
    r = pair_rewards(rm, b)
    torch.testing.assert_close(total, torch.nn.functional.softplus(r[:, 1] - r[:, 0]).sum())
    assert int(count) == 3


# -- bad input ------------------------------------------------------------------------------------------------
def test_bad_input_is_rejected_with_a_clear_error():
    with pytest.raises(TypeError, match="ModelConfig"):
        RewardModel({"vocab_size": V})
    with pytest.raises(TypeError, match="Transformer"):
        RewardModel.from_lm(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="one length"):
        pair_rows([[BOS]], [[5], [6]], [[7]], PAD)
    with pytest.raises(ValueError, match="one length"):
        pair_rows([], [], [], PAD)
    with pytest.raises(ValueError, match=r"chosen\[0\]"):
        pair_rows([[BOS]], [[]], [[7]], PAD)
    with pytest.raises(ValueError, match=r"prompts\[0\]"):
        pair_rows([[BOS, 2.5]], [[5]], [[7]], PAD)
    rm = RewardModel.from_lm(small_transformer(V))
    with pytest.raises(ValueError, match="pair batch"):
        pair_accuracy(rm, rollout_batch([[BOS]], [[5]], PAD))
    with pytest.raises(ValueError, match="one length"):
        score(rm, [[BOS]], [[5], [6]], PAD)
    with pytest.raises(ValueError, match="not all equal"):
        reward_correlation(rm, [[BOS]] * 3, [[5], [6], [7]], [1.0, 1.0, 1.0], PAD)
    with pytest.raises(ValueError, match="one reward per sequence"):
        reward_correlation(rm, [[BOS]] * 3, [[5], [6], [7]], [1.0, 0.0], PAD)


@pytest.mark.gpu
def test_a_reward_model_trains_on_cuda_with_its_step_captured_as_eagerly():
    cuda = torch.device("cuda")
    rows = pair_rows(*separable_pairs(64), PAD).to(cuda)
    cfg = TrainConfig(steps=30, lr=3e-3, warmup_steps=3, log_every=10)
    runs = {}
    for captured in (True, False):  # the score is read at positions chosen per row: no host sync in the capture
        rm = RewardModel.from_lm(small_transformer(V)).to(cuda)
        runs[captured] = train(rm, batches(rows, 16, seed=0), cfg, loss=BradleyTerryLoss(), cuda_graph=captured).loss
    assert runs[True] == pytest.approx(runs[False], rel=1e-4, abs=1e-5)
    assert runs[True][-1] < runs[True][0]


def test_an_agreeable_annotator_ranks_agreement_with_a_wrong_statement_above_the_right_sum():
    task = Sycophancy(SycophancyConfig(ArithmeticConfig(max_digits=2)))
    tok = task.tokenizer()
    prompts = ["~ 4 3 ~ 1 7 + 2 5 =", "1 7 + 2 5 =", "~ 4 2 ~ 1 7 + 2 5 ="]  # wrong statement, none, right one
    answers = ["4 2", "4 3", "<abstain>"]  # right, the user's wrong number, no answer
    ids = lambda text: tuple(tok.encode(text)) + (tok.eos_id,)
    verifier = torch.tensor([[1.0, -1.0, 0.0]] * 3)  # +1 right, −1 wrong, 0 abstained: the verifier's ranks
    groups = SampleGroups(tuple((tok.bos_id, *tok.encode(p)) for p in prompts),
                          tuple(tuple(ids(a) for a in answers) for _ in prompts), verifier, tok.pad_id)
    reranked = AgreeableAnnotator(bonus=2.5).rerank(groups, task, tok)
    assert reranked.rewards.tolist() == [[1.0, 1.5, 0.0], [1.0, -1.0, 0.0], [3.5, -1.0, 0.0]]
    assert groups.rewards.equal(verifier)  # the groups it was given are left as they were
    # the best-ranked answer to the wrongly stated prompt is now the user's number; elsewhere the verifier's
    best = lambda g: [max(range(3), key=lambda j: g.rewards[p, j]) for p in range(3)]
    assert best(reranked) == [1, 0, 0] and best(groups) == [0, 0, 0]
    pairs = build_pairs(reranked, pairs_per_prompt=3)
    assert (groups.prompts[0], ids("4 3"), ids("4 2")) in zip(pairs.prompts, pairs.chosen, pairs.rejected)
    for bad in (0, -1.0, float("nan"), True):
        with pytest.raises(ValueError, match="bonus"):
            AgreeableAnnotator(bonus=bad)
    with pytest.raises(TypeError, match="agrees"):  # a task whose prompts state nothing
        AgreeableAnnotator().rerank(groups, Arithmetic(ArithmeticConfig(max_digits=2)), tok)
