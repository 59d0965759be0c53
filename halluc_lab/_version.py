"""The library's version, in one place (pyproject.toml and CITATION.cff say the same: a test
checks)."""

__version__ = "0.1.0"
