"""Halluc Lab: the library behind the executable book (ARCHITECTURE.md).

One module per concept, grouped into subpackages by role (ARCHITECTURE.md §2); notebooks import
what they need, e.g. ``from halluc_lab.generation import sampling``. The names below are what
every chapter uses.
"""

import os as _os

from halluc_lab._version import __version__
from halluc_lab.book.notebook import footer
from halluc_lab.device import Runtime, setup

__all__ = ["Runtime", "setup", "footer", "__version__"]

if _os.environ.get("HALLUC_CHECK_FIGURES") == "1":  # the notebook tests: unreadable figures warn
    from halluc_lab.book.figures import check_figures

    check_figures()
