"""The errata page's structure, read from its Markdown sources (no build, no browser).

Each fragment ``book/errata/NN_topic.md`` has one ``## `` chapter heading and exactly two
sections, ``### Errors (n)`` then ``### Clarifications (n)``. Each holds a five-column table
(document | section | stated | computed | why) of n rows, or, when n = 0, no table. The summary
table of ``book/errata.md`` gives the same counts per chapter and their totals, and the page
includes every fragment.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "book" / "errata.md"
FRAGMENTS = sorted((ROOT / "book" / "errata").glob("*.md"))
COLUMNS = ["document", "section", "stated", "computed", "why"]
KINDS = ["Errors", "Clarifications"]
SECTION = re.compile(r"^### (\w+) \((\d+)\)\s*$")


def cells(line: str) -> list[str]:
    """The cells of a Markdown table row; a ``|`` inside ``$…$`` or a backslash-escaped one is not a rule."""
    text = re.sub(r"\$[^$]*\$", lambda m: m.group(0).replace("|", "¦"), line.strip())
    text = text.replace(r"\|", "¦")
    assert text.startswith("|") and text.endswith("|"), f"not a table row: {line[:80]}"
    return [c.strip() for c in text[1:-1].split("|")]


def is_rule(row: list[str]) -> bool:
    return all(re.fullmatch(r":?-{3,}:?", c) for c in row)


def table_rows(lines: list[str]) -> tuple[list[str] | None, list[list[str]]]:
    """Header and body rows of the table lines among ``lines`` (header None when there is none)."""
    table = [cells(line) for line in lines if line.lstrip().startswith("|")]
    if not table:
        return None, []
    assert len(table) >= 2 and is_rule(table[1]), "a table needs a header and a delimiter row"
    return table[0], table[2:]


def parse_fragment(path: Path) -> dict:
    lines = path.read_text(encoding="utf-8").splitlines()
    titles = [line[3:].strip() for line in lines if line.startswith("## ")]
    assert len(titles) == 1, f"{path.name}: expected one '## ' chapter heading, found {titles}"
    starts = [(i, SECTION.match(line)) for i, line in enumerate(lines) if line.startswith("### ")]
    assert all(m for _, m in starts), f"{path.name}: a '### ' heading is not 'Kind (n)': {starts}"
    kinds = [m.group(1) for _, m in starts]
    assert kinds == KINDS, f"{path.name}: sections are {kinds}, expected {KINDS}"
    assert not any(line.lstrip().startswith("|") for line in lines[: starts[0][0]]), \
        f"{path.name}: a table before the Errors section"
    sections = {}
    for k, (i, m) in enumerate(starts):
        end = starts[k + 1][0] if k + 1 < len(starts) else len(lines)
        header, rows = table_rows(lines[i + 1:end])
        sections[m.group(1)] = {"stated": int(m.group(2)), "header": header, "rows": rows}
    return {"title": titles[0], "sections": sections}


def summary_table() -> dict[str, tuple[int, int]]:
    """Chapter title -> (errors, clarifications), from the table headed 'chapter | errors | clarifications'."""
    lines = PAGE.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines)
                 if line.startswith("|") and cells(line) == ["chapter", "errors", "clarifications"])
    end = next((j for j in range(start, len(lines)) if not lines[j].startswith("|")), len(lines))
    header, rows = table_rows(lines[start:end])
    return {re.sub(r"\*\*", "", r[0]): (int(r[1].strip("*")), int(r[2].strip("*"))) for r in rows}


def test_there_are_fragments():
    assert FRAGMENTS, "no fragments in book/errata/"


@pytest.mark.parametrize("path", FRAGMENTS, ids=lambda p: p.name)
def test_fragment_has_errors_and_clarifications_with_their_counts(path):
    for kind, section in parse_fragment(path)["sections"].items():
        n = len(section["rows"])
        assert section["stated"] == n, f"{path.name}: '{kind} ({section['stated']})' heads {n} rows"
        if n:
            assert section["header"] == COLUMNS, f"{path.name} {kind}: header {section['header']}"
        for row in section["rows"]:
            assert len(row) == 5, f"{path.name} {kind}: {len(row)} cells in {' | '.join(row)[:100]}"
            assert all(row), f"{path.name} {kind}: an empty cell in {' | '.join(row)[:100]}"


def test_summary_matches_the_fragments():
    summary = summary_table()
    total = summary.pop("total")
    counted = {}
    for path in FRAGMENTS:
        frag = parse_fragment(path)
        counted[frag["title"]] = tuple(len(frag["sections"][k]["rows"]) for k in KINDS)
    assert summary == counted
    assert total == tuple(sum(c[k] for c in counted.values()) for k in range(2))


def test_every_fragment_is_included_once_in_chapter_order():
    included = re.findall(r"^```\{include\}\s+errata/(\S+)\s*$", PAGE.read_text(encoding="utf-8"), re.M)
    assert included == [p.name for p in FRAGMENTS]
