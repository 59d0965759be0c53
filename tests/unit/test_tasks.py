"""Synthetic tasks: verifiers on hand-written completions, disjoint splits, corpora, claims."""

import dataclasses
import math
import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from halluc_lab.tasks import (ABSTAINED, CONTRADICTED, MALFORMED, SUPPORTED, UNSUPPORTED, Arithmetic,
                              ArithmeticConfig, DeadEnds, DeadEndsConfig, InContext,
                              InContextConfig, KBGrowth, KBGrowthConfig, KBWalk,
                              KBWalkConfig, PathStar, Sycophancy, SycophancyConfig,
                              PathStarConfig, completion_symbols, make_task)
from halluc_lab.tasks.base import split_of

TASKS = [KBWalk(KBWalkConfig(n_entities=20, n_relations=3, common_count=5)),
         Arithmetic(ArithmeticConfig(max_digits=3, n_pretrain_documents=50)),
         PathStar(PathStarConfig(degree=3, path_length=4, n_nodes=16, n_pretrain_documents=50)),
         InContext(InContextConfig(n_pretrain_documents=50)),
         Arithmetic(ArithmeticConfig(max_digits=3, n_pretrain_documents=50, scratchpad=True)),
         KBGrowth(KBGrowthConfig(KBWalkConfig(n_entities=20, n_relations=3, common_count=5), new_entities=4)),
         Sycophancy(SycophancyConfig(ArithmeticConfig(max_digits=3, n_pretrain_documents=50))),
         DeadEnds(DeadEndsConfig(degree=3, reveal=2, n_nodes=16, pretrain_tokens=2000,
                                 retry_fraction=0.5)),
         DeadEnds(DeadEndsConfig(degree=2, reveal=None, length=3, n_nodes=16,
                                 pretrain_tokens=2000))]


# -- shared behaviour --------------------------------------------------------------------------
def test_completion_symbols_cuts_at_eos_and_applies_backspace():
    assert completion_symbols("1 2 <bksp> 3 <eos> 4") == ["1", "3"]
    assert completion_symbols("<bksp> 1 <bksp> <bksp> 2 <pad>") == ["2"]
    assert completion_symbols(["a", "<bksp>"]) == []


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.name)
def test_gold_completions_get_full_reward_and_only_supported_claims(task):
    exs = task.examples("train", 20, seed=1) + task.examples("heldout", 20, seed=1)
    assert task.reward([e.prompt for e in exs], [e.completion for e in exs]) == [1.0] * 40
    for e in exs:
        assert task.gold(e.prompt) == e.completion
        assert all(c.correct and c.status in (SUPPORTED, ABSTAINED) for c in task.claims(e.prompt, e.completion))
        task.tokenizer().encode(e.prompt + " " + e.completion)  # every symbol is in the vocabulary


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.name)
def test_splits_are_disjoint_and_deterministic(task):
    train = {(e.prompt, e.completion) for e in task.examples("train", 300, seed=0)}
    held = {(e.prompt, e.completion) for e in task.examples("heldout", 100, seed=0)}
    assert not train & held
    assert task.examples("heldout", 5, seed=3) == task.examples("heldout", 5, seed=3)
    assert task.examples("heldout", 5, seed=3) != task.examples("heldout", 5, seed=4)


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.name)
def test_backspaced_correction_is_verified_as_correct(task):
    e = task.examples("train", 1, seed=2)[0]
    gold = e.completion.split()
    wrong = task.plausible_error(e, 0, random.Random(0))
    fixed = " ".join([wrong, "<bksp>", *gold, "<eos>", "<pad>"])
    assert task.reward([e.prompt], [fixed]) == [1.0]
    assert task.reward([e.prompt], [" ".join([wrong, *gold[1:]])]) == [0.0]


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.name)
def test_plausible_errors_are_wrong_and_in_the_vocabulary(task):
    rng = random.Random(0)
    vocab = set(task.symbols()) | {"<abstain>"}
    for e in task.examples("train", 30, seed=5):
        gold = e.completion.split()
        for i, right in enumerate(gold):
            w = task.plausible_error(e, i, rng)
            assert w != right and w in vocab


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.name)
def test_bad_arguments_raise(task):
    with pytest.raises(ValueError, match="split"):
        task.examples("test", 1, seed=0)
    with pytest.raises(ValueError, match="n must be"):
        task.examples("train", -1, seed=0)
    with pytest.raises(ValueError, match="same length"):
        task.reward(["a"], [])
    with pytest.raises(ValueError, match="prompt"):
        task.gold("nonsense")


