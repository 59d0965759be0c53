"""Light facts about the chapter tests, for the main pytest process too (which must not import torch to know them)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SMOKE_TIMES = ROOT / "_build" / "notebook-times"  # one <stem>.json per smoke run of the current test run


def chapter_modules() -> dict[str, str]:
    """Each chapter test module (its path from the root) -> the notebook it reads: its ``NOTEBOOK = "NN_topic"``."""
    found = {}
    for path in sorted((ROOT / "tests" / "notebooks").glob("test_*.py")):
        m = re.search(r'^NOTEBOOK\s*=\s*"([^"]+)"', path.read_text(), re.MULTILINE)
        if m:
            found[path.relative_to(ROOT).as_posix()] = m.group(1)
    return found
