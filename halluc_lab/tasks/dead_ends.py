"""Dead ends: path-star graphs whose wrong first step becomes certain k tokens after it is written.

Chapter 10's fair test of taking a token back. kb_walk's errors are missing knowledge: after a wrong
entity the walk drifts on coherently and nothing later shows the mistake, so a ``<bksp>`` has
nothing to react to. The published work that finds backtracking helps uses tasks where an error
becomes detectable after it is written: Physics of Language Models 2.2 (Ye et al. 2024: retry data
with a [BACK] token in pre-training; fine-tuning alone did not teach correction), Self-Backtracking
(Yang et al. 2025, Countdown), Qin et al. 2025 ("To Backtrack or Not to Backtrack": sequential
search loses to parallel best-of-N on Countdown at fixed compute and wins on Sudoku, and RL helps
the models that can backtrack), SequenceMatch (Cundy & Ermon 2023: a backspace action to leave
off-distribution states). This task puts the delay between an error and its evidence under one
parameter, k, and keeps the search the first step needs apart from it.

* **The graph** is :mod:`~halluc_lab.tasks.path_star`'s: a centre with ``degree`` arms, labels
  drawn at random, the edges listed in random order. The prompt names the centre and the goal:
  ``edges / centre goal =``. The only decision is the first step (which arm); every later node is
  forced (the one child). Without search a first step is right 1/degree of the time (Bachmann &
  Nagarajan 2024: a teacher-forced model learns the later steps by copying "the node after the one
  I wrote" and guesses the first).
* **The answer's length is fixed, apart from k.** The goal's arm has ``length`` = L nodes after the
  centre and the answer walks all of them, so finding the first step from the goal is L − 1 hops of
  backward chaining whatever k is. A first sizing (every arm k + 1 nodes long) tied the two: at
  k = 1, 2 the goal was the first node's child or grandchild, the clean model found the first step
  every time, and no error was left to take back (book/results/rlvr.md).
* **k = reveal**, in [1, L − 1]: every wrong arm has k + 1 nodes, so a wrong first node is followed
  k tokens later by its arm's leaf: a dead end that is not the goal, from which no edge leads on.
  The error is then certain to anyone who reads the edges of the written nodes, without any search
  (:meth:`DeadEnds.dead_end`). At k = L − 1 every arm has L nodes and the dead end is the answer's
  last node.
* **Never** (``reveal=None``), the control that behaves like kb_walk: every arm has L + 1 nodes and
  the answer writes L of them, so a wrong arm is walked coherently to the answer's end and no dead
  end is ever written. The goal, named in the prompt, is the leaf one node past the answer (L hops
  back to the first node). Answers are as long as the k worlds'.
* **What a look-ahead buys a model that cannot take back.** Where the wrong arms are shorter than
  the goal's (k + 1 < L), the first step has a second solution besides chaining back from the goal:
  look k + 1 nodes ahead along each arm and take the one that does not end there (k look-ups, then
  "does this node have an edge out?"). At k = 1 that is two hops, against L − 1 = 4 back from the
  goal at L = 5. So a clean model may plan around a near dead end without ever writing it; if it
  does at small k, that is a finding of the test (the take-back pays only where the look-ahead is
  too deep to plan), not a flaw to tune away. At k = L − 1 the arms are equally long and the only
  plan is the full chain from the goal.
* **The verifier** is the shared exact-match reward with abstention: right (the gold path, after
  ``<bksp>`` erasures), abstained (``<abstain>`` after nothing but a start of the gold path), wrong.
  Claims: each written edge, supported when the graph has it; an ``<abstain>`` is ABSTAINED.
  :meth:`DeadEnds.reaches_goal` is the check a model could run on its own answer (its last node is
  the goal), which best-of-N selects by.
* **Retry data** (Ye et al. 2024, §3 of the fair-test design): :meth:`DeadEnds.retry_completion`
  walks a wrong arm to its leaf, presses ``<bksp>`` once per wrong node (k + 1 of them, back to the
  branch, the centre) and writes the gold path; the context keeps everything ("keep") and every
  token is a target, the wrong ones included, as in 2.2's retry data. A pre-training corpus has
  ``retry_fraction`` of its documents so; its clean control is the same config with
  ``retry_fraction=0``: the same graphs in the same order, as many tokens (``pretrain_tokens``,
  exactly, :func:`fit_tokens`). :func:`halluc_lab.stages.sft.retry_demonstration` gives SFT the
  same data.

Departures: Ye et al. retry at any step with a random wrong parameter; here the one decision is the
first step, and a retry always walks the whole wrong arm (the error is only visible at its leaf).
Qin et al.'s Countdown and Sudoku have many decisions per answer; this task has one, so its search
is shallow, and a larger ``degree`` or ``length`` is the way to make it harder.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from halluc_lab.tasks.base import (ABSTAINED, Claim, Example, check_count, check_fraction,
                                   completion_symbols, rng_for, split_of)
from halluc_lab.tasks.path_star import PathStar
from halluc_lab.model.tokenizer import ABSTAIN, BKSP

DOC_OVERHEAD = 2  # tokens a pre-training document adds to its symbols: <bos> and <eos>


@dataclass(frozen=True)
class DeadEndsConfig:
    """The graphs, when a wrong first step shows, and the pre-training corpus."""

    degree: int = 2  # arms leaving the centre: a first step guessed without search: right 1/degree
    reveal: int | None = 2  # k in [1, length - 1]: a wrong first node meets its leaf k tokens later
    length: int = 5  # L: nodes the answer writes after the centre (the goal's arm; never: 1 short)
    n_nodes: int = 20  # node labels are 0 .. n_nodes - 1
    heldout_fraction: float = 0.1  # fraction of (graph, goal) pairs held out
    pretrain_tokens: int = 200_000  # tokens of the pre-training corpus, <bos>/<eos> included
    retry_fraction: float = 0.0  # share of pre-training documents: a wrong arm, <bksp>, the path
    split_seed: int = 0  # salt of the train/held-out hash

    def __post_init__(self):
        check_count("degree", self.degree, 2)
        check_count("length", self.length, 2)
        if self.reveal is not None:
            check_count("reveal", self.reveal, 1, self.length - 1)  # a wrong arm fits the answer
        check_count("pretrain_tokens", self.pretrain_tokens, 1)
        check_count("split_seed", self.split_seed)
        check_fraction("heldout_fraction", self.heldout_fraction)
        check_fraction("retry_fraction", self.retry_fraction, zero_ok=True)
        if self.reveal is None and self.retry_fraction > 0:
            raise ValueError(f"retry_fraction must be 0 when reveal is None (no dead end is "
                             f"written, nothing to take back), got {self.retry_fraction!r}")
        need = 1 + self.gold_arm + (self.degree - 1) * self.wrong_arm
        n = self.n_nodes
        if isinstance(n, bool) or not isinstance(n, int) or n < need:
            raise ValueError(f"n_nodes must be an int >= 1 + the goal's arm + (degree - 1) * a "
                             f"wrong arm = {need}, got {self.n_nodes!r}")

    @property
    def gold_arm(self) -> int:
        """Nodes on the goal's arm after the centre."""
        return self.length if self.reveal is not None else self.length + 1

    @property
    def wrong_arm(self) -> int:
        """Nodes on every other arm after the centre."""
        return self.reveal + 1 if self.reveal is not None else self.length + 1

    reverse_path = False  # what PathStar's parsing reads: answers are written centre first


