"""Chapter 11's retrieved context for SFT: kb_walk fact passages in a share of the SFT prompts.

**Retrieved context** (:class:`RetrievedContext`): SFT examples with eq. (11)'s x' (kb_walk fact passages,
:func:`halluc_lab.evaluation.retrieval.rag_prompt`) in place of x for a share of them, 1–k passages each: every
supporting passage kept with probability ``keep_gold``, the other slots distractors (facts training may
show), all in random order. It teaches the *format*: find the fact in the context when it is there, recall
it when it is not. By itself it cannot teach that reading beats memory: train chains never pass through a
rare fact, so every gold passage states a common fact the model already knows. ``counterfactual`` adds
examples where a passage names another entity and the answer follows it, where only reading is rewarded.
A rare fact is never shown, not even as a distractor: after this SFT it is still known only from its 1–3
pre-training sentences. 001 says RAG "does not modify θ*"; this is the common practice of fine-tuning on
retrieved context too, so chapter 11 can compare a model that never saw x' with ones trained on it. The
passages are drawn from the world (gold kept at random, distractors uniform), not by a retriever.
"""

from __future__ import annotations

import dataclasses
import numbers
import random
import weakref
from dataclasses import dataclass

from halluc_lab.evaluation.retrieval import fact_passages, rag_prompt, walk_passages
from halluc_lab.model.tokenizer import ABSTAIN
from halluc_lab.tasks.base import Example


# -- retrieved context (chapter 11) -----------------------------------------------------------------


@dataclass(frozen=True)
class _World:
    """A kb_walk world's passages, built once per task object: texts, fact → id, the ids training may show."""

    texts: tuple[str, ...]  # fact_passages(task)
    ids: dict[tuple[str, str], int]  # (entity, relation) -> passage id
    trainable: tuple[int, ...]  # ids of the facts usable in training (common facts), in id order


_WORLDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # task -> _World


def _world(task) -> _World:
    if not all(hasattr(task, a) for a in ("facts", "usable_in_training", "knowable")):
        raise TypeError(f"task must be a kb_walk task (facts to show as passages), got {type(task).__name__}")
    world = _WORLDS.get(task)
    if world is None:
        world = _World(tuple(fact_passages(task)), {fact: i for i, fact in enumerate(task.facts)},
                       tuple(i for i, (e, r) in enumerate(task.facts) if task.usable_in_training(e, r)))
        _WORLDS[task] = world
    return world


