"""Edit distance: the dynamic-programming table, the distance, one shortest edit script and its
replay.

Chapter 2 (classical NLP). Source: 004 §3.1 (edit distance). Unit costs; with
``substitution=False`` only insertions and deletions are allowed. Items are any hashables, so a
string is compared letter by letter and a token list token by token.
:mod:`halluc_lab.foundations.lexical` re-exports these names beside the rest of chapter 2's toolkit.

Departure from 004 (with a test in tests/unit/test_lexical.py):

- §3.1 states carr→cat 3, car 1, cart 2: the insert/delete-only distances. Levenshtein gives
  cat 2, car 1, cart 1, care 1, so "car" does not win alone. The explanations are swapped:
  carr→car is one deletion; "replace second r with t" turns carr into cart.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import NamedTuple

import numpy as np

# ---------------------------------------------------------------- edit distance (§3.1)


class Edit(NamedTuple):
    """One step of an edit script; ``source`` is consumed from a, ``target`` written to b."""

    op: str  # "keep", "substitute", "delete" or "insert"
    source: Hashable | None  # the item of a (None for an insertion)
    target: Hashable | None  # the item of b (None for a deletion)


def edit_table(a: Sequence[Hashable], b: Sequence[Hashable], *,
               substitution: bool = True) -> np.ndarray:
    """The dynamic-programming table D (len(a)+1, len(b)+1): D[i, j] = distance of a[:i] to b[:j].

    Unit costs. With ``substitution=False`` only insertions and deletions are allowed (the
    distance is then len(a) + len(b) − 2·LCS). Example: ``edit_table("ab", "b")[-1, -1]`` → 1.
    """
    m, n = len(a), len(b)
    table = np.zeros((m + 1, n + 1), dtype=np.int64)
    table[:, 0] = np.arange(m + 1)  # delete all of a[:i]
    table[0, :] = np.arange(n + 1)  # insert all of b[:j]
    for i in range(1, m + 1):
        for j in range(1, n + 1):
            best = min(table[i - 1, j], table[i, j - 1]) + 1  # delete a[i-1] / insert b[j-1]
            if a[i - 1] == b[j - 1]:
                best = min(best, table[i - 1, j - 1])
            elif substitution:
                best = min(best, table[i - 1, j - 1] + 1)
            table[i, j] = best
    return table


def edit_distance(a: Sequence[Hashable], b: Sequence[Hashable], *,
                  substitution: bool = True) -> int:
    """Levenshtein distance (``substitution=False``: insert/delete-only distance)."""
    return int(edit_table(a, b, substitution=substitution)[-1, -1])


def edit_script(a: Sequence[Hashable], b: Sequence[Hashable], *,
                substitution: bool = True) -> list[Edit]:
    """One shortest edit script from a to b, back-traced through :func:`edit_table`.

    Ties prefer keep/substitute, then delete, then insert. The number of non-"keep" steps equals
    the distance, and :func:`apply_edits` turns a into b.
    """
    table = edit_table(a, b, substitution=substitution)
    i, j, script = len(a), len(b), []
    while i > 0 or j > 0:
        diagonal = table[i - 1, j - 1] if i > 0 and j > 0 else None
        if diagonal is not None and a[i - 1] == b[j - 1] and table[i, j] == diagonal:
            script.append(Edit("keep", a[i - 1], b[j - 1]))
            i, j = i - 1, j - 1
        elif diagonal is not None and substitution and table[i, j] == diagonal + 1:
            script.append(Edit("substitute", a[i - 1], b[j - 1]))
            i, j = i - 1, j - 1
        elif i > 0 and table[i, j] == table[i - 1, j] + 1:
            script.append(Edit("delete", a[i - 1], None))
            i -= 1
        else:
            script.append(Edit("insert", None, b[j - 1]))
            j -= 1
    return script[::-1]


def apply_edits(a: Sequence[Hashable], script: Sequence[Edit]) -> list[Hashable]:
    """Run an edit script on a; raises if the script does not consume a in order."""
    out, pos = [], 0
    for edit in script:
        if edit.op != "insert":
            if pos >= len(a) or a[pos] != edit.source:
                raise ValueError(f"script step {edit} does not match a at position {pos}")
            pos += 1
        if edit.op in ("keep", "substitute", "insert"):
            out.append(edit.target)
    if pos != len(a):
        raise ValueError(f"script consumed {pos} of the {len(a)} items of a")
    return out