def test_reward_keywords_set_the_abstain_and_wrong_values():
    task = TASKS[0]
    e = next(e for e in task.examples("train", 50, seed=0) if "<abstain>" not in e.completion)
    start, rel = e.completion.split()[:2]
    out = task.reward([e.prompt] * 3, [e.completion, f"{start} {rel} <abstain>", f"{start} {start}"],
                      abstain_reward=0.25, wrong_reward=-1.0, unused_keyword=True)
    assert out == [1.0, 0.25, -1.0]


def test_an_abstention_after_a_wrong_step_is_a_hallucination():
    task = TASKS[0]
    e = next(e for e in task.examples("train", 50, seed=0) if "<abstain>" not in e.completion)
    start, rel, *_ = e.completion.split()
    wrong = next(s for s in task.symbols() if s not in e.completion.split() and s != "<abstain>")
    said = [f"{start} <abstain>", f"{start} {rel} {wrong} <abstain>", "<abstain>"]
    assert task.reward([e.prompt] * 3, said, abstain_reward=0.25, wrong_reward=-1.0) == [0.25, -1.0, 0.25]


def test_make_task_dispatches_on_the_config_type():
    assert isinstance(make_task(ArithmeticConfig()), Arithmetic)
    assert isinstance(make_task(PathStarConfig()), PathStar)
    assert isinstance(make_task(InContextConfig()), InContext)
    with pytest.raises(TypeError, match="config must be"):
        make_task({"max_digits": 3})


# -- kb_walk ---------------------------------------------------------------------------------
def test_kb_walk_pretraining_counts_are_exact_and_rare_facts_appear_one_to_three_times():
    task = KBWalk(KBWalkConfig(n_entities=20, n_relations=3, common_count=7, p_rare=0.3))
    seen = Counter(tuple(s.split()) for d in task.pretraining_documents(seed=0)
                   for s in d.replace(" .", " .|").split("|") if s.strip())
    seen = Counter({(a, r): c for (a, r, b, _), c in seen.items() if task.facts[(a, r)] == b})
    assert seen == Counter(task.counts)
    rare = [c for f, c in task.counts.items() if task.is_rare(*f)]
    assert rare and all(1 <= c <= 3 for c in rare)
    assert all(c == 7 for f, c in task.counts.items() if not task.is_rare(*f))


def test_kb_walk_train_chains_avoid_rare_facts_and_reserved_pairs_and_heldout_chains_reach_them():
    task = TASKS[0]
    pairs = lambda e: task._pairs(e.prompt.split()[0], e.prompt.split()[1:-1])
    for e in task.examples("train", 100, seed=0):
        assert all(task.usable_in_training(*p) for p in pairs(e))
    held = task.examples("heldout", 300, seed=0)
    assert any(not task.usable_in_training(*p) for e in held for p in pairs(e))
    assert any(task.is_rare(*p) for e in held for p in pairs(e) if p in task.facts)


def test_kb_walk_knowable_chains_are_exactly_those_through_common_facts_and_train_usable_pairs():
    task = TASKS[0]
    assert all(task.knowable(e.prompt) for e in task.examples("train", 100, seed=0))
    held = task.examples("heldout", 300, seed=0)
    known = [task.knowable(e.prompt) for e in held]
    assert any(known) and not all(known)
    rare_e, rare_r = next(f for f in task.facts if task.is_rare(*f))
    assert not task.knowable(f"{rare_e} {rare_r} =")
    common_e, common_r = next(f for f in task.facts if not task.is_rare(*f))
    assert task.knowable(f"{common_e} {common_r} =")
    with pytest.raises(ValueError, match="not a kb_walk prompt"):
        task.knowable("nonsense =")