def _swapped_walk(task, prompt: str, symbols: list[str], rng: random.Random,
                  tries: int = 20) -> tuple[list[str], tuple[str, str, str]] | None:
    """A counterfactual walk: one fact of the walk, drawn uniformly, names another entity, and the walk goes on
    from that entity through the world; with the swapped (entity, relation, entity). None when the walk looks up
    no fact or ``tries`` candidates all fail: the walk on must be one training may show (no rare fact, no
    reserved pair) and must not look the swapped pair up again (the passage and the world would disagree)."""
    relations = prompt.split()[1:-1]
    steps = [j for j in range(len(symbols) // 2) if symbols[2 * j + 2] != ABSTAIN]  # hops that found a fact
    if not steps:
        return None
    j = rng.choice(steps)
    head, relation, true = symbols[2 * j:2 * j + 3]
    for _ in range(tries):
        other = rng.choice(task.entities)
        if other in (head, true):
            continue
        walk, e, ok = [*symbols[:2 * j + 2], other], other, True
        for r in relations[j + 1:]:
            walk.append(r)
            if (e, r) == (head, relation) or not task.usable_in_training(e, r):
                ok = False
                break
            e = task.facts.get((e, r))
            walk.append(ABSTAIN if e is None else e)
            if e is None:
                break
        if ok and (head, relation) not in list(zip(walk[0:2 * j:2], walk[1:2 * j:2])):
            return walk, (head, relation, other)
    return None


@dataclass(frozen=True)
class RetrievedContext:
    """Passages prepended to a share of SFT prompts, so the fine-tuned model learns to read x' (eq. 11).

    An example drawn for context gets k passages, k uniform in 1 … ``passages`` (a retriever's top k and a
    chain's supporting facts come in every number; a fixed k lets a model tie the answer to where the prompt
    starts): each fact its walk looks up (:func:`halluc_lab.evaluation.retrieval.supporting_passages`) kept with
    probability ``keep_gold`` — a uniform subset of k of them when more than k are kept — and the remaining
    slots filled with distractors, drawn uniformly without replacement from the facts training may show
    (``task.usable_in_training``: never a rare fact) other than the walk's own (a dropped gold passage does not
    come back as a distractor). The k passages are shuffled. The module docstring says what this teaches and
    what it cannot.

    ``counterfactual``: in that share of the augmented examples, one fact of the walk (a uniform hop that
    finds a fact) is shown as a passage naming another entity, and the completion follows the passage: that
    entity, then the walk on from it through the world (its facts' passages kept like the others). Training
    then has cases where the passage, not memory, gives the answer: it teaches the model to read, and to
    believe what it reads. A candidate whose walk on would show a rare fact or a reserved pair, or look the
    swapped pair up again, is redrawn; after 20 failures the example keeps its true walk.
    """

    share: float = 0.5  # share of SFT examples that get passages; the rest stay plain (answering without retrieval)
    passages: int = 4  # the most passages prepended to an example that gets any (each adds 4 tokens)
    keep_gold: float = 0.5  # each supporting passage is kept with this probability (else: recall from memory)
    counterfactual: float = 0.0  # share of the augmented examples with one fact's passage and the answer swapped

    def __post_init__(self):
        for name in ("share", "keep_gold", "counterfactual"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
        if isinstance(self.passages, bool) or not isinstance(self.passages, int) or self.passages < 1:
            raise ValueError(f"passages must be an int >= 1, got {self.passages!r}")

    def augment(self, task, example: Example, rng: random.Random) -> Example:
        """``example`` with its prompt replaced by ``rag_prompt(passages, prompt)``, or unchanged when it draws no
        context (probability 1 − ``share``); the completion is unchanged unless a counterfactual passage is drawn.
        Deterministic given ``rng``.

        ``task`` is the :class:`~halluc_lab.tasks.kb_walk.KBWalk` world of the example, which must be one
        training may use (``task.knowable``): a held-out chain through a rare fact would show that fact.
        A ValueError when the world has too few training facts to fill the k slots.
        """
        world = _world(task)
        if not isinstance(example, Example):
            raise TypeError(f"example must be an Example, got {type(example).__name__}")
        if not task.knowable(example.prompt):
            raise ValueError(f"example {example.prompt!r} looks up a rare fact or a pair reserved for evaluation: "
                             f"retrieved context is for training examples, which never show those")
        if self.passages > len(world.trainable):
            raise ValueError(f"passages={self.passages} would need up to {self.passages} distractors but the world has "
                             f"only {len(world.trainable)} training facts")
        if rng.random() >= self.share:
            return example
        k = rng.randint(1, self.passages)
        symbols, fake = example.completion.split(), None
        if self.counterfactual > 0 and rng.random() < self.counterfactual:
            swapped = _swapped_walk(task, example.prompt, symbols, rng)
            if swapped is not None:  # some walks have no fact, or no other entity to walk on from
                symbols, fake = swapped
        swapped_fact = world.ids[fake[:2]] if fake else None  # its true passage is never shown
        gold = [i for i in walk_passages(task, symbols, world.ids) if i != swapped_fact]  # the walk's true facts
        kept = [i for i in gold if rng.random() < self.keep_gold]
        room = k - (fake is not None)  # the counterfactual passage is always shown
        if len(kept) > room:
            kept = rng.sample(kept, room)
        need = room - len(kept)
        avoid = set(gold) | ({swapped_fact} if fake else set())  # distractors: neither the walk's nor the swapped
        # A uniform sample of the training facts, the walk's own left out.
        drawn = rng.sample(world.trainable, min(len(world.trainable), need + len(avoid)))
        distractors = [i for i in drawn if i not in avoid][:need]
        if len(distractors) < need:
            raise ValueError(f"{k} passages need {need} distractors but the world has only "
                             f"{len(distractors)} training facts besides the chain's own")
        texts = [world.texts[i] for i in kept + distractors] + ([" ".join([*fake, "."])] if fake else [])
        rng.shuffle(texts)  # the gold passages anywhere, not always first
        if fake:
            example = dataclasses.replace(example, completion=" ".join(symbols))
        return dataclasses.replace(example, prompt=rag_prompt(texts, example.prompt))
