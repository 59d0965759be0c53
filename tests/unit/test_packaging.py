"""The package as users install it: the wheel holds every module, every import is declared; lint.

The wheel test builds a wheel from a copy of the sources and installs it with ``--no-deps`` into a
fresh virtual environment that sees this environment's packages (the versions requirements.lock
pins) through a ``.pth`` file, then imports every module there, outside the repository. A full
install of the wheel with its extras into an empty environment takes minutes (torch, JupyterLab,
Sphinx) and needs the network, which CI's time budget does not allow; ``make test`` does that
install from the lock on every CI run anyway. ``--system-site-packages`` is not used because it
would expose the base interpreter's packages, not the locked ones. What the shortcut cannot show —
that the declared requirements are enough — two checks cover: every requirement the wheel declares,
extras included, is met by an installed version, and every third-party module the code imports
(lazy imports too) belongs to a declared distribution.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import shutil
import site
import subprocess
import sys
import textwrap
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10: the copy of tomli that pip carries
    from pip._vendor import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
PROJECT = PYPROJECT["project"]
# Imported by benchmarks/preference.py and rlvr.py only when TRL is installed (not a dependency),
# and pip, which every virtual environment has.
OPTIONAL = {"trl", "datasets", "pip"}


def _name(requirement: str) -> str:
    """The normalised distribution name of a requirement string (PEP 503)."""
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", requirement).group()).lower()


def _declared(*extras: str) -> set[str]:
    groups = [PROJECT["dependencies"]] + [PROJECT["optional-dependencies"][e] for e in extras]
    return {_name(r) for group in groups for r in group}


def _third_party_imports(folder: Path) -> dict[str, set[str]]:
    """Top-level names of the modules imported anywhere under ``folder`` (inside functions too)
    that are neither the standard library nor the repository's own, each with its importers."""
    local = {p.stem for p in ROOT.glob("*/*.py")} | {p.name for p in ROOT.iterdir() if p.is_dir()}
    found: dict[str, set[str]] = {}
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for top in (n.split(".")[0] for n in names):
                if top not in sys.stdlib_module_names and top not in local | {"halluc_lab"}:
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def _undeclared(folder: str, allowed: set[str]) -> list[str]:
    dists = packages_distributions()
    missing = []
    for module, files in sorted(_third_party_imports(ROOT / folder).items()):
        names = {_name(d) for d in dists.get(module, [])}
        if module not in OPTIONAL and not names & allowed:
            dist = sorted(names) or "unknown"
            missing.append(f"{module} (distribution {dist}, in {sorted(files)})")
    return missing


def test_every_module_the_library_imports_comes_from_a_core_or_lab_requirement():
    # The library's lazy imports count: a function that imports peft needs peft when it is called.
    assert _undeclared("halluc_lab", _declared("lab")) == []


def test_every_module_the_tests_scripts_and_benchmarks_import_is_declared():
    allowed = _declared(*PROJECT["optional-dependencies"])
    for folder in ("tests", "scripts", "benchmarks"):
        assert _undeclared(folder, allowed) == [], folder


def test_the_test_extra_brings_every_other_extra():
    extras = set(PROJECT["optional-dependencies"]) - {"test"}
    test = PROJECT["optional-dependencies"]["test"]
    selves = [r for r in test if _name(r) == _name(PROJECT["name"])]
    assert len(selves) == 1
    assert set(re.search(r"\[(.*)\]", selves[0]).group(1).split(",")) == extras


# Run inside the fresh environment, from a folder outside the repository.
_PROBE = textwrap.dedent("""
    import importlib, importlib.metadata as md, json, pkgutil, sys
    from packaging.requirements import Requirement
    import halluc_lab
    modules = sorted(m.name for m in pkgutil.walk_packages(halluc_lab.__path__, "halluc_lab."))
    for m in modules:
        importlib.import_module(m)
    unmet = []
    for line in md.requires("halluc_lab"):
        r = Requirement(line)
        extras = sys.argv[1:] + [""]
        wanted = r.marker is None or any(r.marker.evaluate({"extra": e}) for e in extras)
        if not wanted or r.name.replace("-", "_") == "halluc_lab":
            continue
        try:
            have = md.version(r.name)
        except md.PackageNotFoundError:
            have = None
        if have is None or not r.specifier.contains(have, prereleases=True):
            unmet.append(f"{line} (installed: {have})")
    meta = md.metadata("halluc_lab")
    files = [str(f) for f in md.files("halluc_lab")]
    print(json.dumps({"file": halluc_lab.__file__, "modules": modules, "unmet": unmet,
                      "license": meta["License-Expression"], "files": files}))
""")


