"""The import rules of ARCHITECTURE.md §2, checked against the code: packages and their order, no cycle,
size."""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "halluc_lab"
TOP = (math.inf, math.inf)  # halluc_lab/__init__.py: above everything


def _order(text: str | None = None) -> dict[str, tuple[int, float]]:
    """module -> (its package's rank, its place in the package), read from the table of ARCHITECTURE.md §2
    (the document is the source). A package's ``__init__`` is the top of its package."""
    text = text if text is not None else (ROOT / "ARCHITECTURE.md").read_text()
    table = text.split("## 2.", 1)[1].split("\n## ", 1)[0]
    order, package, rank, place = {}, None, -1, 0
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or (cells[0] and set(cells[0]) <= {"-", " "}) or cells[0] == "package":
            continue
        if cells[0]:
            rank, package = int(cells[0].split()[0]), re.findall(r"`([a-z_]+)`", cells[0])[0]
            package = "" if package == "halluc_lab" else package
            order[package] = (rank, math.inf)
        for name in re.findall(r"`([a-z_]+)`", cells[1]):
            place += 1
            full = package if name == "__init__" else ".".join(p for p in (package, name) if p)
            order[full] = (rank, math.inf if name == "__init__" else place)
    order[""] = TOP
    return order


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()
ORDER = _order()


def _imports(path: Path) -> set[str]:
    """halluc_lab modules a file imports, at any depth of the file (functions included): for ``from pkg import
    x``, the module ``pkg.x`` where x is one, else ``pkg`` itself."""
    deps = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "halluc_lab":
            base = node.module.removeprefix("halluc_lab").removeprefix(".")
            for alias in node.names:
                sub = ".".join(p for p in (base, alias.name) if p)
                deps.add(sub if sub in MODULES else base)
        elif isinstance(node, ast.Import):
            deps |= {a.name.removeprefix("halluc_lab.") for a in node.names if a.name.startswith("halluc_lab.")}
    return deps


def _upward(module: str, deps: set[str], order: dict[str, tuple[int, float]]) -> list[str]:
    """The deps of ``module`` not below it: a higher package, or a later module of its own package."""
    return sorted(d for d in deps if d in order and d != module and order[d] >= order[module])


def test_every_module_has_a_place_in_the_architecture_document():
    missing = [m for m in MODULES if m not in ORDER]
    assert not missing, f"modules without a place in ARCHITECTURE.md §2: {missing}"
    listed = [m for m in ORDER if m not in MODULES]
    assert not listed, f"ARCHITECTURE.md §2 lists modules the package does not have: {listed}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m))
def test_no_module_imports_upward(module):
    upward = _upward(module, _imports(MODULES[module]), ORDER)
    assert not upward, f"{module} {ORDER[module]} imports upward: " + \
        ", ".join(f"{d} {ORDER[d]}" for d in upward)


def test_the_rule_catches_imports_up_between_packages_and_within_one():
    """The check above, on a hand-made table: a lower package importing a higher one fails, and so does a
    module importing one listed after it in its own package; the reverse of each passes."""
    order = _order("## 2. x\n\n| package | modules | what |\n| --- | --- | --- |\n"
                   "| 0 `halluc_lab` | `device` | d |\n| 1 `model` | `a`, `b` | m |\n"
                   "| 2 `training` | `c` | t |\n\n## 3. y\n")
    assert _upward("model.a", {"training.c"}, order) == ["training.c"]
    assert _upward("model.a", {"model.b"}, order) == ["model.b"]
    assert _upward("model.a", {"model"}, order) == ["model"]  # the package's __init__ is its top
    assert _upward("model.b", {"model.a", "device"}, order) == []
    assert _upward("training.c", {"model.b", "model"}, order) == []


def test_the_import_graph_has_no_cycle():
    graph = {m: {d for d in _imports(p) if d in MODULES and d != m} for m, p in MODULES.items()}
    state: dict[str, int] = {}

    def visit(m, stack):
        state[m] = 1
        for d in graph[m]:
            if state.get(d) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(d):] + [m, d]))
            if d not in state:
                visit(d, stack + [m])
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m, [])


@pytest.mark.parametrize("module, forbidden", [("generation.engine", "model.tokenizer"),
                                               ("model.transformer", "model.hf_convert")])
def test_named_rules(module, forbidden):
    assert forbidden not in _imports(MODULES[module]), f"{module} must never import {forbidden}"


def _length(text: str, width: int = 100) -> int:
    """Lines counted at ``width`` characters a line: a longer line counts as several."""
    return sum(max(1, math.ceil(len(line) / width)) for line in text.splitlines())


def test_length_counts_a_wide_line_as_several():
    assert _length("a\n" + "b" * 100 + "\n" + "c" * 101) == 1 + 1 + 2


@pytest.mark.parametrize("module", sorted(MODULES))
def test_modules_stay_small(module):
    """ARCHITECTURE.md §2: about 400 lines a module, at most 450 counted at 100 characters a line (a little
    slack, never a 1,000-line hub, and width cannot hide length)."""
    n = _length(MODULES[module].read_text())
    assert n <= 450, f"{MODULES[module].relative_to(ROOT)} has {n} lines at 100 characters; split it by concept"
