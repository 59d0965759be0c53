"""A kb_walk world that grows: new entities and relations arrive, with their facts, and the old ones
stay.

Chapter 12's continual learning (001 Part 4 §1: a new corpus D^(k+1) after the model learnt
D^(1..k)). The grown world is the base world of :mod:`halluc_lab.tasks.kb_walk` unchanged — the same
names, facts, rarity and splits — plus ``new_entities`` entities and ``new_relations`` relations.
New facts are drawn, as the base world draws its own, for every pair with a new entity or a new
relation (a pair may have no fact; some new facts are rare); a new fact may point to any entity, old
or new. Nothing about an old pair changes, so every old chain walks exactly as before.

* :meth:`KBGrowth.pretraining_documents` is the old corpus (the base world's, document for
  document); :meth:`KBGrowth.new_documents` is D^(k+1): the new facts, each as often as the base
  world repeats one.
* ``examples(..., new=True)`` draws chains that look up at least one new pair (new-fact accuracy);
  ``new=False`` chains of old names only (retention: chains of the base world, which walk as they
  did).
* The vocabulary is the base world's followed by the new names, so every old token keeps its id and
  a model trained on the base world grows its embedding by new rows only
  (:func:`halluc_lab.extensions.continual.grow_vocabulary`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from halluc_lab.tasks.base import Example, check_count
from halluc_lab.tasks.kb_walk import (MAX_ENTITIES, MAX_RELATIONS, KBWalk, KBWalkConfig,
                                      invented_words)


@dataclass(frozen=True)
class KBGrowthConfig:
    """The base world and what arrives."""

    base: KBWalkConfig = field(default_factory=KBWalkConfig)  # the world the model learnt first
    new_entities: int = 8  # entities that arrive
    new_relations: int = 1  # relations that arrive
    # draws the new names and facts (the base world is unchanged whatever it is)
    growth_seed: int = 0

    def __post_init__(self):
        if not isinstance(self.base, KBWalkConfig):
            raise TypeError(f"base must be a KBWalkConfig, got {type(self.base).__name__}")
        check_count("new_entities", self.new_entities, 0, MAX_ENTITIES - self.base.n_entities)
        check_count("new_relations", self.new_relations, 0, MAX_RELATIONS - self.base.n_relations)
        check_count("growth_seed", self.growth_seed)
        if self.new_entities + self.new_relations == 0:
            raise ValueError("a grown world needs at least one new entity or relation")


def _fresh(n: int, rng: random.Random, syllables: int, suffix: str,
           taken: Sequence[str]) -> list[str]:
    """``n`` invented words, none of them in ``taken``."""
    taken = set(taken)
    return [w for w in invented_words(n + len(taken), rng, syllables, suffix) if w not in taken][:n]


class KBGrowth(KBWalk):
    """The base kb_walk world with new entities, relations and facts added (module docstring).

    >>> task = KBGrowth(KBGrowthConfig(KBWalkConfig(n_entities=6, n_relations=2), new_entities=2,
    ...                                new_relations=1))
    >>> (len(task.entities), len(task.relations),
    ...  task.symbols()[:10] == KBWalk(task.growth.base).symbols())
    (8, 3, True)
    """

    name = "kb_growth"
    config_type = KBGrowthConfig

    def __init__(self, config: KBGrowthConfig = KBGrowthConfig()):
        super().__init__(config.base)
        self.growth = config
        base = config.base
        self.old_entities, self.old_relations = self.entities, self.relations
        self.old_counts = dict(self.counts)  # the old corpus, in the base world's order
        rng = random.Random(f"kb_walk-growth-{base.world_seed}-{config.growth_seed}")
        new_e = _fresh(config.new_entities, rng, 2, "", self.entities)
        new_r = _fresh(config.new_relations, rng, 1, "_of", self.relations)
        self.entities = self.old_entities + tuple(new_e)
        self.relations = self.old_relations + tuple(new_r)
        self.new_names = tuple(new_e) + tuple(new_r)
        self.new_pairs: set[tuple[str, str]] = set()
        old_e = frozenset(self.old_entities)
        for e in self.entities:
            for r in self.relations:
                if e in old_e and r in self.old_relations:
                    continue  # an old pair: as the base world has it
                self.new_pairs.add((e, r))
                if rng.random() < base.p_missing:
                    continue
                self.facts[(e, r)] = rng.choice([x for x in self.entities if x != e])
                rare = rng.random() < base.p_rare
                self.counts[(e, r)] = rng.randint(*base.rare_counts) if rare else base.common_count
        self._entity_set = frozenset(self.entities)

    def symbols(self) -> tuple[str, ...]:
        """The base world's vocabulary, then the new names: old tokens keep their ids."""
        return self.old_entities + self.old_relations + ("=", ".") + self.new_names

    def is_new(self, start: str, relations: Sequence[str]) -> bool:
        """Whether a chain looks up a pair that arrived with the growth."""
        return any(p in self.new_pairs for p in self._pairs(start, relations))

    def is_old(self, start: str, relations: Sequence[str]) -> bool:
        """Whether a chain is one of the base world's: its start and every relation are old
        names."""
        return start in self.old_entities and all(r in self.old_relations for r in relations)

    def examples(self, split: str, n: int, seed: int, hops: int | None = None, where=None,
                 new: bool | None = None) -> list[Example]:
        """``n`` chains of the split; ``new``: True for chains that look up a new pair, False for
        the base world's chains (old names only; drawn from this world's names, so not the base
        task's stream of them), None for any. A chain naming a new relation that it stops before
        reaching is neither."""
        if new is None:
            return super().examples(split, n, seed, hops, where)
        if not isinstance(new, bool):
            raise TypeError(f"new must be a bool or None, got {new!r}")
        kind = self.is_new if new else self.is_old
        keep = lambda start, rels: kind(start, rels) and (where is None or where(start, rels))
        return super().examples(split, n, seed, hops, keep)

    def pretraining_documents(self, seed: int) -> list[str]:
        """The old corpus: the base world's documents (the new facts are :meth:`new_documents`)."""
        return self._documents(self.old_counts, seed, "kb_walk-pretrain")

    def new_documents(self, seed: int) -> list[str]:
        """D^(k+1): every new fact ``counts[fact]`` times as ``e r e' .``, shuffled into
        documents."""
        return self._documents({p: c for p, c in self.counts.items() if p in self.new_pairs}, seed,
                               "kb_growth-new")
