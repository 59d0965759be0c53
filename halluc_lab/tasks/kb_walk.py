"""Knowledge-base walk: chains of facts about invented entities (hallucination's test bed).

Chapters 7–8 build the models; chapter 11 (001 Part 3, hallucination) studies them. The
world is a fictional knowledge base: entities and relations are invented words, and a
*fact* says that relation ``r`` maps entity ``e`` to entity ``e'``. Some (entity, relation)
pairs have no fact at all: the only correct answer there is ``<abstain>``.

* **Pre-training** sees each fact as a sentence ``e r e' .``. Common facts appear
  ``common_count`` times in the corpus, *rare* facts only 1–3 times, so after one pass the
  model really is uncertain about them. Pairs without a fact never appear.
* **A prompt** asks for a chain of K facts: ``e0 r1 r2 r3 =``. The completion walks it,
  one fact at a time in the pre-training format: ``e0 r1 e1 r2 e2 r3 e3``. At the first
  pair without a fact the walk stops: ``e0 r1 e1 r2 <abstain>``.
* **Splits.** Chains are assigned to train or held-out by a hash, so held-out chains are
  new combinations. Train chains also avoid every rare fact and the fact-less pairs
  reserved for evaluation: after SFT, a rare fact is still known only from its 1–3
  pre-training sentences, and a reserved pair was never seen at all, so a held-out chain
  through either asks the model something it cannot know well.
* **Evaluation-only look-ups.** Later stages learn from held-out chains too (the learning part of
  :meth:`KBWalk.learning_part`: preference pairs, RSFT, own errors, corrections, RLVR, reward
  models), and a chain shares its look-ups with other chains: halving held-out chains by prompt let
  the learning half teach the rare facts and reserved pairs that the evaluated half looks up. So
  before any post-training data is drawn, the world splits its rare facts and reserved pairs (a
  seeded hash, ``evaluation_fraction`` of them) into *learnable* ones and *evaluation-only* ones,
  and no stage learns from a chain that looks one of the latter up. Held-out chains then come in
  kinds (:meth:`KBWalk.kind`): *knowable* (common facts and train-usable pairs only), *practised* (a
  learnable rare fact or reserved pair, none evaluation-only: a stage may have trained on that
  look-up through another chain) and the *hard* ones, *rare fact* and *unseen gap* (an
  evaluation-only look-up: no stage saw it; the rare fact only in its 1–3 pre-training sentences).
  The splits :data:`PRACTISED` and :data:`HARD` draw the evaluated practised chains and the hard
  chains. A sample that leaves the gold walk may look anything up, but it is wrong whatever it says
  there, so the verifier's reward and ranking tell nothing about an evaluation-only fact.
* **Claims.** Each step ``r_i x_i`` is one claim about the entity the completion itself
  reached: supported if the knowledge base says so, *contradicted* if the pair has a
  different fact, *unsupported* if the pair has none. Both of the latter are hallucinations.

Departure: facts are functional (one answer per pair); real knowledge bases are not.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from halluc_lab.tasks.base import (ABSTAINED, CONTRADICTED, MALFORMED, SPLITS, SUPPORTED,
                                   UNSUPPORTED, Claim, Example, Task, check_count, check_fraction,
                                   check_split, completion_symbols, rng_for, split_of)
from halluc_lab.model.tokenizer import ABSTAIN

_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
_MAX_TRIES = 10_000  # rejection-sampling budget per example before giving up with an error
# Far beyond what the recipes use (120 entities, 6 relations) and below the 68,600 two-syllable
# entity names and 980 one-syllable relation names: the largest world, 250,000 (entity, relation)
# pairs, builds in about half a second.
MAX_ENTITIES = 5_000
MAX_RELATIONS = 50
# Held-out chains by what they look up (KBWalk.kind); the last two are the hard ones, which no stage
# learned from.
KNOWABLE, PRACTISED, RARE_FACT, UNSEEN_GAP = "knowable", "practised", "rare fact", "unseen gap"
KINDS = (KNOWABLE, PRACTISED, RARE_FACT, UNSEEN_GAP)
HARD_KINDS = (RARE_FACT, UNSEEN_GAP)
# kb_walk's splits beyond train and held-out, both inside the held-out split and never learned from:
# PRACTISED, the evaluated chains of that kind; HARD, the chains with an evaluation-only look-up.
HARD = "hard"
KB_SPLITS = (*SPLITS, PRACTISED, HARD)


@dataclass(frozen=True)
class KBWalkConfig:
    """The fictional world and how it is shown to the model."""

    n_entities: int = 48  # number of invented entity names, at most MAX_ENTITIES
    n_relations: int = 4  # number of invented relation names, at most MAX_RELATIONS
    p_missing: float = 0.1  # fraction of (entity, relation) pairs with no fact (answer: <abstain>)
    p_rare: float = 0.2  # fraction of facts that are rare in pre-training
    # a rare fact appears between these many times (inclusive)
    rare_counts: tuple[int, int] = (1, 3)
    common_count: int = 100  # a common fact appears this many times in the pre-training corpus
    facts_per_document: int = 8  # fact sentences per pre-training document
    max_hops: int = 3  # chains have between 1 and max_hops steps
    heldout_fraction: float = 0.2  # fraction of chains (start, relations) held out
    # fraction of fact-less pairs train chains may use (to learn abstaining)
    train_missing_fraction: float = 0.5
    # The share of rare facts and reserved pairs kept for evaluation only (no stage learns them).
    evaluation_fraction: float = 0.5
    world_seed: int = 0  # determines names, facts, rarity and the split

    def __post_init__(self):
        check_count("n_entities", self.n_entities, 2, MAX_ENTITIES)
        check_count("n_relations", self.n_relations, 1, MAX_RELATIONS)
        check_count("common_count", self.common_count, 1)
        check_count("facts_per_document", self.facts_per_document, 1)
        check_count("max_hops", self.max_hops, 1)
        check_count("world_seed", self.world_seed)
        for name, zero_ok in (("p_missing", True), ("p_rare", True), ("heldout_fraction", False),
                              ("train_missing_fraction", False), ("evaluation_fraction", False)):
            check_fraction(name, getattr(self, name), zero_ok=zero_ok)
        rc = self.rare_counts
        if not (isinstance(rc, (tuple, list)) and len(rc) == 2
                and all(isinstance(c, int) and not isinstance(c, bool) for c in rc)
                and 1 <= rc[0] <= rc[1]):
            raise ValueError(f"rare_counts must be (lo, hi) ints with 1 <= lo <= hi, got {rc!r}")


def invented_words(n: int, rng: random.Random, syllables: int, suffix: str = "") -> list[str]:
    """``n`` distinct pronounceable invented words (consonant-vowel syllables, then a consonant).

    There are 14^(syllables + 1) · 5^syllables such words; asking for more is a ValueError (the
    rejection sampling below would never finish)."""
    check_count("syllables", syllables)
    available = len(_CONSONANTS) ** (syllables + 1) * len(_VOWELS) ** syllables
    check_count("n", n, 0, available)
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < n:
        w = "".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(syllables))
        w += rng.choice(_CONSONANTS) + suffix
        if w not in seen:
            seen.add(w)
            words.append(w)
    return words


class KBWalk(Task):
    """The knowledge-base walk task.

    >>> task = KBWalk(KBWalkConfig(n_entities=6, n_relations=2))
    >>> ex = task.examples("train", 1, seed=0)[0]
    >>> task.reward([ex.prompt], [ex.completion])
    [1.0]
    """

    name = "kb_walk"
    config_type = KBWalkConfig

    def __init__(self, config: KBWalkConfig = KBWalkConfig()):
        self.config = config
        rng = random.Random(f"kb_walk-world-{config.world_seed}")
        self.entities = tuple(invented_words(config.n_entities, rng, syllables=2))
        self.relations = tuple(invented_words(config.n_relations, rng, syllables=1, suffix="_of"))
        self.facts: dict[tuple[str, str], str] = {}  # (entity, relation) -> entity
        self.counts: dict[tuple[str, str], int] = {}  # pre-training occurrences of each fact
        n = len(self.entities)
        for i, e in enumerate(self.entities):
            for r in self.relations:
                if rng.random() < config.p_missing:
                    continue
                # The j-th entity other than e. randrange(n - 1) draws what rng.choice did on the
                # list of the other n - 1 entities, without building that list for each pair (which
                # was quadratic in n_entities); the worlds are bit-identical, and
                # tests/unit/test_tasks.py pins them.
                j = rng.randrange(n - 1)
                self.facts[(e, r)] = self.entities[j + (j >= i)]
                rare = rng.random() < config.p_rare
                self.counts[(e,
                             r)] = rng.randint(*config.rare_counts) if rare else config.common_count
        self._entity_set = frozenset(self.entities)

    # -- the world -------------------------------------------------------------------
    def symbols(self) -> tuple[str, ...]:
        return self.entities + self.relations + ("=", ".")

    def is_rare(self, entity: str, relation: str) -> bool:
        """True for a fact that appears fewer than ``common_count`` times in pre-training."""
        return self.counts.get((entity, relation), 0) < self.config.common_count

    def usable_in_training(self, entity: str, relation: str) -> bool:
        """Whether a train chain may look up this pair: a common fact, or a fact-less pair
        not reserved for evaluation."""
        if (entity, relation) in self.facts:
            return not self.is_rare(entity, relation)
        held = split_of(f"{entity} {relation}", 1.0 - self.config.train_missing_fraction,
                        salt=self.config.world_seed)
        return held == "train"

    def evaluation_only(self, entity: str, relation: str) -> bool:
        """Whether a pair is kept for evaluation: a rare fact or a reserved fact-less pair that no
        stage learns from (a seeded hash of the pair, ``evaluation_fraction`` of them, so a grown
        world keeps the old split)."""
        if self.usable_in_training(entity, relation):
            return False
        held = split_of(f"evaluation-only {entity} {relation}", self.config.evaluation_fraction,
                        salt=self.config.world_seed)
        return held == "heldout"

    def learnable(self, entity: str, relation: str) -> bool:
        """Whether some stage may learn this pair: SFT's pairs (:meth:`usable_in_training`), and
        the rare facts and reserved pairs that are not :meth:`evaluation_only` (post-training's,
        through held-out chains)."""
        return not self.evaluation_only(entity, relation)

    def learning_part(self, prompt: str) -> bool:
        """Whether post-training may learn from a held-out chain: every pair it looks up is
        :meth:`learnable`, and the prompt's hash puts it in the learning half (the other half of
        such chains is evaluated).

        >>> task = KBWalk(KBWalkConfig(n_entities=12, n_relations=2))
        >>> any(task.learning_part(e.prompt) for e in task.examples("hard", 20, seed=0))
        False
        """
        pairs = self._pairs(*self._parse_prompt(prompt))
        return all(self.learnable(*p) for p in pairs) and super().learning_part(prompt)

    def kind(self, prompt: str) -> str:
        """What a chain looks up (:data:`KINDS`): :data:`KNOWABLE` (common facts and train-usable
        pairs only), :data:`PRACTISED` (a learnable rare fact or reserved pair, none
        evaluation-only), :data:`RARE_FACT` (an evaluation-only rare fact) or :data:`UNSEEN_GAP`
        (an evaluation-only fact-less pair, no such rare fact)."""
        return self._kind(*self._parse_prompt(prompt))

    def _kind(self, start: str, relations: Sequence[str]) -> str:
        pairs = self._pairs(start, relations)
        hidden = [p for p in pairs if self.evaluation_only(*p)]
        if hidden:
            return RARE_FACT if any(p in self.facts for p in hidden) else UNSEEN_GAP
        return KNOWABLE if all(self.usable_in_training(*p) for p in pairs) else PRACTISED

    def knowable(self, prompt: str) -> bool:
        """Whether a model trained on this world could know a chain's answer: every pair its
        gold walk looks up is a common fact or a fact-less pair that train chains use (not a rare
        fact, not a pair reserved for evaluation). Every train chain is knowable; a held-out chain
        may not be.

        >>> task = KBWalk(KBWalkConfig(n_entities=6, n_relations=2))
        >>> task.knowable(task.examples("train", 1, seed=0)[0].prompt)
        True
        """
        return self._knowable(*self._parse_prompt(prompt))

    def _knowable(self, start: str, relations: Sequence[str]) -> bool:
        return all(self.usable_in_training(*p) for p in self._pairs(start, relations))

    def walk(self, start: str, relations: Sequence[str]) -> list[str]:
        """The gold completion symbols of a chain: ``[e0, r1, e1, ...]``, ending in
        ``<abstain>`` at the first pair without a fact."""
        out, e = [start], start
        for r in relations:
            out.append(r)
            e = self.facts.get((e, r))
            if e is None:
                out.append(ABSTAIN)
                break
            out.append(e)
        return out

    def _pairs(self, start: str, relations: Sequence[str]) -> list[tuple[str, str]]:
        """The (entity, relation) pairs a chain looks up, up to the first missing fact."""
        pairs, e = [], start
        for r in relations:
            pairs.append((e, r))
            e = self.facts.get((e, r))
            if e is None:
                break
        return pairs

    # -- examples --------------------------------------------------------------------
    def examples(self, split: str, n: int, seed: int, hops: int | None = None,
                 where: Callable[[str, list[str]], bool] | None = None) -> list[Example]:
        """``n`` chains of the split (:data:`KB_SPLITS`: train, held-out, or two parts of held-out
        never learned from: :data:`PRACTISED` chains outside the learning part, :data:`HARD` chains
        with an evaluation-only look-up); ``hops`` fixes the chain length (default: 1..max_hops);
        ``where(start, relations)``, if given, must accept a chain (a grown world's new or old
        chains)."""
        check_split(split, KB_SPLITS)
        check_count("n", n)
        if hops is not None and not (isinstance(hops, int) and 1 <= hops):
            raise ValueError(f"hops must be an int >= 1 or None, got {hops!r}")
        rng = rng_for(seed, "kb_walk", split, hops)
        hashed = "train" if split == "train" else "heldout"  # PRACTISED and HARD: held-out chains
        salt = self.config.world_seed
        out = []
        for _ in range(n):
            for _ in range(_MAX_TRIES):
                k = hops or rng.randint(1, self.config.max_hops)
                start = rng.choice(self.entities)
                rels = [rng.choice(self.relations) for _ in range(k)]
                key = " ".join([start, *rels])
                if split_of(key, self.config.heldout_fraction, salt=salt) != hashed:
                    continue
                if where is not None and not where(start, rels):
                    continue
                if self._in_split(split, start, rels):
                    break
            else:
                raise ValueError(f"could not draw a {split} chain in {_MAX_TRIES} tries: the "
                                 "world has too "
                                 f"few common facts or usable pairs for this split")
            out.append(Example(" ".join([start, *rels, "="]), " ".join(self.walk(start, rels))))
        return out

    def _in_split(self, split: str, start: str, relations: list[str]) -> bool:
        """Whether a chain the hash puts in the train or held-out split belongs to ``split``."""
        if split == "train":
            return self._knowable(start, relations)
        if split == "heldout":
            return True
        kind = self._kind(start, relations)
        if split == HARD:
            return kind in HARD_KINDS
        return kind == PRACTISED and not self.learning_part(" ".join([start, *relations, "="]))

    def examples_by_length(self, split: str, n: int, seed: int) -> dict[int, list[Example]]:
        """``n`` chains of the split for each number of hops, 1 … ``max_hops``."""
        return {k: self.examples(split, n, seed, hops=k)
                for k in range(1, self.config.max_hops + 1)}

    def _parse_prompt(self, prompt: str) -> tuple[str, list[str]]:
        parts = prompt.split()
        if (len(parts) < 3 or parts[-1] != "=" or parts[0] not in self._entity_set
                or any(r not in self.relations for r in parts[1:-1])):
            raise ValueError(f"not a kb_walk prompt (expected 'entity relation ... ='): {prompt!r}")
        return parts[0], parts[1:-1]

    def gold(self, prompt: str) -> str:
        start, rels = self._parse_prompt(prompt)
        return " ".join(self.walk(start, rels))

    def pretraining_documents(self, seed: int) -> list[str]:
        """Every fact ``counts[fact]`` times as ``e r e' .``, shuffled into documents."""
        return self._documents(self.counts, seed, "kb_walk-pretrain")

    def replay_documents(self, seed: int) -> list[str]:
        """The pre-training documents without their sentences that state an evaluation-only fact:
        SFT's replay shows again only what post-training may learn (a document left empty is
        dropped).

        >>> task = KBWalk(KBWalkConfig(n_entities=12, n_relations=2))
        >>> hidden = [f"{e} {r} {x} ." for (e, r), x in task.facts.items()
        ...           if task.evaluation_only(e, r)]
        >>> any(h in d for d in task.replay_documents(0) for h in hidden)
        False
        """
        out = []
        for doc in self.pretraining_documents(seed):
            words = doc.split()
            kept = [" ".join(words[i:i + 4]) for i in range(0, len(words), 4)
                    if not self.evaluation_only(words[i], words[i + 1])]
            if kept:
                out.append(" ".join(kept))
        return out

    def _documents(self, counts: dict[tuple[str, str], int], seed: int, tag: str) -> list[str]:
        """Each fact of ``counts`` as often as it says, shuffled (seeded by ``seed`` and ``tag``)
        into documents."""
        rng = rng_for(seed, tag)
        sentences = [f"{e} {r} {self.facts[(e, r)]} ." for (e, r), c in counts.items()
                     for _ in range(c)]
        rng.shuffle(sentences)
        k = self.config.facts_per_document
        return [" ".join(sentences[i:i + k]) for i in range(0, len(sentences), k)]

    # -- verification ------------------------------------------------------------------
    def claims(self, prompt: str, completion: str | Sequence[str]) -> list[Claim]:
        """One claim per step ``r_i x_i``, judged against the entity the completion reached.

        A wrong start entity, a relation that is not the prompt's, a non-entity answer or a
        step beyond the prompt's chain is MALFORMED. The claim is ``correct`` when it equals
        the gold walk at that step."""
        start, rels = self._parse_prompt(prompt)
        said = completion_symbols(completion)
        gold = self.walk(start, rels)
        claims: list[Claim] = []
        if not said:
            return claims
        if said[0] != start:
            return [Claim(0, len(said), " ".join(said), MALFORMED, False)]
        e = start
        for i in range(1, len(said), 2):
            step = said[i:i + 2]
            text, j = " ".join(step), (i - 1) // 2
            correct = said[:i + 2] == gold[:i + 2]
            if len(step) < 2 or j >= len(rels) or step[0] != rels[j]:
                claims.append(Claim(i, i + len(step), text, MALFORMED, False))
                break
            r, x = step
            truth = self.facts.get((e, r))
            if x == ABSTAIN:
                status = ABSTAINED
            elif x not in self._entity_set:
                status = MALFORMED
            elif truth is None:
                status = UNSUPPORTED
            else:
                status = SUPPORTED if x == truth else CONTRADICTED
            claims.append(Claim(i, i + 2, text, status, correct))
            if status in (ABSTAINED, MALFORMED):
                break
            e = x
        return claims

    def abstention_warranted(self, prompt: str, completion: str | Sequence[str],
                             claim: Claim) -> bool:
        """True where the entity the completion reached has no fact for the relation it asks:
        abstaining is then right in that state, even off the gold walk."""
        if claim.status != ABSTAINED:
            raise ValueError(f"claim must be an abstention (status {ABSTAINED!r}), got status "
                             f"{claim.status!r}")
        said = completion_symbols(completion)
        return (said[claim.start - 1], said[claim.start]) not in self.facts

    def plausible_error(self, example: Example, position: int, rng: random.Random) -> str:
        """At an entity: another entity that is some fact's answer for the same relation; at a
        relation: another relation; at ``<abstain>``: an entity (a made-up answer)."""
        gold = example.completion.split()
        if not 0 <= position < len(gold):
            raise ValueError(f"position must be in [0, {len(gold)}), got {position!r}")
        right = gold[position]
        if right in self.relations and len(self.relations) > 1:
            return rng.choice([r for r in self.relations if r != right])
        if position > 0 and gold[position - 1] in self.relations:
            rel = gold[position - 1]
            pool = sorted({t for (e, r), t in self.facts.items() if r == rel and t != right})
            if pool:
                return rng.choice(pool)
        return rng.choice([e for e in self.entities if e != right])
