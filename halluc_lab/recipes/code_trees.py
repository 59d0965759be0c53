"""The lab's code as syntax trees: what a module imports, and its code without its prose, as text
that every Python version the lab runs on writes alike (3.11 to 3.13); hashed, the fingerprint a
recipe's cache key covers (:func:`halluc_lab.recipes.cache_key.code_modules`).

A docstring, a comment or a line break is not code: :func:`parse` drops docstrings from the tree,
and comments and layout are never in it. :func:`closure` follows a set of modules through every
``halluc_lab`` import they make, at any depth of the file (an import inside a function counts), and
:func:`fingerprint` hashes the trees of the modules it found::

    # changes when the loop's code, or code it imports, does
    fingerprint(closure({"halluc_lab.training.train"}))
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
from collections.abc import Callable, Iterable
from functools import lru_cache

Source = Callable[[str], str]  # module name -> its source text


@lru_cache(maxsize=None)
def read_source(module: str) -> str:
    """A module's source, read once per process (the code this process runs)."""
    with open(importlib.util.find_spec(module).origin, encoding="utf-8") as f:
        return f.read()


def strip_docstrings(tree: ast.AST) -> ast.AST:
    """``tree`` without the docstrings of its module, classes and functions (changed in place)."""
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return tree


def is_lab_module(name: str) -> bool:
    """Whether ``name`` is a module of the ``halluc_lab`` package (not a name defined in one)."""
    try:
        return name.split(".")[0] == "halluc_lab" and importlib.util.find_spec(name) is not None
    except ImportError:  # "halluc_lab.x.y" with x a module: y is a name in it
        return False


def tree_text(node) -> str:
    """A syntax tree as text, the same on the Python versions the lab runs on (3.11 to 3.13): unlike
    ``ast.dump``, whose text for one program differs between them (3.12 adds ``type_params=[]`` to
    every function and class, 3.13 leaves out empty lists), it leaves out every field that is empty
    or None, and the empty strings that 3.12 puts into some f-strings (``f"{x:{spec}}"``)."""
    if isinstance(node, ast.JoinedStr):
        node = ast.JoinedStr(values=[v for v in node.values
                                     if not (isinstance(v, ast.Constant) and v.value == "")])
    if isinstance(node, ast.AST):
        fields = ", ".join(f"{name}={tree_text(value)}" for name, value in ast.iter_fields(node)
                           if value is not None and value != [])
        return f"{type(node).__name__}({fields})"
    if isinstance(node, list):
        return f"[{', '.join(map(tree_text, node))}]"
    return repr(node)


def _is_type_checking(test: ast.expr) -> bool:
    """Whether an ``if`` tests ``TYPE_CHECKING`` (or ``typing.TYPE_CHECKING``): its body never
    runs."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_nodes(tree: ast.AST):
    """Every node of ``tree`` except those inside ``if TYPE_CHECKING:`` (imports for annotations run
    no code)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                todo += child.orelse  # the else branch does run
            else:
                todo.append(child)


@lru_cache(maxsize=256)
def parse(module: str, source: str) -> tuple[str, frozenset[str]]:
    """(the syntax tree without docstrings, as :func:`tree_text`; the halluc_lab modules the code
    imports anywhere)."""
    tree = ast.parse(source)
    package = (module if importlib.util.find_spec(module).submodule_search_locations
               else module.rpartition(".")[0])
    found = set()
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
            subs = {f"{base}.{a.name}" for a in node.names if is_lab_module(f"{base}.{a.name}")}
            # "from pkg import sub" runs sub's code; pkg's own only for the names that are not
            # modules
            found |= subs | ({base} if len(subs) < len(node.names) else set())
    return tree_text(strip_docstrings(tree)), frozenset(m for m in found if is_lab_module(m))


def closure(roots: Iterable[str], source: Source | None = None, *,
            exempt: Iterable[str] = ()) -> tuple[str, ...]:
    """The halluc_lab modules among ``roots`` and every halluc_lab module they import, transitively,
    sorted (``source(module)``: its text; default :func:`read_source`). A module in ``exempt`` is
    neither listed nor followed: code that cannot change what the roots compute (a progress bar)."""
    source, exempt = source or read_source, frozenset(exempt)
    todo, seen = [m for m in roots if is_lab_module(m) and m not in exempt], set()
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += [i for i in parse(m, source(m))[1] if i not in exempt]
    return tuple(sorted(seen))


def module_hash(module: str, source: Source | None = None) -> str:
    """A hash of one module's name and its syntax tree without docstrings: it changes when its code
    does, not when its prose does, and not with the Python version."""
    source = source or read_source
    text = module.encode() + b"\0" + parse(module, source(module))[0].encode()
    return hashlib.sha256(text).hexdigest()[:16]


def module_hashes(modules: Iterable[str], source: Source | None = None) -> dict[str, str]:
    """``{module: module_hash(module)}``, sorted by name: what a cache entry records, so that a key
    that moved names the module whose code did."""
    return {m: module_hash(m, source) for m in sorted(modules)}


def fingerprint(modules: Iterable[str], source: Source | None = None) -> str:
    """One hash of :func:`module_hashes`: it changes when any of the modules' code does."""
    blob = "\n".join(f"{m}:{h}" for m, h in module_hashes(modules, source).items())
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
