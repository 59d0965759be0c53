"""Replication: does a pre-registered verdict hold in a second full run?

Same seed, same code, same GPU model gives the same bits: that is engineering reproducibility
(ARCHITECTURE.md §3). Replication asks for the same *conclusion* from a fresh draw of the training
noise: a run on another GPU model (an H100 against an H200 sum their floats in other orders and
train other models from one recipe) or, where only one model can be had, another set of seeds
(e.g. 0–7 and 8–15). The book calls a verdict *stable* only where both runs resolve it the same
way.

A chapter glues its pre-registered contrasts as :func:`records` (``preregistered_contrasts``);
:func:`compare` sets two runs' records side by side, and :func:`table` writes the replication
page's rows (``scripts/replication.py``). Each run keeps its own interval: two runs are never
pooled into one here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from halluc_lab.evaluation.stats import Interval

GLUE_NAME = "preregistered_contrasts"  # what a chapter glues its records under
STABLE, BOTH_UNRESOLVED, DIFFERS = "stable", "not resolved in either run", "differs"
WORDS = {1: "higher", -1: "lower", 0: "not resolved"}
NO_PREDICTION = "no prediction"  # pre-registered without a direction (still in the replication)
PREDICTIONS = (*WORDS.values(), NO_PREDICTION)  # what a pre-registered contrast may predict


def records(contrasts: Mapping[str, Interval], predicted: Mapping[str, str]) -> dict[str, dict]:
    """A chapter's pre-registered contrasts as JSON-able records for the glue: label -> estimate,
    interval, method, seeds, per-seed values, the verdict's side (+1 higher, −1 lower, 0 not
    resolved) and the direction predicted before the run ("higher", "lower", "not resolved", or
    :data:`NO_PREDICTION` for a contrast registered without one)."""
    missing = set(contrasts) ^ set(predicted)
    if missing:
        raise ValueError(f"every contrast needs a prediction and the reverse; unmatched: "
                         f"{sorted(missing)}")
    bad = {k: v for k, v in predicted.items() if v not in PREDICTIONS}
    if bad:
        raise ValueError(f"predictions must be one of {sorted(PREDICTIONS)}, got {bad}")
    return {label: {"estimate": iv.estimate, "low": iv.low, "high": iv.high, "method": iv.method,
                    "seeds": iv.seeds, "per_seed": list(iv.per_seed or ()), "side": iv.side,
                    "predicted": predicted[label]}
            for label, iv in contrasts.items()}


def against_prediction(side: int, predicted: str) -> str:
    """How one run's verdict (``side``: +1 higher, −1 lower, 0 not resolved) came out against the
    direction registered before the run, as a clause that reads the same whatever the verdict.

    >>> against_prediction(1, "not resolved")
    'against the prediction, which was "not resolved"'
    >>> against_prediction(0, "not resolved"), against_prediction(-1, NO_PREDICTION)
    ('as predicted', 'registered without a predicted direction')
    """
    if side not in WORDS:
        raise ValueError(f"side must be one of {sorted(WORDS)}, got {side!r}")
    if predicted not in PREDICTIONS:
        raise ValueError(f"predicted must be one of {sorted(PREDICTIONS)}, got {predicted!r}")
    if predicted == NO_PREDICTION:
        return "registered without a predicted direction"
    if WORDS[side] == predicted:
        return "as predicted"
    return f'against the prediction, which was "{predicted}"'


@dataclass(frozen=True)
class Replicated:
    """One pre-registered contrast in two runs."""

    label: str
    first: dict  # the record of the run whose outputs the chapter commits
    second: dict  # the other run's record

    @property
    def status(self) -> str:
        """:data:`STABLE` (both runs resolve it, the same way), :data:`BOTH_UNRESOLVED` or
        :data:`DIFFERS`."""
        a, b = self.first["side"], self.second["side"]
        if a == b:
            return STABLE if a else BOTH_UNRESOLVED
        return DIFFERS

    @property
    def as_predicted(self) -> bool:
        """Whether the stable verdict is the one predicted before the runs."""
        return self.status == STABLE and WORDS[self.first["side"]] == self.first["predicted"]


def compare(first: Mapping[str, dict], second: Mapping[str, dict]) -> list[Replicated]:
    """The contrasts of two runs of one chapter, in the first run's order. Both runs must have
    pre-registered the same contrasts with the same predictions (one code state)."""
    if set(first) != set(second):
        unmatched = sorted(set(first) ^ set(second))
        raise ValueError(f"the runs pre-registered different contrasts: {unmatched}")
    if list(first) != list(second):
        raise ValueError("the runs list their contrasts in another order: not one code state")
    moved = [k for k in first if first[k]["predicted"] != second[k]["predicted"]]
    if moved:
        raise ValueError(f"the runs predicted differently for {moved}: not one code state")
    return [Replicated(k, first[k], second[k]) for k in first]


def _cell(record: dict) -> str:
    seeds = f"; {record['method']}, {record['seeds']} seeds" if record.get("seeds") else ""
    return (f"{WORDS[record['side']]} ({record['estimate']:+.3f} "
            f"[{record['low']:+.3f}, {record['high']:+.3f}]{seeds})")


def _seeds(record: dict) -> str:
    values = record.get("per_seed") or ()
    return " ".join(f"{v:+.3f}" for v in values) if values else "not kept"


def per_seed_table(rows: list[Replicated], first: str, second: str) -> str:
    """A Markdown table of each contrast's per-seed paired differences in the two runs, the values
    each run's t-interval is made from ("not kept" where a run's record lacks them)."""
    lines = [f"| contrast | {first}, per seed | {second}, per seed |", "|---|---|---|"]
    lines += [f"| {r.label} | {_seeds(r.first)} | {_seeds(r.second)} |" for r in rows]
    return "\n".join(lines)


def table(rows: list[Replicated], first: str, second: str) -> str:
    """A Markdown table: contrast, prediction, each run's verdict with its interval, and whether
    it is stable (``first``/``second``: the runs' names, e.g. "H200, seeds 0–7")."""
    lines = [f"| contrast | predicted | {first} | {second} | replicated |", "|---|---|---|---|---|"]
    for r in rows:
        against = r.status == STABLE and r.first["predicted"] != NO_PREDICTION
        mark = r.status + (", as predicted" if r.as_predicted else
                           ", against the prediction" if against else "")
        lines.append(f"| {r.label} | {r.first['predicted']} | {_cell(r.first)} | "
                     f"{_cell(r.second)} | {mark} |")
    return "\n".join(lines)
