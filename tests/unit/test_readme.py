"""Every command in README.md works as written, from a fresh clone.

The README's ```bash and ```python blocks are read command by command. A command that finishes in
under a minute at smoke scale on a CPU runs in a fresh clone of this repository (the working
tree's uncommitted changes applied); every other one matches a rule of SKIPPED, which says why CI
cannot run it, and every rule must still match a command. The clone gets its own ``.venv`` with
the set-up already done: the package from the clone (as ``make``'s editable install would give)
and this environment's locked packages through a ``.pth`` file, its console scripts rewritten to
the clone's interpreter. Installing is what test_packaging and ``make test``'s own set-up check.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
TIMEOUT = 180  # seconds a command may take here (each is well under a minute on an idle CPU)

# (pattern searched in the command, why CI does not run it)
SKIPPED = [
    (r"^make book$", "over a minute from a fresh clone; tests/book builds the same book"),
    (r"^make test$", "the suite this test belongs to"),
    (r"^make lab$", "a server that runs until stopped (the root-flag test checks its command)"),
    (r"^python3 -m venv \.venv$", "the clone gets its environment below; make makes it so"),
    (r"^\.venv/bin/pip install ", "installs from the network; test_packaging and make test's "
                                  "set-up check the install"),
    (r"scripts/sweep\.py|^make sweep ", "several smoke runs of chapter 8: minutes"),
    (r"scripts/reproduce\.py --adopt", "adopts full-scale runs, which take a GPU"),
    (r"scripts/replication\.py", "keeps full-scale runs (a GPU) and rewrites a committed page "
                                 "(test_replication checks it)"),
    (r"scripts/reproduce\.py", "re-runs every chapter, at full scale on a GPU"),
    (r"--nnodes=2", "two machines with GPUs"),
    (r"torchrun --nproc_per_node=2 .*--scale full", "two GPUs"),
    (r"--scale full", "full scale: minutes on a GPU, an hour on a CPU"),
]
# The program a README command may start with: make, or one from the project's environment.
PROGRAM = re.compile(r"^(make|\.venv/bin/[\w.-]+|python3 -m venv)( |$)")


def readme_commands() -> list[tuple[str, str]]:
    """``(language, command)`` for each command of the README's bash blocks (continuation lines
    joined, comments dropped) and each python block whole."""
    commands = []
    for lang, body in re.findall(r"^```(bash|python)\n(.*?)^```", README.read_text(), re.M | re.S):
        if lang == "python":
            commands.append((lang, body))
            continue
        for line in body.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                commands.append((lang, shlex.join(words)))
    return commands


def skip_reason(command: str) -> str | None:
    return next((why for pattern, why in SKIPPED if re.search(pattern, command)), None)


COMMANDS = readme_commands()
RUN = [(lang, c) for lang, c in COMMANDS if not skip_reason(c)]


def test_the_readme_has_commands_and_every_skip_rule_still_matches_one():
    assert len(COMMANDS) >= 10 and RUN
    stale = [p for p, _ in SKIPPED if not any(re.search(p, c) for _, c in COMMANDS)]
    assert stale == [], "SKIPPED rules that match no README command"


def test_every_readme_command_names_the_environment_it_runs_in():
    # A bare `python` or `torchrun` is "command not found" unless a virtual environment is active.
    bare = [c for lang, c in COMMANDS if lang == "bash" and not PROGRAM.match(c)]
    assert bare == []


def _git(*args: str, cwd: Path = ROOT, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, **kw)


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """A fresh clone of HEAD with the working tree's changes, and an environment set up in it."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    dst = tmp_path_factory.mktemp("readme") / "halluc-lab"
    head = _git("rev-parse", "HEAD", text=True).stdout.strip()
    _git("clone", "--quiet", "--shared", "--no-checkout", str(ROOT), str(dst))
    _git("checkout", "--quiet", "--detach", head, cwd=dst)
    patch = _git("diff", "HEAD", "--binary").stdout
    if patch:
        _git("apply", "--whitespace=nowarn", "-", cwd=dst, input=patch)
    untracked = _git("ls-files", "--others", "--exclude-standard", "-z", text=True).stdout
    for name in untracked.split("\0"):
        if name:
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dst / name)
    venv = dst / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    env_site = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"],
                              check=True, capture_output=True, text=True).stdout.strip()
    Path(env_site, "setup.pth").write_text("\n".join([str(dst), *site.getsitepackages()]) + "\n")
    for script in Path(sys.executable).parent.iterdir():
        target = venv / "bin" / script.name
        if target.exists() or not script.is_file():
            continue
        head_bytes = script.read_bytes()[:200]
        if head_bytes.startswith(b"#!") and b"python" in head_bytes.split(b"\n")[0]:
            body = script.read_text().split("\n", 1)[1]
            target.write_text(f"#!{python}\n{body}")
            target.chmod(0o755)
    stamps = [".torch", ".installed-book", ".installed-lab", ".installed-bench", ".installed-test"]
    for stamp in stamps:
        (venv / stamp).touch()
    for stamp in stamps:  # the set-up is done: make must not install anything
        assert subprocess.run(["make", "-q", f".venv/{stamp}"], cwd=dst).returncode == 0, stamp
    return dst


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HALLUC_CACHE=str(tmp_path / "cache"), HALLUC_BATCH="1")
    return env


@pytest.mark.slow
@pytest.mark.parametrize("lang, command", RUN, ids=[c.splitlines()[0][:60] for _, c in RUN])
def test_the_readme_command_runs_in_a_fresh_clone(clone, tmp_path, lang, command):
    if lang == "python":
        script = tmp_path / "snippet.py"
        script.write_text(command)
        argv = [str(clone / ".venv" / "bin" / "python"), str(script)]
    else:
        argv = ["bash", "-c", command]
    out = subprocess.run(argv, cwd=clone, env=_env(tmp_path), capture_output=True, text=True,
                         timeout=TIMEOUT)
    assert out.returncode == 0, f"{command}\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"
    assert (out.stdout + out.stderr).strip(), f"{command} printed nothing"


@pytest.mark.parametrize("uid, flag", [("0", True), ("1000", False)], ids=["root", "user"])
def test_make_lab_passes_allow_root_exactly_when_run_as_root(clone, tmp_path, uid, flag):
    # JupyterLab refuses to start as root without --allow-root; `id` is faked to play either user.
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "id").write_text(f"#!/bin/sh\necho {uid}\n")
    (fake / "id").chmod(0o755)
    env = _env(tmp_path) | {"PATH": f"{fake}:{os.environ['PATH']}"}
    out = subprocess.run(["make", "-n", "lab"], cwd=clone, env=env, capture_output=True, text=True,
                         check=True).stdout
    (line,) = [w for w in out.splitlines() if "jupyter lab" in w]
    expected = ["notebooks", "--allow-root"] if flag else ["lab", "notebooks"]
    assert line.split()[-2:] == expected
