"""A kb_walk world that grows: the old world untouched, new names and facts beside it."""

import pytest

from halluc_lab.tasks import KBGrowth, KBGrowthConfig, KBWalk, KBWalkConfig, make_task

BASE = KBWalkConfig(n_entities=20, n_relations=3, common_count=5)
GROWN = KBGrowth(KBGrowthConfig(BASE, new_entities=4, new_relations=1))
OLD = KBWalk(BASE)


def test_every_old_fact_rarity_and_name_is_kept_and_new_pairs_are_only_new():
    assert GROWN.old_entities == OLD.entities and GROWN.old_relations == OLD.relations
    assert {p: f for p, f in GROWN.facts.items() if p not in GROWN.new_pairs} == OLD.facts
    assert GROWN.old_counts == OLD.counts
    new_e, new_r = set(GROWN.entities) - set(OLD.entities), set(GROWN.relations) - set(OLD.relations)
    assert len(new_e) == 4 and len(new_r) == 1 and not (new_e | new_r) & set(OLD.symbols())
    assert all(e in new_e or r in new_r for e, r in GROWN.new_pairs)
    assert len(GROWN.new_pairs) == 24 * 4 - 20 * 3  # every pair with a new entity or a new relation


def test_old_tokens_keep_their_ids():
    old, grown = OLD.tokenizer(), GROWN.tokenizer()
    assert grown.vocab_size == old.vocab_size + 5
    text = " ".join(OLD.symbols())
    assert grown.encode(text) == old.encode(text)


def test_the_old_corpus_is_the_base_worlds_and_the_new_corpus_holds_only_new_facts():
    assert GROWN.pretraining_documents(0) == OLD.pretraining_documents(0)
    sentences = [s.strip() for doc in GROWN.new_documents(0) for s in doc.split(" .") if s.strip()]
    assert sentences and all((s.split()[0], s.split()[1]) in GROWN.new_pairs for s in sentences)
    expected = sum(c for p, c in GROWN.counts.items() if p in GROWN.new_pairs)
    assert len(sentences) == expected


def test_new_and_old_chains_and_their_gold_walks():
    new = GROWN.examples("heldout", 30, seed=0, new=True)
    old = GROWN.examples("heldout", 30, seed=0, new=False)
    for e in new:
        start, *rels = e.prompt.split()[:-1]
        assert GROWN.is_new(start, rels)
    for e in old:
        assert OLD.gold(e.prompt) == e.completion  # an old chain walks as in the base world
    assert GROWN.examples("heldout", 5, seed=1) == GROWN.examples("heldout", 5, seed=1, new=None)
    with pytest.raises(TypeError):
        GROWN.examples("train", 1, seed=0, new=1)


@pytest.mark.parametrize("bad", [dict(new_entities=0, new_relations=0), dict(new_entities=-1),
                                 dict(new_relations=100), dict(growth_seed=-1)])
def test_bad_growth_configs_are_rejected(bad):
    with pytest.raises(ValueError):
        KBGrowthConfig(BASE, **bad)
    with pytest.raises(TypeError):
        KBGrowthConfig(base=None)


def test_make_task_builds_a_grown_world_and_the_growth_seed_matters():
    assert isinstance(make_task(KBGrowthConfig(BASE)), KBGrowth)
    other = KBGrowth(KBGrowthConfig(BASE, new_entities=4, new_relations=1, growth_seed=1))
    assert other.new_names != GROWN.new_names
