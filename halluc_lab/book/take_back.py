"""Chapter 10's fair test of taking a token back: its arms, their records, its contrasts.

The test (:mod:`halluc_lab.tasks.dead_ends`) has four worlds — a wrong first step meets a dead end
k = 1, 2 or 4 tokens later, or never — and in each up to eight trained arms (the registry's
``dead_ends_*`` recipes, :data:`ARMS`): where ``<bksp>`` enters training ((a) retry data in
pre-training and SFT, (b) in SFT only, (c) nowhere) and RLVR from them with the key allowed or
masked during RL. :func:`train_and_measure` trains every arm under every seed, each seed its whole
chain, and measures each model once
(:class:`~halluc_lab.evaluation.fair_test.DeadEndsMeasure`, cached by
:func:`~halluc_lab.recipes.measured`): the SFT arms first, one process per pre-training root,
then every RLVR run in a process of its own, since several start from one SFT model.
:func:`preregistered_run` computes the chapter's pre-registered contrasts from the records.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from halluc_lab import recipes
from halluc_lab.evaluation import fair_test, stats
from halluc_lab.evaluation.stats import Interval

WORLDS = {"k = 1": "dead_ends_k1", "k = 2": "dead_ends_k2", "k = 4": "dead_ends_k4",
          "never": "dead_ends_never"}
LAM = 3.0  # the chapter's penalty of a wrong answer: C − 3W
MEASURE = {"smoke": fair_test.DeadEndsMeasure(n_eval=64, n_learn=32, samples=4),
           "full": fair_test.DeadEndsMeasure()}  # what each scale measures of every arm


@dataclass(frozen=True)
class Arm:
    """A trained arm: the world's corpus (``retry``: the retry corpus of (a)), the stage, and how
    it is decoded (``masked``: ``<bksp>`` masked, as during its RL or for the same weights)."""

    retry: bool
    stage: str
    masked: bool = False

    def recipe(self, world: str) -> str:
        """The registry's name of this arm in ``world`` (a :data:`WORLDS` value)."""
        return f"{world}{'_retry' if self.retry else ''}-{self.stage}"


ARMS = {"(c) clean": Arm(False, "sft-clean"),
        "(b) retry in SFT": Arm(False, "sft-retry"),
        "(a) retry in pre-training": Arm(True, "sft-retry"),
        "(a′) = (a), backspace masked": Arm(True, "sft-retry", masked=True),
        "RLVR from (a)": Arm(True, "rlvr-retry"),
        "RLVR from (a), masked in RL": Arm(True, "rlvr-retry-masked", masked=True),
        "RLVR from (b)": Arm(False, "rlvr-retry"),
        "RLVR from (c)": Arm(False, "rlvr-clean-bksp"),
        "RLVR from (c), masked in RL": Arm(False, "rlvr-clean-masked", masked=True)}


def arms(world: str) -> dict[str, Arm]:
    """The arms that exist in ``world`` (never has no retry corpus and no retry SFT)."""
    return {label: arm for label, arm in ARMS.items() if arm.recipe(world) in recipes.NAMES}


def _recipes(seeds: Sequence[int], scale: str) -> dict[tuple[str, int], recipes.Recipe]:
    names = {arm.recipe(w) for w in WORLDS.values() for arm in arms(w).values()}
    return {(n, s): recipes.with_seed(recipes.get(n, scale), s)
            for n in sorted(names) for s in seeds}


def _later(recipe: recipes.Recipe) -> bool:
    """Two stages or more from pre-training (RLVR from an SFT model)."""
    return recipe.parent is not None and recipe.parent.parent is not None


def train_and_measure(seeds: Sequence[int], rt, measure: fair_test.DeadEndsMeasure, *,
                      with_rl: bool = True) -> dict[tuple[str, str, int], dict]:
    """``{(world label, arm label, seed): record}`` for every arm of every world: trained and
    measured once (read from the cache after). On a GPU the SFT arms train one process per
    pre-training root, then each RLVR run in its own process (their SFT models cached by then).
    ``with_rl=False``: the SFT arms alone."""
    if isinstance(seeds, (str, bytes)) or not list(seeds):
        raise ValueError(f"seeds must be a non-empty sequence of ints >= 0, got {seeds!r}")
    todo = {k: r for k, r in _recipes(seeds, rt.scale).items() if with_rl or not _later(r)}
    missing = [r for r in todo.values() if not recipes.cached(r, measure, rt.device, rt.dtype)]
    later = [r for r in missing if _later(r)]
    first = [r for r in missing if not _later(r)]  # one stage from pre-training
    if first:
        recipes.prefetch(first, rt.device, rt.dtype, measure=measure)
    if later:
        recipes.prefetch(later, rt.device, rt.dtype, measure=measure, group_of=lambda r: r)
    return {(world, label, s): recipes.measured(todo[arm.recipe(name), s], measure, rt.device,
                                                rt.dtype)
            for world, name in WORLDS.items() for label, arm in arms(name).items() for s in seeds
            if (arm.recipe(name), s) in todo}


