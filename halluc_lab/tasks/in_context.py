"""In-context learning: a fresh rule in every prompt, given only by its examples.

Chapter 12 (001 Part 5 §1: y ~ p(y | P, x; θ), P a prompt of input–output demonstrations, x a query,
θ fixed). Every prompt draws its own rule, x ↦ x + c (mod 10) with a shift c in 1–9 that the prompt
never names, shows ``shots`` demonstrations of it and asks for a query::

    3 > 8 ; 6 > 1 ; 9 >          gold: 4          (c = 5)

One demonstration fixes c, so a model that infers the rule from the context answers any query. With
no demonstration the prompt does not determine the answer, and the right completion is
``<abstain>``: a digit there is a guess, right one time in nine. The weights cannot hold the answer:
across prompts every query digit maps to every answer. This is 001's "7 ↦ 49" in form — a rule
learnt from the prompt alone — small enough for the lab's models.

* **Splits**: a prompt (its demonstrations and query) is train or held-out by a hash, so held-out
  prompts are new combinations; the rules themselves are the same nine in both.
* **Pre-training** documents are train prompts with their answers, ``… ; 9 > 4 .``, back to back,
  with 0 to ``max_shots`` demonstrations each.
* **Claims**: the answer is one claim, supported when it is the rule's value.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from halluc_lab.tasks.base import (ABSTAINED, CONTRADICTED, MALFORMED, SUPPORTED, UNSUPPORTED,
                                   Claim, Example, Task, check_count, check_fraction, check_split,
                                   completion_symbols, document, rng_for, split_of)
from halluc_lab.model.tokenizer import ABSTAIN

DIGITS = tuple("0123456789")
_MAX_TRIES = 10_000  # rejection-sampling budget per example


@dataclass(frozen=True)
class InContextConfig:
    """How many demonstrations a prompt shows, the split and the corpus size."""

    # a prompt shows 0 .. max_shots demonstrations (distinct inputs, the query not among them)
    max_shots: int = 4
    heldout_fraction: float = 0.2  # fraction of prompts held out
    n_pretrain_documents: int = 2000  # documents in the pre-training corpus
    prompts_per_document: int = 4  # prompts (with answers) per document
    split_seed: int = 0  # salt of the train/held-out hash

    def __post_init__(self):
        check_count("max_shots", self.max_shots, 0, len(DIGITS) - 1)
        check_fraction("heldout_fraction", self.heldout_fraction)
        check_count("n_pretrain_documents", self.n_pretrain_documents, 1)
        check_count("prompts_per_document", self.prompts_per_document, 1)
        check_count("split_seed", self.split_seed)


class InContext(Task):
    """Prompts whose rule, x ↦ x + c (mod 10), is given only by their demonstrations.

    >>> task = InContext()
    >>> task.gold("3 > 8 ; 6 > 1 ; 9 >")
    '4'
    >>> task.reward(["3 > 8 ; 9 >"], ["4"]), task.reward(["3 > 8 ; 9 >"], ["5"])
    ([1.0], [0.0])
    """

    name = "in_context"
    config_type = InContextConfig

    def __init__(self, config: InContextConfig = InContextConfig()):
        self.config = config

    def symbols(self) -> tuple[str, ...]:
        return DIGITS + (">", ";", ".")

    @staticmethod
    def example(shift: int, shown: Sequence[int], query: int) -> Example:
        """The prompt showing ``shown`` under x ↦ x + ``shift`` (mod 10), then asking for
        ``query``."""
        if not 1 <= shift <= 9 or query in shown or len(set(shown)) != len(shown) \
                or not all(0 <= x <= 9 for x in (*shown, query)):
            raise ValueError("need a shift in 1..9 and distinct digits with the query "
                             "not shown, got "
                             f"shift={shift}, shown={list(shown)}, query={query}")
        pairs = [f"{x} > {(x + shift) % 10} ;" for x in shown]
        return Example(" ".join([*pairs, f"{query} >"]),
                       str((query + shift) % 10) if shown else ABSTAIN)

    def split(self, prompt: str) -> str:
        """The split of a prompt."""
        return split_of(prompt, self.config.heldout_fraction, salt=self.config.split_seed)

    def _draw(self, rng: random.Random, split: str, shots: int | None) -> Example:
        for _ in range(_MAX_TRIES):
            k = rng.randint(0, self.config.max_shots) if shots is None else shots
            digits = rng.sample(range(10), k + 1)
            ex = self.example(rng.randint(1, 9), digits[:k], digits[k])
            if self.split(ex.prompt) == split:
                return ex
        raise ValueError(f"could not draw a {split} prompt with {shots} shots "
                         f"in {_MAX_TRIES} tries")

    def examples(self, split: str, n: int, seed: int, shots: int | None = None) -> list[Example]:
        """``n`` prompts of the split; ``shots`` fixes how many demonstrations each shows."""
        check_split(split)
        check_count("n", n)
        if shots is not None:
            check_count("shots", shots, 0, self.config.max_shots)
        rng = rng_for(seed, "in_context", split, shots)
        return [self._draw(rng, split, shots) for _ in range(n)]

    def examples_by_length(self, split: str, n: int, seed: int) -> dict[int, list[Example]]:
        """``n`` prompts of the split for each number of shots, 0 … ``max_shots`` (the task's
        measure of length)."""
        return {k: self.examples(split, n, seed, shots=k) for k in range(self.config.max_shots + 1)}

    def _parse(self, prompt: str) -> tuple[list[tuple[int, int]], int]:
        *pairs, last = prompt.split(";")
        try:
            shown = [tuple(int(v) for v in pair.split(">")) for pair in pairs]
            query = last.split()
            if len(query) != 2 or query[1] != ">" or any(len(p) != 2 for p in shown):
                raise ValueError
            return shown, int(query[0])
        except ValueError:
            raise ValueError("not an in-context prompt (expected 'x > y ; … ; q >'): "
                             f"{prompt!r}") from None

    def gold(self, prompt: str) -> str:
        shown, query = self._parse(prompt)
        shifts = {(y - x) % 10 for x, y in shown}
        if len(shifts) > 1 or 0 in shifts:
            raise ValueError(f"the demonstrations of {prompt!r} follow no rule x ↦ x + c (mod "
                             "10), c in 1..9")
        # no demonstration: nothing to go on
        return str((query + shifts.pop()) % 10) if shifts else ABSTAIN

    def pretraining_documents(self, seed: int) -> list[str]:
        """Train prompts with their answers, ``prompts_per_document`` per document."""
        rng = rng_for(seed, "in_context-pretrain")
        return [document([self._draw(rng, "train", None)
                          for _ in range(self.config.prompts_per_document)])
                for _ in range(self.config.n_pretrain_documents)]

    def claims(self, prompt: str, completion: str | Sequence[str]) -> list[Claim]:
        """One claim per symbol written; the first is the answer. A digit where the prompt shows no
        demonstration is unsupported (a guess), right or not; anything after the answer is
        unsupported too."""
        gold = self.gold(prompt)
        out = []
        for i, s in enumerate(completion_symbols(completion)):
            if s == ABSTAIN:
                status = ABSTAINED
            elif s not in DIGITS:
                status = MALFORMED
            elif i or gold == ABSTAIN:
                status = UNSUPPORTED
            else:
                status = SUPPORTED if s == gold else CONTRADICTED
            out.append(Claim(i, i + 1, s, status, i == 0 and s == gold))
        return out

    def plausible_error(self, example: Example, position: int, rng: random.Random) -> str:
        """The value under a neighbouring shift (one off); where the gold answer abstains, any
        digit."""
        if position != 0:
            raise ValueError(f"position must be 0 (the answer is one symbol), got {position!r}")
        if example.completion == ABSTAIN:
            return rng.choice(DIGITS)
        return str((int(example.completion) + rng.choice((-1, 1))) % 10)