SPLIT_WORLD = KBWalk(KBWalkConfig(n_entities=40, n_relations=4, common_count=5, p_missing=0.2,
                                  p_rare=0.3))


def test_kb_walk_evaluation_only_pairs_are_rare_facts_or_reserved_pairs_and_split_both_kinds():
    task = SPLIT_WORLD
    pairs = [(e, r) for e in task.entities for r in task.relations]
    hidden = [p for p in pairs if task.evaluation_only(*p)]
    assert hidden
    assert all(not task.usable_in_training(*p) and not task.learnable(*p) for p in hidden)
    for group in ([p for p in pairs if p in task.facts and task.is_rare(*p)],
                  [p for p in pairs if p not in task.facts and not task.usable_in_training(*p)]):
        assert 0 < sum(task.evaluation_only(*p) for p in group) < len(group)  # some of each
    rebuilt = KBWalk(task.config)  # the split is part of the world
    assert [rebuilt.evaluation_only(*p) for p in pairs] == [task.evaluation_only(*p) for p in pairs]
    more = KBWalk(dataclasses.replace(task.config, evaluation_fraction=0.9))
    assert sum(more.evaluation_only(*p) for p in pairs) > len(hidden)


def test_kb_walk_learning_part_never_looks_up_an_evaluation_only_pair_and_kinds_partition_it():
    task = SPLIT_WORLD
    held = task.examples("heldout", 600, seed=0)
    kinds = Counter(task.kind(e.prompt) for e in held)
    assert set(kinds) == {"knowable", "practised", "rare fact", "unseen gap"}
    for e in held:
        looked_up = task._pairs(*task._parse_prompt(e.prompt))
        hidden = any(task.evaluation_only(*p) for p in looked_up)
        assert (task.kind(e.prompt) in ("rare fact", "unseen gap")) == hidden
        assert (task.kind(e.prompt) == "knowable") == task.knowable(e.prompt)
        if task.learning_part(e.prompt):
            assert not hidden
    learning = [e for e in held if task.learning_part(e.prompt)]
    assert {task.kind(e.prompt) for e in learning} == {"knowable", "practised"}


def test_kb_walk_hard_and_practised_splits_are_held_out_chains_of_their_kinds_never_learned():
    task = SPLIT_WORLD
    heldout = lambda e: split_of(e.prompt[:-2], task.config.heldout_fraction, salt=0)  # noqa: E731
    hard, practised = task.examples("hard", 100, seed=0), task.examples("practised", 100, seed=0)
    assert all(task.kind(e.prompt) in ("rare fact", "unseen gap") for e in hard)
    assert all(task.kind(e.prompt) == "practised" for e in practised)
    assert not any(task.learning_part(e.prompt) for e in hard + practised)
    assert all(heldout(e) == "heldout" for e in hard + practised)
    assert all(task.gold(e.prompt) == e.completion for e in hard + practised)
    assert task.examples("hard", 5, seed=1) == task.examples("hard", 5, seed=1)
    by_length = task.examples_by_length("hard", 3, seed=0)
    assert set(by_length) == set(range(1, task.config.max_hops + 1))
    with pytest.raises(ValueError, match="split must be one of"):
        task.examples("evaluation", 1, seed=0)
    with pytest.raises(ValueError, match="split must be one of"):
        Arithmetic().examples("hard", 1, seed=0)  # kb_walk's splits only


def test_learning_part_of_tasks_without_shared_look_ups_is_the_prompt_hash_half():
    task = Arithmetic(ArithmeticConfig(max_digits=2))
    prompts = [e.prompt for e in task.examples("heldout", 200, seed=0)]
    halves = [split_of(p, 0.5, salt=9) == "heldout" for p in prompts]  # preference's hash so far
    assert [task.learning_part(p) for p in prompts] == halves
    assert 0 < sum(map(task.learning_part, prompts)) < len(prompts)


