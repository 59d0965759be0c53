"""No stage learns an evaluation-only kb_walk look-up: the real worlds of both scales, every stage.

A kb_walk text states a pair (entity, relation) wherever the relation follows the entity in what
the text finally says (its ``<bksp>`` applied): a chain's prompt and gold walk, a passage
``e r e' .``. The stages that learn from the starting model's own samples (DPO, RSFT, own errors,
corrections, PPO, RLHF's reward model, RLVR) are checked through what they draw: their prompts and
the gold walks the verifier compares with. Off the gold walk a sample is wrong whatever it says, so
the verifier's reward and ranking carry nothing about a pair looked up there.
"""

import random
from functools import lru_cache

import pytest

from halluc_lab import recipes
from halluc_lab.training.data import Batch
from halluc_lab.stages.preference import evaluation_examples, preference_examples
from halluc_lab.stages.sft import own_error_demonstration
from halluc_lab.stages.sft import SFT
from halluc_lab.tasks import KBWalk, make_task
from halluc_lab.tasks.base import completion_symbols
from halluc_lab.tasks.kb_walk import HARD, HARD_KINDS, KINDS, PRACTISED

SCALES = ("smoke", "full")
PLANS = {scale: recipes.TASK_PLANS["kb_walk", scale] for scale in SCALES}
# Every post-training stage of kb_walk (a stage exists where the task's plan gives it steps), from
# the registry's tables, so a stage added later is checked too: those that learn from held-out
# prompts, and SFT's.
STAGES = {scale: {name: recipes.STAGE_PLANS[name] for name in plan.steps}
          for scale, plan in PLANS.items()}
HELDOUT_LEARNERS = sorted({name for plans in STAGES.values() for name, how in plans.items()
                           if hasattr(how.stage(PLANS["smoke"]), "n_prompts")})
SFT_STAGES = sorted({name for plans in STAGES.values() for name, how in plans.items()
                     if isinstance(how.stage(PLANS["smoke"]), SFT)})


@lru_cache(maxsize=None)
def world(scale: str) -> KBWalk:
    """The kb_walk world of a scale, as the recipes build it (built once per test session)."""
    return make_task(PLANS[scale].world)


@lru_cache(maxsize=None)
def train_examples(scale: str, n: int, seed: int) -> list:
    """SFT's examples of the train split (every SFT stage of a scale draws the same: drawn once)."""
    return world(scale).examples("train", n, seed=seed)


def stage_and_seed(name: str, scale: str):
    """A kb_walk stage at a scale and the seed its recipe draws with (the registry's tables, without
    building the recipe chain, whose full-scale pre-training corpus takes seconds to count)."""
    how = recipes.STAGE_PLANS[name]
    return how.stage(PLANS[scale]), how.seed


def stated_pairs(task: KBWalk, text: str) -> set[tuple[str, str]]:
    """Every (entity, relation) a text states or asks, adjacent in what it finally says."""
    said = completion_symbols(text)
    return {(a, b) for a, b in zip(said, said[1:])
            if a in task.entities and b in task.relations}


def hidden_in(task: KBWalk, texts) -> set[tuple[str, str]]:
    """The evaluation-only pairs stated anywhere in ``texts``."""
    return {p for t in texts for p in stated_pairs(task, t) if task.evaluation_only(*p)}


def example_texts(examples) -> list[str]:
    return [f"{e.prompt} {e.completion}" for e in examples]


def row_texts(task: KBWalk, rows: Batch) -> list[str]:
    """Each packed sequence of ``rows`` decoded, one text per sequence (from its ``<bos>``)."""
    tok = task.tokenizer()
    texts = []
    for row in rows.input_ids.tolist():
        texts += [f"<bos> {t}" for t in tok.decode(row).split("<bos>") if t.strip()]
    return texts