# -- reading the records ---------------------------------------------------------------------------
def decoded(record: Mapping, arm: Arm) -> Mapping:
    """The record's greedy answers as the arm decodes them (masked or not)."""
    return record["masked" if arm.masked else "greedy"]


def outcomes(records: Mapping, world: str, label: str, seeds: Sequence[int]) -> np.ndarray:
    """(seeds, graphs) outcome codes of an arm's greedy answers."""
    arm = ARMS[label]
    return fair_test.grid([records[world, label, s] for s in seeds],
                          lambda r: decoded(r, arm)["outcome"])


def tokens(records: Mapping, world: str, label: str, seeds: Sequence[int]) -> np.ndarray:
    """(seeds, graphs) tokens each greedy answer spent."""
    arm = ARMS[label]
    return fair_test.grid([records[world, label, s] for s in seeds],
                          lambda r: decoded(r, arm)["tokens"])


def best_of_n(records: Mapping, world: str, seeds: Sequence[int], matched_to: str
              ) -> list[fair_test.BestOf]:
    """Per seed, best-of-N from (c)'s samples, N matched to ``matched_to``'s mean tokens per
    answer under the same seed."""
    target = tokens(records, world, matched_to, seeds).mean(1)
    return [fair_test.best_of_n(records[world, "(c) clean", s], float(t))
            for s, t in zip(seeds, target)]


def abstaining(records: Mapping, world: str, seeds: Sequence[int], lam: float = LAM
               ) -> tuple[list[float], np.ndarray]:
    """Per seed the threshold picked on the learning part, and (seeds, graphs) outcome codes of
    (c)'s greedy answers abstaining below it."""
    picked = [fair_test.threshold_abstention(records[world, "(c) clean", s], lam) for s in seeds]
    return [t for t, _ in picked], np.stack([o for _, o in picked])


def right(codes) -> np.ndarray:
    """Exact match per answer: 1.0 where the outcome code is right."""
    return (np.asarray(codes) == fair_test.RIGHT).astype(float)


@dataclass(frozen=True)
class Contrast:
    """One pre-registered contrast in one world: a − b on ``metric``, and the prediction."""

    number: int
    world: str
    a: str
    b: str
    metric: str  # "exact match" or "C − 3W"
    predicted: str

    @property
    def label(self) -> str:
        return f"{self.number}. {self.world}: {self.a} − {self.b}"


_K, _HIGHER, _NR = ("k = 2", "k = 4"), "higher", "not resolved"
_BEST = "best of N from (c), self-checked"
_ABSTAIN = "(c) abstaining below t"


def contrasts() -> list[Contrast]:
    """The pre-registered contrasts 1–6 of the chapter, world by world, with their predictions
    (7 and 8 are kb_walk's, measured in chapter 10)."""
    from halluc_lab.book.replication import NO_PREDICTION

    out = []
    for world in ("k = 1", *_K):
        near = world == "k = 1"
        out += [Contrast(1, world, "(a) retry in pre-training", "(a′) = (a), backspace masked",
                         "exact match", _NR if near else _HIGHER),
                Contrast(2, world, "(a) retry in pre-training", _BEST, "exact match",
                         _NR if near else _HIGHER if world == "k = 2" else NO_PREDICTION),
                Contrast(3, world, "(a) retry in pre-training", "(b) retry in SFT", "exact match",
                         _NR if near else _HIGHER),
                Contrast(4, world, "RLVR from (a)", "RLVR from (a), masked in RL", "C − 3W",
                         _NR if near else _HIGHER),
                Contrast(6, world, "RLVR from (a)", _ABSTAIN, "C − 3W", _NR if near else _HIGHER)]
    out.append(Contrast(5, "never", "RLVR from (c)", "RLVR from (c), masked in RL", "C − 3W", _NR))
    return sorted(out, key=lambda c: (c.number, c.world))