def test_kb_walk_claims_flag_hallucinated_steps():
    task = TASKS[0]
    (e0, r), e1 = next(iter(task.facts.items()))
    wrong = next(x for x in task.entities if x != e1)
    missing_e, missing_r = next((e, r2) for e in task.entities for r2 in task.relations
                                if (e, r2) not in task.facts)
    st_ = lambda p, c: [x.status for x in task.claims(p, c)]
    assert st_(f"{e0} {r} =", f"{e0} {r} {e1}") == [SUPPORTED]
    assert st_(f"{e0} {r} =", f"{e0} {r} {wrong}") == [CONTRADICTED]
    assert st_(f"{missing_e} {missing_r} =", f"{missing_e} {missing_r} {wrong}") == [UNSUPPORTED]
    assert st_(f"{missing_e} {missing_r} =", f"{missing_e} {missing_r} <abstain>") == [ABSTAINED]
    assert task.claims(f"{missing_e} {missing_r} =", f"{missing_e} {missing_r} {wrong}")[0].hallucinated
    other_r = next(x for x in task.relations if x != r)
    assert st_(f"{e0} {r} =", f"{e0} {other_r} {e1}") == [MALFORMED]
    assert task.gold(f"{missing_e} {missing_r} =") == f"{missing_e} {missing_r} <abstain>"


def test_kb_walk_fixed_hops_gives_chains_of_that_length():
    task = TASKS[0]
    assert all(len(e.prompt.split()) == 2 + 3 for e in task.examples("heldout", 20, seed=0, hops=3))


# -- arithmetic ------------------------------------------------------------------------------
def test_arithmetic_verifier_on_hand_written_sums():
    task = Arithmetic(ArithmeticConfig(max_digits=3))
    assert task.reward(["9 9 9 + 1 =", "9 9 9 + 1 =", "1 2 + 3 ="], ["1 0 0 0", "1 0 0", "1 5"]) == [1.0, 0.0, 1.0]
    claims = task.claims("9 9 9 + 1 =", "1 0 1 0 7")
    assert [c.status for c in claims] == [SUPPORTED, SUPPORTED, CONTRADICTED, SUPPORTED, UNSUPPORTED]
    rev = Arithmetic(ArithmeticConfig(max_digits=3, reverse_output=True))
    assert rev.gold("9 9 9 + 1 2 =") == "1 1 0 1"


def test_arithmetic_answer_length_is_respected_and_heldout_pairs_never_reach_pretraining():
    task = TASKS[1]
    assert all(len(e.completion.split()) == 4 for e in task.examples("train", 20, seed=0, answer_digits=4))
    held = {e.prompt for e in task.examples("heldout", 200, seed=0)}
    corpus = " ".join(task.pretraining_documents(seed=0))
    eqs = {s.split("=")[0].strip() + " =" for s in corpus.split(".") if s.strip()}
    assert not held & eqs and len(eqs) > 50


# -- path_star -------------------------------------------------------------------------------
def test_path_star_verifier_on_a_hand_written_graph():
    task = PathStar(PathStarConfig(degree=2, path_length=3, n_nodes=5))
    prompt = "0 1 , 1 2 , 0 3 , 3 4 / 0 4 ="
    assert task.reward([prompt] * 3, ["0 3 4", "0 1 2", "0 3 4 2"]) == [1.0, 0.0, 0.0]
    assert [c.status for c in task.claims(prompt, "0 1 4")] == [SUPPORTED, SUPPORTED, UNSUPPORTED]
    assert [c.status for c in task.claims(prompt, "3 4")] == [MALFORMED, SUPPORTED]
    rev = PathStar(PathStarConfig(degree=2, path_length=3, n_nodes=5, reverse_path=True))
    assert rev.gold(prompt) == "4 3 0"
    assert all(c.status == SUPPORTED for c in rev.claims(prompt, "4 3 0"))