@pytest.mark.slow
def test_the_wheel_installed_in_a_fresh_environment_has_every_module_and_imports_each(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "halluc_lab", src / "halluc_lab",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    pip = [sys.executable, "-m", "pip"]
    subprocess.run(pip + ["wheel", "--quiet", "--no-deps", "--no-index", "--no-build-isolation",
                          "--check-build-dependencies", "--wheel-dir", str(tmp_path / "dist"),
                          str(src)], check=True, cwd=tmp_path)
    (wheel,) = (tmp_path / "dist").glob("halluc_lab-*.whl")
    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    python = env / "bin" / "python"
    subprocess.run(pip + ["--python", str(python), "install", "--quiet", "--no-deps", "--no-index",
                          str(wheel)], check=True)
    env_site = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"],
                              check=True, capture_output=True, text=True).stdout.strip()
    Path(env_site, "locked_packages.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    extras = sorted(PROJECT["optional-dependencies"])
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([str(python), "-c", _PROBE, *extras], cwd=tmp_path, capture_output=True,
                         text=True, env=clean)
    assert out.returncode == 0, out.stderr[-3000:]
    probe = json.loads(out.stdout.splitlines()[-1])
    assert Path(probe["file"]).is_relative_to(env), f"halluc_lab came from {probe['file']}"
    source = sorted(".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
                    for p in (ROOT / "halluc_lab").rglob("*.py"))
    assert ["halluc_lab"] + probe["modules"] == source
    data = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "halluc_lab").rglob("*.js"))
    assert data and set(data) <= set(probe["files"]), "the wheel lacks the package's JavaScript"
    assert probe["unmet"] == []
    assert probe["license"] == "MIT"


def _ruff() -> list[str]:
    if importlib.util.find_spec("ruff") is not None:
        return [sys.executable, "-m", "ruff"]
    found = shutil.which("ruff")
    assert found, "ruff is not installed: `make setup` installs the test extra, which has it"
    return [found]


def test_the_lint_ratchet_lists_exactly_the_files_that_still_break_each_rule():
    # ruff without the per-file ignores: each (file, rule) it reports must be listed, nothing else.
    args = ["check", "--config", "lint.per-file-ignores = {}", "--exit-zero", "--output-format",
            "json", "."]
    out = subprocess.run(_ruff() + args, cwd=ROOT, capture_output=True, text=True, check=True)
    found: dict[str, set[str]] = {}
    for v in json.loads(out.stdout):
        path = Path(v["filename"]).resolve().relative_to(ROOT).as_posix()
        found.setdefault(path, set()).add(v["code"])
    ignores = PYPROJECT["tool"]["ruff"]["lint"]["per-file-ignores"]
    listed = {f: set(codes) for f, codes in ignores.items()}
    table = "\n".join(f'"{f}" = [{", ".join(map(json.dumps, sorted(c)))}]'
                      for f, c in sorted(found.items()))
    assert listed == found, ("[tool.ruff.lint.per-file-ignores] must list exactly the files that "
                             "still break each rule (the list only shrinks: fix new lines). "
                             f"Today:\n{table}")


def test_the_citation_file_is_cff_1_2_and_names_the_package_version():
    import yaml

    import halluc_lab

    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    assert cff["cff-version"] == "1.2.0"
    assert {"message", "title", "authors"} <= set(cff) and cff["authors"]
    assert cff["version"] == PROJECT["version"] == halluc_lab.__version__
    assert cff["license"] == PROJECT["license"]
