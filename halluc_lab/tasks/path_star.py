"""Path-star graphs: planning is hard, verifying is easy (Bachmann & Nagarajan, 2024).

Chapters 7–8 build the models; chapter 10 says why its RL experiment leaves the task out. A
path-star graph has a centre node with ``degree`` arms; each arm is a path of ``path_length - 1``
further nodes. Node labels are drawn at random from ``0 .. n_nodes-1``. The prompt lists the
directed edges (centre outwards) in random order, then asks for the path from the centre to the end
of one arm::

    prompt:      5 2 , 9 7 , 5 9 , 2 4 / 5 4 =
    completion:  5 2 4

Bachmann & Nagarajan ("The pitfalls of next-token prediction", ICML 2024) show that a
teacher-forced model learns every step except the first (it can copy "the node after the
one I just wrote" from the edge list: the *Clever Hans* cheat) and so picks the first arm
at chance, 1/degree. Checking a path is trivial. With ``reverse_path`` the answer is
written goal first, which removes the planning: every step is then a lookup.

* **Splits**: by a hash of the graph and query; pre-training uses train graphs only.
* **Pre-training** documents are whole train examples, ``prompt completion``.
* **Claims**: each written edge ``u v`` (consecutive nodes) is a claim, supported when the
  graph has it; the first node must be the start.

Departures: B&N use larger graphs (degree 2–5, path length 5–20, up to 100 labels); the
sizes here are configurable and the recipes pick small ones.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from halluc_lab.tasks.base import (MALFORMED, SUPPORTED, UNSUPPORTED, Claim, Example, Task,
                                   check_count, check_split, completion_symbols, rng_for, split_of)

_MAX_TRIES = 10_000  # rejection-sampling budget per example


@dataclass(frozen=True)
class PathStarConfig:
    """Graph shape, label space, answer order, split and corpus size."""

    degree: int = 2  # number of arms leaving the centre
    path_length: int = 4  # nodes on the answer path, centre and goal included
    n_nodes: int = 20  # node labels are 0 .. n_nodes - 1
    reverse_path: bool = False  # write the path goal first (removes the planning problem)
    heldout_fraction: float = 0.1  # fraction of (graph, query) pairs held out
    n_pretrain_documents: int = 2000  # documents (one example each) in the pre-training corpus
    split_seed: int = 0  # salt of the train/held-out hash

    def __post_init__(self):
        check_count("degree", self.degree, 1)
        check_count("path_length", self.path_length, 2)
        check_count("n_pretrain_documents", self.n_pretrain_documents, 1)
        check_count("split_seed", self.split_seed)
        need = 1 + self.degree * (self.path_length - 1)
        if not isinstance(self.n_nodes, int) or self.n_nodes < need:
            raise ValueError(f"n_nodes must be an int >= 1 + degree * (path_length - 1) = {need}, "
                             f"got {self.n_nodes!r}")
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {self.heldout_fraction!r}")


class PathStar(Task):
    """The path-star planning task.

    >>> task = PathStar(PathStarConfig(degree=2, path_length=3, n_nodes=5))
    >>> task.gold("0 1 , 1 2 , 0 3 , 3 4 / 0 4 =")
    '0 3 4'
    """

    name = "path_star"
    config_type = PathStarConfig

    def __init__(self, config: PathStarConfig = PathStarConfig()):
        self.config = config

    def symbols(self) -> tuple[str, ...]:
        return tuple(str(i) for i in range(self.config.n_nodes)) + (",", "/", "=")

    def _graph(self, rng: random.Random) -> tuple[list[list[int]], int]:
        """Arms (each starting at the centre) and the index of the goal arm."""
        c = self.config
        labels = rng.sample(range(c.n_nodes), 1 + c.degree * (c.path_length - 1))
        centre, rest = labels[0], labels[1:]
        arms = [[centre, *rest[i * (c.path_length - 1):(i + 1) * (c.path_length - 1)]]
                for i in range(c.degree)]
        return arms, rng.randrange(c.degree)

    def _example(self, arms: list[list[int]], goal_arm: int,
                 edges: list[tuple[int, int]]) -> Example:
        """The prompt (the edges in their drawn order, then the query) and the path."""
        path = arms[goal_arm][::-1] if self.config.reverse_path else arms[goal_arm]
        start, goal = arms[goal_arm][0], arms[goal_arm][-1]
        prompt = " , ".join(f"{u} {v}" for u, v in edges) + f" / {start} {goal} ="
        return Example(prompt, " ".join(map(str, path)))

    def examples(self, split: str, n: int, seed: int) -> list[Example]:
        """``n`` (graph, query) examples of the split."""
        check_split(split)
        check_count("n", n)
        rng = rng_for(seed, "path_star", split)
        return [self._draw(rng, split) for _ in range(n)]

    def examples_by_length(self, split: str, n: int, seed: int) -> dict[int, list[Example]]:
        """Every path has ``path_length`` nodes: one group of ``n`` examples."""
        return {self.config.path_length: self.examples(split, n, seed)}

    def _draw(self, rng: random.Random, split: str) -> Example:
        for _ in range(_MAX_TRIES):
            arms, goal_arm = self._graph(rng)
            edges = [(a[i], a[i + 1]) for a in arms for i in range(len(a) - 1)]
            rng.shuffle(edges)
            key = f"{sorted(edges)}|{arms[goal_arm][0]}|{arms[goal_arm][-1]}"
            # the split hashes the graph and query, not the text: a prompt is written only for a
            # graph that is kept (nine in ten draws of the held-out split are not)
            if split_of(key, self.config.heldout_fraction, salt=self.config.split_seed) == split:
                return self._example(arms, goal_arm, edges)
        raise ValueError(f"could not draw a {split} graph in {_MAX_TRIES} tries")

    def parse(self, prompt: str) -> tuple[set[tuple[str, str]], str, str]:
        """The edge set, start and goal of a prompt."""
        body, slash, query = prompt.partition("/")
        q = query.split()
        try:
            edges = {tuple(e.split()) for e in body.split(",")}
            ok = bool(slash) and len(q) == 3 and q[2] == "=" and all(len(e) == 2 for e in edges)
        except ValueError:
            ok = False
        if not ok:
            raise ValueError("not a path_star prompt (expected 'u v , u v ... / start goal "
                             f"='): {prompt!r}")
        return edges, q[0], q[1]

    def gold(self, prompt: str) -> str:
        edges, start, goal = self.parse(prompt)
        parent = {v: u for u, v in edges}
        path = [goal]
        while path[-1] != start:
            if path[-1] not in parent or len(path) > len(edges) + 1:
                raise ValueError(f"no path from {start} to {goal} in prompt {prompt!r}")
            path.append(parent[path[-1]])
        return " ".join(path if self.config.reverse_path else path[::-1])

    def pretraining_documents(self, seed: int) -> list[str]:
        """Whole train examples, one per document."""
        rng = rng_for(seed, "path_star-pretrain")
        return [f"{e.prompt} {e.completion}" for e in
                (self._draw(rng, "train") for _ in range(self.config.n_pretrain_documents))]

    def claims(self, prompt: str, completion: str | Sequence[str]) -> list[Claim]:
        """The first node (must be the start, or the goal when reversed), then one claim per
        edge."""
        edges, start, goal = self.parse(prompt)
        said = completion_symbols(completion)
        gold = self.gold(prompt).split()
        if not said:
            return []
        first = goal if self.config.reverse_path else start
        out = [Claim(0, 1, said[0], SUPPORTED if said[0] == first else MALFORMED, said[0] == first)]
        for i in range(1, len(said)):
            edge = (said[i], said[i - 1]) if self.config.reverse_path else (said[i - 1], said[i])
            status = SUPPORTED if edge in edges else UNSUPPORTED
            out.append(Claim(i - 1, i + 1, f"{said[i - 1]} {said[i]}", status,
                             said[:i + 1] == gold[:i + 1]))
        return out

    def plausible_error(self, example: Example, position: int, rng: random.Random) -> str:
        """A node at the same depth on another arm (the wrong branch), else another node."""
        gold = example.completion.split()
        if not 0 <= position < len(gold):
            raise ValueError(f"position must be in [0, {len(gold)}), got {position!r}")
        edges, _, _ = self.parse(example.prompt)
        children: dict[str, list[str]] = {}
        for u, v in edges:
            children.setdefault(u, []).append(v)
        path = gold[::-1] if self.config.reverse_path else gold
        depth = len(gold) - 1 - position if self.config.reverse_path else position
        frontier = [path[0]]
        for _ in range(depth):
            frontier = sorted(v for u in frontier for v in children.get(u, []))
        others = [v for v in frontier if v != gold[position]]
        if others:
            return rng.choice(others)
        nodes = sorted({n for e in edges for n in e} - {gold[position]})
        return rng.choice(nodes)