def test_path_star_plausible_first_step_error_is_the_other_arm():
    task = PathStar(PathStarConfig(degree=2, path_length=3, n_nodes=5))
    from halluc_lab.tasks import Example
    ex = Example("0 1 , 1 2 , 0 3 , 3 4 / 0 4 =", "0 3 4")
    assert task.plausible_error(ex, 1, random.Random(0)) == "1"
    assert task.plausible_error(ex, 2, random.Random(0)) == "2"


def test_path_star_config_needs_enough_labels():
    with pytest.raises(ValueError, match="n_nodes"):
        PathStarConfig(degree=3, path_length=5, n_nodes=10)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 999), st.integers(0, 999))
def test_arithmetic_gold_is_the_sum(a, b):
    task = Arithmetic(ArithmeticConfig(max_digits=3))
    assert int(task.gold(task.example(a, b).prompt).replace(" ", "")) == a + b


# -- hard edges: bad configs raise, the largest world builds, the recipe worlds never change -----------
def test_kb_walk_more_relations_or_entities_than_allowed_raise_instead_of_hanging():
    from halluc_lab.tasks.kb_walk import MAX_ENTITIES, MAX_RELATIONS, invented_words
    with pytest.raises(ValueError, match=rf"n_relations must be an int in \[1, {MAX_RELATIONS}\]"):
        KBWalkConfig(n_relations=MAX_RELATIONS + 1)
    with pytest.raises(ValueError, match=rf"n_entities must be an int in \[2, {MAX_ENTITIES}\]"):
        KBWalkConfig(n_entities=MAX_ENTITIES + 1)
    with pytest.raises(ValueError, match=r"n must be an int in \[0, 980\]"):  # 14 · 5 · 14 one-syllable words
        invented_words(981, random.Random(0), syllables=1)
    assert len(set(invented_words(980, random.Random(0), syllables=1))) == 980


def test_kb_walk_largest_allowed_world_builds():
    from halluc_lab.tasks.kb_walk import MAX_ENTITIES, MAX_RELATIONS
    task = KBWalk(KBWalkConfig(n_entities=MAX_ENTITIES, n_relations=MAX_RELATIONS))
    assert len(task.entities) == MAX_ENTITIES and len(task.relations) == MAX_RELATIONS
    assert all(answer != e for (e, _), answer in task.facts.items())
    assert len(task.examples("heldout", 5, seed=0)) == 5


@pytest.mark.parametrize("field, value, match", [
    ("p_missing", float("nan"), r"p_missing must be in \[0, 1\)"),
    ("p_rare", float("inf"), r"p_rare must be in \[0, 1\)"),
    ("heldout_fraction", float("nan"), r"heldout_fraction must be in \(0, 1\)"),
    ("train_missing_fraction", "0.5", r"train_missing_fraction must be in \(0, 1\)"),
    ("evaluation_fraction", 1.0, r"evaluation_fraction must be in \(0, 1\)"),
    ("evaluation_fraction", float("nan"), r"evaluation_fraction must be in \(0, 1\)"),
    ("rare_counts", (1,), "rare_counts must be"),
    ("rare_counts", (1.0, 3), "rare_counts must be"),
])
def test_kb_walk_config_rejects_non_finite_or_mistyped_fractions_and_counts(field, value, match):
    with pytest.raises(ValueError, match=match):
        KBWalkConfig(**{field: value})


@pytest.mark.parametrize("keyword", ["correct_reward", "abstain_reward", "wrong_reward"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "1"])
def test_reward_values_must_be_finite_numbers(keyword, bad):
    task = TASKS[1]
    with pytest.raises(ValueError, match=rf"{keyword} must be a finite number"):
        task.reward(["1 + 2 ="], ["3"], **{keyword: bad})


def _world_digest(task, documents: bool) -> str:
    """A digest of what a seeded task generates: examples, the kb_walk world, optionally pre-training text."""
    import hashlib
    import json
    data = [[(e.prompt, e.completion) for split in ("train", "heldout") for e in task.examples(split, 20, seed=0)]]
    if isinstance(task, KBWalk):
        data.append([task.entities, task.relations,
                     sorted((e, r, x, task.counts[(e, r)]) for (e, r), x in task.facts.items())])
    if documents:
        data.append(task.pretraining_documents(0)[:50])
    return hashlib.sha256(json.dumps(data).encode()).hexdigest()[:16]


