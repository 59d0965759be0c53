"""halluc_lab.evaluation.extrapolation: chapter 5's chain-and-recall sequences and their reading."""

import math

import numpy as np
import pytest
import torch

from halluc_lab.device import setup
from halluc_lab.evaluation import extrapolation as ex
from halluc_lab.evaluation.stats import Interval
from halluc_lab.model.positional import RopeScaling
from halluc_lab.model.transformer import ModelConfig, Transformer
from halluc_lab.training.losses import IGNORE

WORLD = ex.ChainRecall()


def test_without_noise_the_chain_follows_the_look_back_exactly():
    world = ex.ChainRecall(noise=0.0)
    rng = np.random.default_rng(0)
    succ = world.successors(rng)
    assert succ.shape == (64, 4) and all(len(set(row)) == 4 for row in succ)
    walks = world.chain_walks(succ, 5, 40, rng)
    for t in range(world.lag, 40):
        assert (walks[:, t] == succ[walks[:, t - 1], walks[:, t - world.lag] % 4]).all()


def test_spaced_starts_are_sorted_inside_the_range_and_leave_room_for_a_value():
    starts = ex.spaced_starts(200, 6, 12, 40, np.random.default_rng(1))
    assert starts.min() >= 12 and starts.max() <= 40
    assert (np.diff(starts, axis=1) >= 2).all()
    with pytest.raises(ValueError, match="do not fit"):
        ex.spaced_starts(1, 10, 0, 15, np.random.default_rng(0))


@pytest.mark.parametrize("probe_distance", [None, 8, 50])
def test_sequences_bind_each_key_to_one_value_and_the_probe_appears_twice(probe_distance):
    rng = np.random.default_rng(2)
    rows = WORLD.sequences(WORLD.successors(rng), 6, 64, rng, probe_distance)
    assert WORLD.pairs_consistent(rows)
    assert rows.ids.shape == (6, 64) and rows.ids.max() < WORLD.vocab_size
    keys = (rows.ids >= WORLD.key0) & (rows.ids < WORLD.value0)
    assert not (
        rows.chain & (keys | keys.roll(1, 1))
    ).any()  # a planted pair is never a chain target
    batch = rows.batch()
    assert ((batch.labels != IGNORE) == (rows.chain | rows.recall)).all()
    if probe_distance is None:
        assert (rows.probe == -1).all()
    else:
        assert (rows.probe == 63).all() and (rows.distance == probe_distance).all()
        assert rows.recall[:, 63].all()  # the probe's value is recalled


def test_pairs_consistent_catches_a_key_bound_to_two_values():
    rng = np.random.default_rng(3)
    rows = WORLD.sequences(WORLD.successors(rng), 1, 64, rng, probe_distance=20)
    at = int(rows.probe[0]) - 1 - 20  # the probe key's first appearance
    rows.ids[0, at + 1] = WORLD.value0 + (rows.ids[0, at + 1] - WORLD.value0 + 1) % WORLD.n_values
    assert not WORLD.pairs_consistent(rows)


def test_a_probe_that_does_not_fit_is_refused():
    rng = np.random.default_rng(4)
    with pytest.raises(ValueError, match="does not fit"):
        WORLD.sequences(WORLD.successors(rng), 1, 32, rng, probe_distance=30)


def test_token_names_and_probe_distances():
    assert [WORLD.token_name(t) for t in (5, WORLD.key0 + 3, WORLD.value0 + 3 * 16 + 9)] == [
        "c5",
        "K3",
        "3:9",
    ]
    assert ex.probe_distances(2, 32, 12) == [8, 16, 29, 48]  # up to 2L − 2 − lag
    assert ex.probe_distances(8, 32, 12)[-1] == 224


