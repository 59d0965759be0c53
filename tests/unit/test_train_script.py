"""scripts/train.py: the device the library chooses ($HALLUC_DEVICE honoured and checked), one
seed in its header and its result, Ctrl-C, full scale on a CPU, and the recipe names in its docs."""

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import train  # noqa: E402
from halluc_lab import recipes  # noqa: E402

RECIPE = "arithmetic-sft-clean"


@pytest.fixture
def interrupted(monkeypatch):
    """Ctrl-C as the first recipe starts loading: the run stops before any training."""
    def load(recipe, rt, verbose=False):
        raise KeyboardInterrupt
    monkeypatch.setattr(recipes, "load", load)


def test_ctrl_c_exits_with_130_and_a_message_not_a_traceback(interrupted, capsys, monkeypatch):
    monkeypatch.delenv("HALLUC_DEVICE", raising=False)
    assert train.main([RECIPE, "--scale", "smoke"]) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and "resumes it from its last checkpoint" in err
    assert "Traceback" not in err


def test_the_header_says_why_the_device_was_chosen_and_the_chains_seed(interrupted, capsys,
                                                                        monkeypatch):
    monkeypatch.delenv("HALLUC_DEVICE", raising=False)
    train.main([RECIPE, "--scale", "smoke"])
    header = capsys.readouterr().out
    assert "device: " in header and "asked for" not in header
    assert "seed 0" in header  # the registry's chain seed, which the result line names too
    train.main([RECIPE, "--scale", "smoke", "--seed", "3"])
    assert "seed 3" in capsys.readouterr().out


def test_halluc_device_is_honoured(interrupted, capsys, monkeypatch):
    monkeypatch.setenv("HALLUC_DEVICE", "cpu")
    train.main([RECIPE, "--scale", "smoke"])
    assert "device: cpu ($HALLUC_DEVICE=cpu)" in capsys.readouterr().out


@pytest.mark.parametrize("value", ["tpu", "auto", "CPU"])
def test_a_bad_halluc_device_is_refused_naming_the_variable(value, capsys, monkeypatch):
    monkeypatch.setenv("HALLUC_DEVICE", value)
    with pytest.raises(SystemExit) as exit_:
        train.main([RECIPE, "--scale", "smoke"])
    assert exit_.value.code == 2 and "$HALLUC_DEVICE must be one of" in capsys.readouterr().err


@pytest.mark.slow
def test_full_scale_on_a_cpu_asks_for_yes(capsys, monkeypatch):
    monkeypatch.setenv("HALLUC_DEVICE", "cpu")
    with pytest.raises(SystemExit) as exit_:
        train.main([RECIPE, "--scale", "full"])
    err = capsys.readouterr().err
    steps = train.chain_steps(recipes.get(RECIPE, "full"))
    assert exit_.value.code == 2 and "--yes" in err and f"{steps:,} steps" in err


def recipe_names_in(text: str) -> set[str]:
    tasks = "|".join(sorted(map(re.escape, recipes.TASKS), key=len, reverse=True))
    return set(re.findall(rf"(?<![\w-])(?:{tasks})(?:-[a-z0-9_]+)+", text))


def test_every_recipe_name_in_the_scripts_and_readme_exists():
    files = [ROOT / "README.md", *sorted((ROOT / "scripts").glob("*.py"))]
    named = {(f.name, n) for f in files for n in recipe_names_in(f.read_text())}
    assert {"arithmetic-sft-clean", "kb_walk-rlvr"} <= {n for _, n in named}  # it finds names
    unknown = sorted((f, n) for f, n in named if n not in recipes.NAMES)
    assert not unknown, f"names that are not recipes: {unknown}"