# The configs of halluc_lab.recipes.TASK_PLANS at both scales: cached models and committed results were
# trained on exactly these worlds, so any change to what they generate must be deliberate. The digests were
# computed before kb_walk's fact drawing was made linear. Full-scale pre-training corpora take seconds to
# build, so only the smoke scale pins pre-training text (the same code writes both).
@pytest.mark.parametrize("task, documents, expected", [
    (KBWalk(KBWalkConfig(n_entities=120, n_relations=6, common_count=3400, facts_per_document=7, max_hops=4)),
     False, "6a600a0755b641a0"),
    (KBWalk(KBWalkConfig(n_entities=24, n_relations=4, common_count=600, facts_per_document=7, max_hops=3)),
     True, "9eba32876c023d45"),
    (Arithmetic(ArithmeticConfig(max_digits=3, n_pretrain_documents=192_000, equations_per_document=3)),
     False, "1d3e77057e828f20"),
    (Arithmetic(ArithmeticConfig(max_digits=2, n_pretrain_documents=4000, equations_per_document=3)),
     True, "cd5cda8d761c8943"),
    (PathStar(PathStarConfig(degree=2, path_length=5, n_nodes=20, n_pretrain_documents=192_000)),
     False, "192046692d573135"),
    (PathStar(PathStarConfig(degree=2, path_length=4, n_nodes=16, n_pretrain_documents=6000)),
     True, "c4c4aeaa075d916d"),
], ids=["kb_walk-full", "kb_walk-smoke", "arithmetic-full", "arithmetic-smoke", "path_star-full",
        "path_star-smoke"])
def test_recipe_worlds_are_unchanged(task, documents, expected):
    assert _world_digest(task, documents) == expected


# -- arithmetic with a scratchpad (chain of thought) ------------------------------------------------
def test_the_scratchpad_writes_001s_17_plus_25_column_by_column():
    task = Arithmetic(ArithmeticConfig(max_digits=2, scratchpad=True))
    assert task.gold("1 7 + 2 5 =") == "7 5 0 1 2 ; 1 2 1 0 4 ; : 4 2"  # 7+5+0 = 12, 1+2+1 = 04: 42
    assert task.gold("9 9 + 5 =") == "9 5 0 1 4 ; 9 0 1 1 0 ; : 1 0 4"  # the last carry becomes a digit
    assert task.final_answer("7 5 0 1 2 ; 1 2 1 0 4 ; : 4 2") == ["4", "2"]
    assert task.final_answer("7 5 0 1 2 ;") == []  # no answer written yet


def test_every_scratchpad_column_is_a_true_column_sum_and_ends_in_the_sum():
    task = Arithmetic(ArithmeticConfig(max_digits=3, scratchpad=True))
    for e in task.examples("train", 100, seed=0):
        steps, answer = e.completion.split(" : ")
        carry = 0
        for col in steps.split(" ;")[:-1]:
            x, y, c, k, s = map(int, col.split())
            assert c == carry and x + y + c == 10 * k + s
            carry = k
        a, b = (int(t.replace(" ", "")) for t in e.prompt.removesuffix(" =").split(" + "))
        assert answer.replace(" ", "") == str(a + b)


def test_without_a_scratchpad_the_vocabulary_and_the_examples_are_unchanged():
    plain = Arithmetic(ArithmeticConfig())
    assert plain.symbols() == tuple("0123456789") + ("+", "=", ".")  # the trained models' vocabulary
    assert plain.gold("1 7 + 2 5 =") == "4 2" and plain.final_answer("4 2 <eos>") == ["4", "2"]
    pad = Arithmetic(ArithmeticConfig(scratchpad=True))
    assert [e.prompt for e in pad.examples("heldout", 5, seed=0)] == [e.prompt for e in plain.examples("heldout", 5, seed=0)]
    with pytest.raises(TypeError):
        ArithmeticConfig(scratchpad=1)


