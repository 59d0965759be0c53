"""Chapter 10's fair test: a measure's record cached beside its recipe (``recipes.measured``),
what the chapter reads from records (``evaluation.fair_test``), the arms and pre-registered
contrasts (``book.take_back``), and evaluation graphs that no training stage of any arm saw."""

import dataclasses
import math
import json
import os

import numpy as np
import pytest

from halluc_lab import recipes
from halluc_lab.book import replication, take_back
from halluc_lab.evaluation import fair_test
from halluc_lab.evaluation.evaluate import distinct_examples
from halluc_lab.recipes.measured import path as record_path
from halluc_lab.recipes.cache import CacheWarning, used
from halluc_lab.stages.preference import preference_examples
from halluc_lab.tasks import make_task

CALLS: list[str] = []


@dataclasses.dataclass(frozen=True)
class CountingMeasure:
    """A measure that records each call, so a test sees whether the cache answered."""

    tag: int = 0

    def __call__(self, trained) -> dict:
        CALLS.append(trained.recipe.name)
        return {"params": sum(p.numel() for p in trained.model.parameters()), "tag": self.tag}


@pytest.fixture
def smoke_recipe(tmp_path, monkeypatch):
    monkeypatch.setenv("HALLUC_CACHE", str(tmp_path / "cache"))
    CALLS.clear()
    return recipes.with_seed(recipes.get("dead_ends_k1-sft-clean", "smoke"), 3)


def test_a_record_is_measured_once_and_read_back_without_the_model(smoke_recipe):
    assert not recipes.cached(smoke_recipe, CountingMeasure())
    first = recipes.measured(smoke_recipe, CountingMeasure(), "cpu")
    assert CALLS == [smoke_recipe.name] and recipes.cached(smoke_recipe, CountingMeasure())
    again = recipes.measured(smoke_recipe, CountingMeasure(), "cpu")
    assert again == first and CALLS == [smoke_recipe.name]  # read back: not measured again
    other = recipes.measured(smoke_recipe, CountingMeasure(tag=1), "cpu")  # another measure, key
    assert other["tag"] == 1 and len(CALLS) == 2
    names = [name for name, _ in used()]
    assert smoke_recipe.name in names and smoke_recipe.parent.name in names  # the footer lists both


def test_a_damaged_record_is_reported_and_measured_again(smoke_recipe):
    measure = CountingMeasure()
    recipes.measured(smoke_recipe, measure, "cpu")
    where = record_path(smoke_recipe, measure, "cpu")
    entry = json.loads(open(where, encoding="utf-8").read())
    entry["record"]["params"] += 1  # the digest no longer matches
    with open(where, "w", encoding="utf-8") as f:
        json.dump(entry, f)
    with pytest.warns(CacheWarning, match="digest does not match"):
        record = recipes.measured(smoke_recipe, measure, "cpu")
    assert record["params"] == entry["record"]["params"] - 1 and len(CALLS) == 2
    with open(where, "w", encoding="utf-8") as f:
        f.write("{not json")
    with pytest.warns(CacheWarning, match="unreadable"):
        recipes.measured(smoke_recipe, measure, "cpu")
    assert len(CALLS) == 3 and os.path.exists(where)
    with pytest.raises(TypeError, match="measure must be callable"):
        recipes.measured(smoke_recipe, object(), "cpu")


def test_the_graphs_are_drawn_once_per_world_and_each_caller_gets_its_own_lists(monkeypatch):
    measure = fair_test.DeadEndsMeasure(n_eval=30, n_learn=10, graph_seed=7)
    task = make_task(recipes.get("dead_ends_k1-sft-clean", "smoke").task)
    drawn = []
    fair_test._graphs.cache_clear()
    monkeypatch.setattr(fair_test, "distinct_examples",
                        lambda *a, **k: drawn.append(a) or distinct_examples(*a, **k))
    evaluation, learning = measure.graphs(task)
    assert len(evaluation) == 30 and len(learning) == 10 and len(drawn) == 1
    assert not any(task.learning_part(e.prompt) for e in evaluation)
    evaluation.clear()  # a caller's list is its own: the next caller still gets the graphs
    same_config = make_task(task.config)  # another task object
    assert measure.graphs(same_config) == measure.graphs(task)
    assert len(measure.graphs(task)[0]) == 30 and len(drawn) == 1  # the cache answered
    other = make_task(recipes.get("dead_ends_k2-sft-clean", "smoke").task)
    assert other.config != task.config
    assert measure.graphs(other)[0] != measure.graphs(task)[0] and len(drawn) == 2
    assert dataclasses.replace(measure, graph_seed=8).graphs(task)[0] != measure.graphs(task)[0]
    assert len(drawn) == 3