@pytest.mark.parametrize("scale", SCALES)
def test_each_scale_keeps_some_rare_facts_and_reserved_pairs_for_evaluation_only(scale):
    task = world(scale)
    rare = [p for p in task.facts if task.is_rare(*p)]
    reserved = [(e, r) for e in task.entities for r in task.relations
                if (e, r) not in task.facts and not task.usable_in_training(e, r)]
    for group in (rare, reserved):
        hidden = sum(task.evaluation_only(*p) for p in group)
        assert 0 < hidden < len(group)
    common = [p for p in task.facts if not task.is_rare(*p)]
    assert not any(task.evaluation_only(*p) for p in common)


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("name", HELDOUT_LEARNERS)
def test_post_training_prompts_and_gold_walks_state_no_evaluation_only_pair(scale, name):
    task, (stage, seed) = world(scale), stage_and_seed(name, scale)
    examples = preference_examples(task, stage.n_prompts, seed=seed)
    assert len(examples) == stage.n_prompts
    assert hidden_in(task, example_texts(examples)) == set()


@pytest.mark.parametrize("scale", SCALES)
def test_own_error_and_correction_demonstrations_state_no_evaluation_only_pair(scale):
    task, (stage, seed) = world(scale), stage_and_seed("sft-own-errors", scale)
    tok = task.tokenizer()
    rng = random.Random(0)
    texts = []
    for ex in preference_examples(task, stage.n_prompts, seed=seed):
        gold = ex.completion.split()
        i = rng.randrange(len(gold))  # an answer wrong from symbol i on, as a sampled one may be
        answer = tok.encode([*gold[:i], task.plausible_error(ex, i, rng), "<eos>"])
        for take_back in (True, False):
            demo = own_error_demonstration(tok, ex, answer, take_back=take_back)
            texts.append(tok.decode(demo.ids))
    assert hidden_in(task, texts) == set()


@pytest.mark.parametrize("scale", ["smoke", pytest.param("full", marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", SFT_STAGES)
def test_sft_examples_with_their_passages_and_backspaces_state_no_evaluation_only_pair(scale, name):
    """SFT's examples as its stage builds them (smoke: the packed rows themselves, replayed
    pre-training documents included; full: the examples and their retrieved context, as the stage
    draws them, and the documents it may replay)."""
    task, (stage, seed) = world(scale), stage_and_seed(name, scale)
    if scale == "smoke":
        rows = recipes.training_rows(recipes.get(f"kb_walk-{name}", scale))
        texts = row_texts(task, rows)
        assert len([t for t in texts if "=" in t.split()]) >= stage.n_examples  # every example
        assert len(texts) > stage.n_examples  # and the replayed documents
    else:
        rng = random.Random(seed)
        examples = train_examples(scale, stage.n_examples, seed)
        if stage.retrieved is not None:
            examples = [stage.retrieved.augment(task, ex, rng) for ex in examples]
            assert any(" . " in e.prompt for e in examples)  # passages were prepended
        replayed = task.replay_documents(recipes.get("kb_walk-pretrain", scale).seed)
        texts = example_texts(examples) + replayed
    assert hidden_in(task, texts) == set()


@pytest.mark.parametrize("scale", SCALES)
def test_hard_split_looks_up_what_no_stage_learned_and_practised_split_nothing_hidden(scale):
    task = world(scale)
    stage, seed = stage_and_seed("rlvr", scale)
    learning = preference_examples(task, stage.n_prompts, seed=seed)
    learned = {p for e in learning for p in stated_pairs(task, f"{e.prompt} {e.completion}")}
    hard = task.examples(HARD, 300, seed=0)
    assert all(task.kind(e.prompt) in HARD_KINDS for e in hard)
    assert not any(task.learning_part(e.prompt) for e in hard)
    assert all(hidden_in(task, example_texts([e])) - learned for e in hard)  # an unlearned look-up
    practised = task.examples(PRACTISED, 300, seed=0)
    assert hidden_in(task, example_texts(practised)) == set()
    assert not {e.prompt for e in practised} & {e.prompt for e in learning}
    evaluated = evaluation_examples(task, 300, seed=0)
    assert not any(task.learning_part(e.prompt) for e in evaluated)
    assert {task.kind(e.prompt) for e in evaluated} == set(KINDS)


def test_stated_pairs_reads_what_a_text_finally_says():
    task = world("smoke")
    (e, r), x = next(iter(task.facts.items()))
    other = next(q for q in task.relations if q != r)
    assert stated_pairs(task, f"<bos> {e} {r} = {e} {other} <bksp> {r} {x} <eos>") == {(e, r)}
    assert stated_pairs(task, f"{e} {r} {x} . {x} {other} =") == {(e, r), (x, other)}