def arm_grid(records: Mapping, world: str, label: str, seeds: Sequence[int], metric: str,
             matched_to: str = "(a) retry in pre-training") -> np.ndarray:
    """(seeds, graphs) of an arm on ``metric`` ("exact match" or "C − 3W"); the two baselines by
    their labels: best of N (matched to ``matched_to``'s tokens) and threshold abstention."""
    if label == _BEST:
        codes = np.stack([b.outcome for b in best_of_n(records, world, seeds, matched_to)])
    elif label == _ABSTAIN:
        codes = abstaining(records, world, seeds)[1]
    else:
        codes = outcomes(records, world, label, seeds)
    if metric == "exact match":
        return right(codes)
    if metric == "C − 3W":
        return fair_test.score(codes, LAM)
    raise ValueError(f"metric must be 'exact match' or 'C − 3W', got {metric!r}")


def mean_interval(grid) -> Interval:
    """An arm's mean over (seeds, graphs) with the t-interval over its per-seed means (the
    difference from an arm that scores 0 everywhere)."""
    g = np.asarray(grid, dtype=float)
    return stats.difference(g, np.zeros_like(g))


def erasing(records: Mapping, world: str, label: str, seeds: Sequence[int]) -> dict[str, float]:
    """Over seeds and graphs, for an arm's greedy answers: the share that erased, and exact match
    among the answers that erased and among those that did not (NaN where there are none)."""
    arm = ARMS[label]
    erased = fair_test.grid([records[world, label, s] for s in seeds],
                            lambda r: decoded(r, arm)["erased"]).astype(bool)
    ok = right(outcomes(records, world, label, seeds))
    return {"share erasing": float(erased.mean()),
            "right when erasing": float(ok[erased].mean()) if erased.any() else float("nan"),
            "right otherwise": float(ok[~erased].mean()) if (~erased).any() else float("nan")}


def preregistered_run(records: Mapping, seeds: Sequence[int],
                      trained) -> dict[Contrast, Interval]:
    """Every pre-registered contrast whose arms this run trained (``trained``: the (world, arm
    label) pairs with records; the baselines are read from (c)'s records): the t-interval over the
    seeds' paired differences."""
    baseline = {_BEST: "(c) clean", _ABSTAIN: "(c) clean"}
    kept = [c for c in contrasts()
            if all((c.world, baseline.get(x, x)) in trained for x in (c.a, c.b))]
    return {c: stats.difference(arm_grid(records, c.world, c.a, seeds, c.metric),
                                arm_grid(records, c.world, c.b, seeds, c.metric)) for c in kept}


_MEANS = {1: "the key itself, the same weights with it masked",
          2: "the parallel baseline at matched tokens",
          3: "retry data in pre-training against fine-tuning alone",
          4: "RL with the key allowed against masked",
          5: "RL with the key where no error ever shows",
          6: "RL with the key against abstaining below a threshold"}


def summary(results: Mapping[Contrast, Interval]) -> str:
    """The run's verdicts as Markdown bullets, one per pre-registered contrast: in each world the
    side its interval falls on ("higher", "lower", or "not resolved" where it holds zero) with the
    interval, against the prediction."""
    from halluc_lab.book.replication import NO_PREDICTION, WORDS

    lines = []
    for number in sorted({c.number for c in results}):
        mine = {c: iv for c, iv in results.items() if c.number == number}
        first = next(iter(mine))
        found = ", ".join(f"{c.world} {WORDS[iv.side]} ({iv:+.3f})" for c, iv in mine.items())
        said = ", ".join(c.predicted for c in mine)
        judged = [c for c in mine if c.predicted != NO_PREDICTION]
        hits = sum(WORDS[mine[c].side] == c.predicted for c in judged)
        how = mine[first].how
        lines.append(f"- **{number}. {_MEANS[number]}** ({first.a} − {first.b}, {first.metric}; "
                     f"{how}): {found}. Predicted: {said}; as predicted in {hits} of "
                     f"{len(judged)}.")
    missing = sorted(set(_MEANS) - {c.number for c in results})
    if missing:
        listed = ", ".join(map(str, missing))
        lines.append(f"- Contrasts {listed} were not run here: their arms were not trained in this "
                     "run.")
    return "\n".join(lines)
