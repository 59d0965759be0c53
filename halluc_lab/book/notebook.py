"""Notebook plumbing shared by every chapter: the run footer and glued values (ARCHITECTURE.md §3,
§6).

The last cell of every chapter calls :func:`footer`. It shows the run's device,
scale, seed, library version and date, and glues them (``run_device``, ...) so
that ``scripts/reproduce.py`` can copy them into the notebook's metadata. The kernel that ran
the chapter writes them, and ``run_finished`` (UTC, to the microsecond) tells one run from
another: ``reproduce.py --adopt`` reads only these, never metadata a copied notebook kept. It also
lists the recipe cache keys of every trained model the chapter loaded, so two chapters that say
they use the same models can be seen to (``run_recipes``), and the hash of each module those keys
cover (``run_code``), so that a later code state can say which chapters' footers are stale and
which module moved (:func:`stale_footers`; ``make test`` prints them).
"""

from __future__ import annotations

import ast
import datetime
import platform
from pathlib import Path

import torch
import yaml

from halluc_lab.device import Runtime

RUN_KEYS = ("device", "scale", "seed", "version", "torch", "date", "finished")


def run_metadata(rt: Runtime) -> dict[str, str | int]:
    """What a run records about itself: device, scale, seed, versions, date, when it finished."""
    from halluc_lab._version import __version__

    name = rt.device.type
    if rt.device.type == "cuda":
        name = f"cuda ({torch.cuda.get_device_name(rt.device)})"
    elif rt.device.type == "cpu":
        name = f"cpu ({platform.machine()})"
    return {
        "device": name,
        "scale": rt.scale,
        "seed": rt.seed,
        "version": __version__,
        "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
        "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="microseconds"),
    }


def footer(rt: Runtime):
    """Glue the run's metadata and return a one-line summary to display."""
    from IPython.display import Markdown
    from myst_nb import glue

    from halluc_lab.recipes.cache import used, used_code
    from halluc_lab.recipes.cache_key import FORMAT_VERSION

    meta = run_metadata(rt)
    for key, value in meta.items():
        glue(f"run_{key}", value, display=False)
    recipes = used()
    glue("run_recipes", ", ".join(f"{name}:{k}" for name, k in recipes), display=False)
    glue("run_code", {"format": FORMAT_VERSION, "modules": used_code()}, display=False)
    text = (f"<small>Run on **{meta['device']}** at scale **{meta['scale']}**, seed "
            f"{meta['seed']}, "
            f"halluc_lab {meta['version']}, torch {meta['torch']}, {meta['date']}.</small>")
    if recipes:
        items = "".join(f"<li><code>{name}</code> <code>{k}</code></li>" for name, k in recipes)
        text += (f"\n\n<details><summary><small>{len(recipes)} trained models (recipe "
                 "and cache key)"
                 f"</small></summary><ul>{items}</ul></details>")
    return Markdown(text)


def read_glue(nb) -> dict:
    """The values a notebook glued, parsed from their plain-text form."""
    values: dict = {}
    for cell in nb["cells"]:  # a NotebookNode or the plain JSON of a notebook
        for output in cell.get("outputs", []) if cell["cell_type"] == "code" else []:
            meta = output.get("metadata", {}).get("scrapbook")
            if not meta:
                continue
            name = meta["name"]
            text = output["data"].get(meta.get("mime_prefix", "") + "text/plain")
            try:
                value = _literal(text)
            except (ValueError, SyntaxError) as err:
                raise ValueError(f"glued value {name!r} is not a plain Python literal: {text!r}; "
                                 "glue floats, ints, bools, strings or lists of them") from err
            if name in values:
                raise ValueError(f"{name!r} is glued twice")
            values[name] = value
    return values


class _NonFinite(ast.NodeTransformer):
    """``nan`` and ``inf``, as a float's repr writes them, read back as floats."""

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in ("nan", "inf"):
            return ast.copy_location(ast.Constant(float(node.id)), node)
        return node


def _literal(text: str):
    """A glued value's plain-text form as a Python literal; ``nan`` and ``inf`` allowed (an empty
    bin's rate, say), nothing else that is not a literal."""
    try:
        return ast.literal_eval(text)
    except ValueError:
        return ast.literal_eval(_NonFinite().visit(ast.parse(text, mode="eval")))


def toc_files(root: Path) -> list[str]:
    """Every page ``root/_toc.yml`` lists, the root page first, without suffix."""
    toc = yaml.safe_load((Path(root) / "_toc.yml").read_text())
    found: list[str] = [toc["root"]]

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                found.append(str(node["file"]))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(toc)
    return found


def toc_notebooks(root: Path) -> list[str]:
    """Stems of the chapter notebooks the book lists, in book order."""
    return [Path(f).name for f in toc_files(root) if f.startswith("notebooks/")]


def stale_footers(root: Path) -> dict[str, list[str]]:
    """The chapters of the book at ``root`` whose committed footers list trained models that today's
    code would train again: ``{stem: the modules whose code moved}``
    (``["(no module hashes recorded)"]`` for a footer written before they were,
    ``["(cache format N)"]`` for another cache format). Chapters that train nothing are never stale.
    Reading the notebooks runs nothing."""
    import json

    from halluc_lab.recipes.cache import moved_modules
    from halluc_lab.recipes.cache_key import FORMAT_VERSION

    out: dict[str, list[str]] = {}
    for stem in toc_notebooks(root):
        path = Path(root) / "notebooks" / f"{stem}.ipynb"
        glued = read_glue(json.loads(path.read_text(encoding="utf-8")))
        if not glued.get("run_recipes"):
            continue
        code = glued.get("run_code")
        if not isinstance(code, dict) or "modules" not in code:
            out[stem] = ["(no module hashes recorded)"]
        elif code.get("format") != FORMAT_VERSION:
            out[stem] = [f"(cache format {code.get('format')})"]
        elif moved := moved_modules(code["modules"]):
            out[stem] = moved
    return out