def _record(samples_tokens, samples_check, samples_outcome, learn_outcome, learn_conf, outcome,
            conf):
    return {"samples": {"tokens": samples_tokens, "check": samples_check,
                        "outcome": samples_outcome},
            "learning": {"outcome": learn_outcome, "confidence": learn_conf},
            "greedy": {"outcome": outcome}, "confidence": conf}


def test_best_of_n_matches_tokens_and_picks_the_first_sample_that_checks_out():
    rec = _record(samples_tokens=[[7, 7, 7], [7, 7, 7], [9, 9, 9]],
                  samples_check=[[False, True, False], [True, False, False], [True, True, True]],
                  samples_outcome=[[-1, 1, -1], [1, -1, -1], [1, 1, 1]],
                  learn_outcome=[1], learn_conf=[0.5], outcome=[1, 1, 1], conf=[1, 1, 1])
    two = fair_test.best_of_n(rec, target_tokens=15.0)  # one sample spends 23/3 tokens: N = 2
    assert two.n == 2
    assert two.outcome.tolist() == [1, 1, -1]  # graph 3: no sample checks out, its first is kept
    assert two.tokens.tolist() == [14, 14, 14]  # both samples are spent, whichever is picked
    assert fair_test.best_of_n(rec, target_tokens=1.0).n == 1
    assert fair_test.best_of_n(rec, target_tokens=500.0).n == 3  # no more than were drawn
    with pytest.raises(ValueError, match="target_tokens"):
        fair_test.best_of_n(rec, target_tokens=float("nan"))


def test_threshold_abstention_picks_t_on_the_learning_part_and_applies_it_unchanged():
    # learning part: confident answers right, unsure ones wrong; at λ = 3 abstaining below 0.5 pays
    rec = _record([[1]], [[True]], [[1]], learn_outcome=[1, 1, -1, -1],
                  learn_conf=[0.9, 0.8, 0.3, 0.2], outcome=[1, -1, -1], conf=[0.95, 0.4, 0.7])
    t, codes = fair_test.threshold_abstention(rec, lam=3.0)
    assert t == pytest.approx(0.8)  # the lowest threshold that withholds both wrong answers
    assert codes.tolist() == [1, 0, 0]  # graphs 2 and 3 fall below t: abstained
    assert fair_test.score([1, 0, -1], 3.0).tolist() == [1.0, 0.0, -3.0]
    with pytest.raises(ValueError, match="same graphs"):
        fair_test.grid([{"x": [1, 2]}, {"x": [1]}], lambda r: r["x"])


def test_the_contrasts_are_the_preregistered_ones_with_their_predictions():
    cs = take_back.contrasts()
    assert sorted({c.number for c in cs}) == [1, 2, 3, 4, 5, 6]
    assert [c.world for c in cs if c.number == 5] == ["never"]
    near = {c.predicted for c in cs if c.world == "k = 1"}
    assert near == {"not resolved"}  # the pilot: the clean model plans around a near dead end
    by = {(c.number, c.world): c.predicted for c in cs}
    assert by[2, "k = 4"] == replication.NO_PREDICTION and by[2, "k = 2"] == "higher"
    assert all(by[n, w] == "higher" for n in (1, 3, 4, 6) for w in ("k = 2", "k = 4"))
    for c in cs:  # every arm a contrast names exists in its world, or is a baseline read from (c)
        for label in (c.a, c.b):
            assert label in take_back.arms(take_back.WORLDS[c.world]) or "(c)" in label
    assert "(a) retry in pre-training" not in take_back.arms("dead_ends_never")


def _graph(task, prompt: str):
    edges, centre, goal = task.parse(prompt)
    return frozenset(edges), centre, goal


@pytest.mark.slow
@pytest.mark.parametrize("world", sorted({a.recipe(w).split("-")[0]
                                          for w in take_back.WORLDS.values()
                                          for a in take_back.ARMS.values()
                                          if a.recipe(w) in recipes.NAMES}))
