"""The quick loop: `slow` is a registered marker, and CONTRIBUTING.md's `-m "not slow"` run of
the unit tests collects fewer of them than the full run does (which CI makes)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
QUICK = re.compile(r'pytest -m "not slow" tests/unit\b')


def collected(*args: str) -> set[str]:
    """The node ids of ``pytest --collect-only args``, under --strict-markers (an unregistered
    marker is an error) and without the conftest files (whose session hooks clear the running
    suite's smoke-run times)."""
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0",
                           "-p", "no:cacheprovider", "--noconftest", "--strict-markers", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return {line for line in done.stdout.splitlines() if "::" in line}


def test_the_slow_marker_is_registered(pytestconfig):
    assert any(m.split(":")[0].strip() == "slow" for m in pytestconfig.getini("markers"))


@pytest.mark.slow  # two collections of the unit suite
def test_the_quick_loop_collects_fewer_unit_tests_than_the_full_run():
    assert QUICK.search((ROOT / "CONTRIBUTING.md").read_text()), "CONTRIBUTING.md names the loop"
    full, quick = collected("tests/unit"), collected("-m", "not slow", "tests/unit")
    assert quick < full  # a strict subset: only the slow tests are left out
    assert {n for n in full - quick if not n.startswith("tests/unit/test_slow_marker.py")}