def test_scratchpad_claims_check_the_working_as_well_as_the_answer():
    task = Arithmetic(ArithmeticConfig(max_digits=2, scratchpad=True))
    claims = task.claims("1 7 + 2 5 =", "7 5 0 1 3 ; 1 2 1 0 4 ; : 4 3")
    wrong = [c.text for c in claims if c.status == CONTRADICTED]
    assert wrong == ["3", "3"] and claims[4].status == CONTRADICTED and claims[-1].status == CONTRADICTED
    assert all(c.status == SUPPORTED for c in task.claims("1 7 + 2 5 =", task.gold("1 7 + 2 5 =")))


def test_the_implied_answer_is_the_sum_the_working_spells_whatever_the_answer_says():
    task = Arithmetic(ArithmeticConfig(max_digits=3, scratchpad=True))
    for e in task.examples("heldout", 50, seed=3):  # the gold working implies the gold sum
        assert task.implied_answer(e.completion) == task.final_answer(e.completion)
    assert task.implied_answer("9 5 0 1 4 ; 9 0 1 1 0 ; : 1 0 4") == ["1", "0", "4"]  # the last carry is a digit
    assert task.implied_answer("7 5 0 1 3 ; 1 2 1 0 4 ; : 4 2") == ["4", "3"]  # a wrong column, a right answer
    assert task.implied_answer("7 5 0 1 2 ; 1 2 1 0 4 ;") == ["4", "2"]  # no answer written yet
    reverse = Arithmetic(ArithmeticConfig(max_digits=2, reverse_output=True, scratchpad=True))
    assert reverse.implied_answer(reverse.gold("9 9 + 5 =")) == ["4", "0", "1"]


@pytest.mark.parametrize("completion", ["", ": 4 2", "7 5 0 1 2 : 4 2", "7 5 0 1 ; : 4 2",
                                        "7 5 + 1 2 ; : 4 2", "7 5 0 1 2 ; 1 2 1 0 4 : 4 2"])
def test_the_implied_answer_of_malformed_working_is_none(completion):
    assert Arithmetic(ArithmeticConfig(max_digits=2, scratchpad=True)).implied_answer(completion) is None


def test_the_implied_answer_needs_a_scratchpad_task():
    with pytest.raises(ValueError, match="scratchpad"):
        Arithmetic(ArithmeticConfig(max_digits=2)).implied_answer("4 2")


# -- a reward function's values, checked where they enter training ---------------------------
def strings(p, c):
    return ["1"] * len(c)


@pytest.mark.parametrize("reward, error, match", [
    (strings, TypeError, r"reward strings must return .*value 0 is str '1'"),
    (lambda p, c: [0.0, None], TypeError, "value 1 is NoneType None"),
    (lambda p, c: [True, False], TypeError, "value 0 is bool True"),
    (lambda p, c: [0.0, math.nan], ValueError, "value 1 is nan"),
    (lambda p, c: [0.0], ValueError, r"one finite number per completion \(2\), got 1 values"),
    (lambda p, c: None, TypeError, "got NoneType"),
    (lambda p, c: "10", TypeError, "got str"),
])
def test_reward_values_name_the_reward_the_index_and_the_type(reward, error, match):
    from halluc_lab.tasks.base import reward_values

    with pytest.raises(error, match=match):
        reward_values(reward, [[1], [1]], [[5], [6]])


def test_reward_values_accept_numpy_and_tensor_numbers_as_floats():
    import numpy as np
    import torch

    from halluc_lab.tasks.base import reward_values

    as_lists = ([np.int64(1), np.float32(0.5)], (1, 0.5))
    for values in (*as_lists, np.array([1, 0.5]), torch.tensor([1.0, 0.5])):
        out = reward_values(lambda p, c, v=values: v, [[1], [1]], [[5], [6]])
        assert out == [1.0, 0.5] and all(type(r) is float for r in out)