def fit_tokens(documents: Iterator[str], budget: int) -> list[str]:
    """Documents from ``documents`` until they hold exactly ``budget`` tokens (each document's
    symbols plus :data:`DOC_OVERHEAD`): the last one is cut to fit, and where fewer than three
    tokens would be left for it the one before gives up symbols, so two corpora of one budget are
    token-matched whatever their documents.

    >>> fit_tokens(iter(["a b c", "d e f g", "h i"]), 9)
    ['a b c', 'd e']
    >>> fit_tokens(iter(["a b c", "d e f g", "h i"]), 6)  # 3 + 3: the first gives up two symbols
    ['a', 'd']
    """
    check_count("budget", budget, DOC_OVERHEAD + 1)
    out: list[str] = []
    used = 0
    for doc in documents:
        symbols = doc.split()
        room = budget - used - DOC_OVERHEAD
        if len(symbols) < room:
            out.append(doc)
            used += len(symbols) + DOC_OVERHEAD
            if budget - used < DOC_OVERHEAD + 1:  # no room for another: this one gives some back
                short = DOC_OVERHEAD + 1 - (budget - used)
                if len(symbols) <= short:
                    raise ValueError(f"a document of {len(symbols)} symbols cannot give up {short} "
                                     f"to fit the budget of {budget} tokens")
                out[-1] = " ".join(symbols[:len(symbols) - short])
                used -= short
            continue
        out.append(" ".join(symbols[:room]))
        return out
    raise ValueError(f"documents ran out before {budget} tokens")