def test_read_reports_the_chain_loss_by_position_and_probe_recall():
    rt = setup(scale="smoke", device="cpu", seed=0, verbose=False)
    L = 16
    model = Transformer(
        ModelConfig(
            vocab_size=WORLD.vocab_size, hidden_size=32, n_layers=1, n_heads=2, max_positions=64
        ),
        seed=0,
    ).eval()
    rng = np.random.default_rng(5)
    rows = WORLD.sequences(WORLD.successors(rng), 3, 48, rng, probe_distance=20)
    r = ex.read(model, rows, L, WORLD.lag, rt)
    with torch.no_grad():
        logits = model(rows.ids)
    expect = (
        logits[torch.arange(3), rows.probe - 1].argmax(-1) == rows.ids[torch.arange(3), rows.probe]
    )
    assert r.correct.tolist() == expect.tolist() and r.curve.shape == (47,)
    assert r.within.shape == r.beyond.shape == (3,) and np.isfinite(r.within).all()
    same = ex.with_scaling(model, None, rt)
    assert torch.equal(
        ex.read(same, rows, L, WORLD.lag, rt).curve.nan_to_num(), r.curve.nan_to_num()
    )
    scaled = ex.with_scaling(model, RopeScaling("linear", 4.0, original_max_positions=L), rt)
    assert scaled.config.rope_scaling.factor == 4.0 and not scaled.training


def _reading(within, correct, distance):
    return ex.Reading(
        torch.zeros(3),
        np.array(within, float),
        np.array(within, float) + 1.0,
        np.array(correct),
        np.array(distance),
    )


def test_intervals_over_seeds_and_rows():
    readings = {
        (s, "zero-shot", "PI", 2, 2): _reading([0.5, 1.0, 1.5], [True, False, True], [4, 20, 40])
        for s in (0, 1)
    }
    keep_far = lambda d: d >= 16  # noqa: E731
    rows = ex.per_row(readings, [0, 1], ("zero-shot", "PI", 2, 2), "correct", keep_far)
    assert rows.tolist() == [[0.0, 1.0], [0.0, 1.0]]
    ppl = ex.perplexity(readings, [0, 1], ("zero-shot", "PI", 2, 2), "within")
    assert ppl.estimate == pytest.approx(math.exp(1.0))
    assert ex.recall(readings, [0, 1], ("zero-shot", "PI", 2, 2), keep_far).estimate == 0.5
    assert (
        ex.moved(Interval(1, 0, 2), Interval(5, 3, 7)) == 1
        and ex.moved(Interval(1, 0, 2), Interval(1, 1, 3)) == 0
    )


def test_binned_perplexity_skips_positions_that_are_not_chain_steps():
    loss = torch.tensor([0.0, math.log(4.0), float("nan"), math.log(2.0), 0.0])
    out = ex.binned_ppl(loss, 2)
    assert (
        out[0] == pytest.approx(2.0)
        and out[1] == pytest.approx(2.0)
        and out[2] == pytest.approx(1.0)
    )


def test_run_seed_reads_every_method_zero_shot_and_fine_tuned():
    rt = setup(scale="smoke", device="cpu", seed=0, verbose=False)
    methods = ["no scaling", "PI", "YaRN"]

    def scaling(method, s):
        kind = {"no scaling": None, "PI": "linear", "YaRN": "yarn"}[method]
        return None if kind is None else RopeScaling(kind, s, original_max_positions=32)

    plan = ex.Plan(
        L=32,
        methods=methods,
        freq_only="YaRN freq",
        mults=(2, 4, 8),
        ft_mult=4,
        ft_factors=(4, 8),
        train_steps=2,
        finetune_steps=1,
        train_rows=2,
        finetune_rows=1,
        rows_per_distance=2,
    )
    config = ModelConfig(
        vocab_size=WORLD.vocab_size, hidden_size=16, n_layers=1, n_heads=2, max_positions=256
    )
    run = ex.run_seed(WORLD, config, 0, plan, scaling, rt)
    assert run.well_formed and run.n_eval == {
        m: 2 * len(ex.probe_distances(m, 32, 12)) for m in (2, 4, 8)
    }
    zero = {(m, meth) for (_, stage, meth, _, m) in run.readings if stage == "zero-shot"}
    assert zero == {(m, meth) for m in (2, 4, 8) for meth in methods + ["YaRN freq"]}
    tuned = {k for k in run.readings if k[1] == "fine-tuned"}
    assert tuned == {
        (0, "fine-tuned", meth, f, m) for meth in methods for f in (4, 8) for m in (4, 8)
    }
    assert (
        run.readings[(0, "fine-tuned", "no scaling", 8, 8)]
        is run.readings[(0, "fine-tuned", "no scaling", 4, 8)]
    )
    results = ex.intervals(
        run.readings, [0], plan, {"no scaling": "none", "PI": "pi", "YaRN": "yarn"}
    )
    assert "yarn_ft8_8L_recall_far" in results and len(results) == 3 * (3 + 4) * 4
