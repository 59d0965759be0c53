"""Every example in the library's docstrings runs and prints what it says (an example that drifts from the
code teaches the wrong thing)."""

import doctest
import importlib
import pkgutil

import pytest

import halluc_lab

MODULES = sorted(m.name for m in pkgutil.walk_packages(halluc_lab.__path__, "halluc_lab."))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_hold(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
                             verbose=False, report=True)
    assert result.failed == 0, f"{result.failed} of {result.attempted} docstring examples of {name} failed (printed above)"