class DeadEnds(PathStar):
    """Path-star graphs whose wrong arms are exposed ``reveal`` tokens after the wrong first node.

    >>> task = DeadEnds(DeadEndsConfig(degree=2, reveal=1, length=2, n_nodes=5))
    >>> task.gold("0 1 , 1 2 , 0 3 , 3 4 / 0 4 =")
    '0 3 4'
    >>> task.dead_end("0 1 , 1 2 , 0 3 , 3 4 / 0 4 =", "0 1 2")  # the leaf 2 is not the goal
    True
    """

    name = "dead_ends"
    config_type = DeadEndsConfig

    def __init__(self, config: DeadEndsConfig = DeadEndsConfig()):
        if not isinstance(config, DeadEndsConfig):
            raise TypeError(f"config must be a DeadEndsConfig, got {type(config).__name__}")
        super().__init__(config)

    def _graph(self, rng: random.Random) -> tuple[list[list[int]], int]:
        """Arms (each starting at the centre) and the index of the goal's arm: the goal's arm has
        ``gold_arm`` nodes after the centre, every other arm ``wrong_arm``."""
        c = self.config
        goal_arm = rng.randrange(c.degree)
        sizes = [c.gold_arm if i == goal_arm else c.wrong_arm for i in range(c.degree)]
        labels = iter(rng.sample(range(c.n_nodes), 1 + sum(sizes)))
        centre = next(labels)
        return [[centre, *itertools.islice(labels, n)] for n in sizes], goal_arm

    def _example(self, arms: list[list[int]], goal_arm: int,
                 edges: list[tuple[int, int]]) -> Example:
        ex = super()._example(arms, goal_arm, edges)
        return Example(ex.prompt, self._cut(ex.completion))

    def _cut(self, path: str) -> str:
        """The path from the centre cut to the answer's ``length`` nodes (all unless never)."""
        return " ".join(path.split()[:1 + self.config.length])

    def gold(self, prompt: str) -> str:
        return self._cut(super().gold(prompt))

    def examples_by_length(self, split: str, n: int, seed: int) -> dict[int, list[Example]]:
        """Every answer has ``length + 1`` nodes: one group of ``n`` examples."""
        return {self.config.length + 1: self.examples(split, n, seed)}

    def learning_part(self, prompt: str) -> bool:
        """The part of the held-out split that post-training learns from, decided by the graph (its
        edge set, centre and goal), not by the prompt's text: one graph listed in another edge order
        lies in the same part, so no graph of the evaluated part is ever an RL prompt. Half of the
        held-out graphs, by a hash independent of the train/held-out one.

        >>> task = DeadEnds(DeadEndsConfig(reveal=1, length=2, n_nodes=5))
        >>> one, reordered = "0 1 , 1 2 , 0 3 / 0 2 =", "0 3 , 0 1 , 1 2 / 0 2 ="
        >>> task.learning_part(one) == task.learning_part(reordered)
        True
        """
        edges, centre, goal = self.parse(prompt)
        key = f"{sorted((int(u), int(v)) for u, v in edges)}|{centre}|{goal}"
        return split_of(key, 0.5, salt=9) == "heldout"

    # -- the evidence ------------------------------------------------------------------------------
    def dead_end(self, prompt: str, completion: str | Sequence[str]) -> bool:
        """Whether what a completion finally says (``<bksp>`` applied) ends at a node from which no
        edge leads, that is not the goal: its wrong first step is then certain from the written
        nodes alone."""
        edges, _, goal = self.parse(prompt)
        said = completion_symbols(completion)
        return bool(said) and said[-1] != goal and not any(u == said[-1] for u, _ in edges)

    def reaches_goal(self, prompt: str, completion: str | Sequence[str]) -> bool:
        """The check a model could run on its own answer, without knowing the gold one: what the
        completion finally says is a walk along the graph's edges from the centre that ends at the
        goal named in the prompt (in never, the node before the goal: the answer stops one short).
        Best-of-N selects by it (:func:`halluc_lab.evaluation.evaluate.best_of_n_matched`)."""
        edges, centre, goal = self.parse(prompt)
        said = completion_symbols(completion)
        if len(said) != 1 + self.config.length or said[0] != centre:
            return False
        walk = all((u, v) in edges for u, v in zip(said, said[1:]))
        end = said[-1] if self.config.reveal is not None else next(
            (v for u, v in edges if u == said[-1]), None)
        return walk and end == goal

    def claims(self, prompt: str, completion: str | Sequence[str]) -> list[Claim]:
        """PathStar's claims (the first node, then each written edge) up to an ``<abstain>``, which
        is one ABSTAINED claim; abstaining is never what the gold answer does (every goal has a
        path)."""
        said = completion_symbols(completion)
        if ABSTAIN not in said:
            return super().claims(prompt, said)
        stop = said.index(ABSTAIN)
        out = super().claims(prompt, said[:stop]) if stop else []
        return [*out, Claim(stop, stop + 1, ABSTAIN, ABSTAINED, False)]

    # -- retry data (Physics of LMs 2.2) ------------------------------------------------------
    def retry_completion(self, example: Example, rng: random.Random) -> str:
        """The example's answer after a detour: the centre, a wrong arm (uniform among the others)
        walked to its leaf, one ``<bksp>`` per wrong node (back to the centre), then the gold nodes
        after the centre.

        >>> task = DeadEnds(DeadEndsConfig(degree=2, reveal=1, length=2, n_nodes=5))
        >>> ex = Example("0 1 , 1 2 , 0 3 , 3 4 / 0 4 =", "0 3 4")
        >>> task.retry_completion(ex, random.Random(0))
        '0 1 2 <bksp> <bksp> 3 4'
        """
        if self.config.reveal is None:
            raise ValueError("retry data needs a dead end inside the answer: reveal must be an "
                             "int, got None (never)")
        edges, centre, _ = self.parse(example.prompt)
        gold = example.completion.split()
        child = {u: v for u, v in edges if u != centre}
        wrong = [rng.choice(sorted(v for u, v in edges if u == centre and v != gold[1]))]
        while wrong[-1] in child:
            wrong.append(child[wrong[-1]])
        return " ".join([centre, *wrong, *[BKSP] * len(wrong), *gold[1:]])

    def pretraining_documents(self, seed: int) -> list[str]:
        """Train examples ``prompt completion``, ``retry_fraction`` of them with a
        :meth:`retry_completion`, until ``pretrain_tokens`` tokens (:func:`fit_tokens`). The graphs
        and the retry draws have streams of their own, so a clean control (``retry_fraction=0``)
        holds the same graphs in the same order, and more of them."""
        graphs, retries = rng_for(seed, "dead_ends-pretrain"), rng_for(seed, "dead_ends-retry")

        def documents() -> Iterator[str]:
            while True:
                ex = self._draw(graphs, "train")
                retry = retries.random() < self.config.retry_fraction
                answer = self.retry_completion(ex, retries) if retry else ex.completion
                yield f"{ex.prompt} {answer}"
        return fit_tokens(documents(), self.config.pretrain_tokens)