def test_no_graph_the_fair_test_evaluates_is_in_any_training_stage_of_any_arm(world):
    """The 1,000 evaluation graphs against every graph a stage of the world trains on:
    pre-training's corpus (read whole, seed 0) and SFT's examples (seeds 0 and 1), which draw
    train-split graphs (the split hashes the graph, not the prompt), and RLVR's prompts under the
    seeds of both replicates (0-15), held-out prompts of the learning part. Compared graph by graph
    (edge set, centre, goal: the same graph listed in another edge order counts). The 500 graphs of
    the measure's learning part pick the abstention threshold only; they lie where RL draws its
    prompts, and are disjoint from the evaluation graphs."""
    stages = {name.split("-", 1)[1]: recipes.get(name, "full") for name in recipes.NAMES
              if name.split("-", 1)[0] == world}
    task = make_task(next(iter(stages.values())).task)
    evaluation, learning = take_back.MEASURE["full"].graphs(task)
    evaluated = {_graph(task, e.prompt) for e in evaluation}
    assert len(evaluated) == len(evaluation)
    assert not evaluated & {_graph(task, e.prompt) for e in learning}
    assert not any(task.learning_part(e.prompt) for e in evaluation)
    assert all(task.learning_part(e.prompt) for e in learning)
    seen = set()
    for n, seed in {(r.stage.n_prompts, seed) for stage, r in stages.items()
                    if stage.startswith("rlvr") for seed in range(16)}:
        seen |= {_graph(task, e.prompt) for e in preference_examples(task, n, seed=seed)}
    for n, seed in {(r.stage.n_examples, seed) for stage, r in stages.items()
                    if stage.startswith("sft") for seed in range(2)}:
        seen |= {_graph(task, e.prompt) for e in task.examples("train", n, seed=seed)}
    corpus = task.pretraining_documents(seed=0)
    seen |= {_graph(task, doc[:doc.index("=") + 1]) for doc in corpus if "=" in doc}
    assert len(seen) > 100_000 and not evaluated & seen


def _fake_records(seeds, graphs=40, better=("(a) retry in pre-training",), rl=True):
    """Records of every arm: the arms in ``better`` right on every graph, the others on half."""
    rng = np.random.default_rng(0)
    out = {}
    for world, name in take_back.WORLDS.items():
        for label, arm in take_back.arms(name).items():
            if not rl and arm.stage.startswith("rlvr"):
                continue
            for s in seeds:
                half = np.where(rng.random(graphs) < 0.5, 1, -1).tolist()
                sure = [1] * graphs
                answers = {"outcome": sure if label in better else half, "tokens": [9] * graphs,
                           "erased": [False] * graphs, "first": [True] * graphs}
                out[world, label, s] = {
                    "greedy": answers, "masked": {**answers, "outcome": half},
                    "confidence": rng.random(graphs).tolist(),
                    "learning": {"outcome": half[:10], "confidence": rng.random(10).tolist()},
                    "samples": {"outcome": [half] * 2, "tokens": [[7] * graphs] * 2,
                                "check": [[True] * graphs] * 2}}
    return out


def test_the_summary_follows_the_numbers_and_names_the_contrasts_left_out():
    seeds = [0, 1, 2, 3, 4]
    records = _fake_records(seeds, rl=False)
    trained = {(w, label) for w, label, _ in records}
    results = take_back.preregistered_run(records, seeds, trained)
    assert sorted({c.number for c in results}) == [1, 2, 3]  # no RL arm trained: 4-6 left out
    said = take_back.summary(results)
    assert "Contrasts 4, 5, 6 were not run here" in said
    one = next(line for line in said.splitlines() if line.startswith("- **1."))
    assert "k = 2 higher" in one and "not resolved" not in one.split("Predicted")[0]
    # the same records with (a) no better than the rest: every verdict of contrast 1 turns
    flat = take_back.summary(take_back.preregistered_run(
        _fake_records(seeds, better=(), rl=False), seeds, trained))
    one = next(line for line in flat.splitlines() if line.startswith("- **1."))
    assert "higher" not in one.split("Predicted")[0]
    everything = _fake_records(seeds)
    full = take_back.preregistered_run(everything, seeds, {(w, a) for w, a, _ in everything})
    assert len(full) == len(take_back.contrasts())
    e = take_back.erasing(records, "k = 2", "(a) retry in pre-training", seeds)
    assert e["share erasing"] == 0.0 and math.isnan(e["right when erasing"])


def test_the_script_refuses_seed_lists_it_cannot_run(capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "fair_test.py"
    spec = importlib.util.spec_from_file_location("fair_test_script", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    for seeds in (["1", "1"], ["-1"]):
        with pytest.raises(SystemExit):
            script.main(["--scale", "smoke", "--seeds", *seeds])
        assert "--seeds must be distinct ints >= 0" in capsys.readouterr().err
