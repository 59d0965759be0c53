"""The import rules of ARCHITECTURE.md §2, checked against the code: layers, no cycle, size."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "halluc_lab"


def _layers() -> dict[str, int]:
    """module -> layer, read from the table of ARCHITECTURE.md §2 (the document is the source)."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    table = text.split("## 2.", 1)[1].split("\n## ", 1)[0]
    layers, current = {}, None
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or (cells[0] and set(cells[0]) <= {"-", " "}):
            continue
        if cells[0] and cells[0][0].isdigit():
            current = int(cells[0].split()[0])
        if current is None:
            continue
        for package, subs in re.findall(r"`([a-z_]+)` \(([^)]*)\)", cells[1]):  # tasks (`base`, ...)
            layers |= {f"{package}.{sub}": current for sub in re.findall(r"`([a-z_]+)`", subs)}
        for name in re.findall(r"`([a-z_]+)`", re.sub(r"\([^)]*\)", "", cells[1])):
            layers[name] = current
    return layers


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(path: Path) -> set[str]:
    """halluc_lab modules a file imports, at any depth of the file (functions included)."""
    deps = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "halluc_lab":
            if node.module == "halluc_lab":
                deps |= {a.name for a in node.names}
            else:
                deps.add(node.module.removeprefix("halluc_lab."))
        elif isinstance(node, ast.Import):
            deps |= {a.name.removeprefix("halluc_lab.") for a in node.names if a.name.startswith("halluc_lab.")}
    return deps


MODULES = _modules()
LAYERS = _layers()


def _layer(module: str) -> int:
    if module in LAYERS:
        return LAYERS[module]
    return LAYERS[module.split(".")[0]]  # a package's submodule not listed alone: its package's layer


def test_every_module_has_a_layer_in_the_architecture_document():
    missing = [m for m in MODULES if m and m not in LAYERS and m.split(".")[0] not in LAYERS]
    assert not missing, f"modules without a layer in ARCHITECTURE.md §2: {missing}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m))
def test_no_module_imports_from_a_higher_layer(module):
    upward = [d for d in _imports(MODULES[module]) if d in MODULES and _layer(d) > _layer(module)]
    assert not upward, f"{module} (layer {_layer(module)}) imports upward: " + \
        ", ".join(f"{d} (layer {_layer(d)})" for d in upward)


def test_the_import_graph_has_no_cycle():
    graph = {m: {d for d in _imports(p) if d in MODULES and d != m} for m, p in MODULES.items()}
    graph = {m: {d for d in deps if not m.startswith(d + ".") and d != ""} for m, deps in graph.items()}
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


@pytest.mark.parametrize("module, forbidden", [("engine", "tokenizer"), ("model", "hf_convert")])
def test_named_rules(module, forbidden):
    assert forbidden not in _imports(MODULES[module]), f"{module} must never import {forbidden}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_modules_stay_small(module):
    """ARCHITECTURE.md §2: about 400 lines a module (a little slack, never a 1,000-line hub)."""
    n = len(MODULES[module].read_text().splitlines())
    assert n <= 450, f"{MODULES[module].relative_to(ROOT)} has {n} lines; split it by concept"
