"""Halluc Lab: the library behind the executable book (ARCHITECTURE.md).

One module per concept; notebooks import what they need, e.g.
``from halluc_lab import sampling``. The names below are what every chapter uses.
"""

from halluc_lab.device import Runtime, setup
from halluc_lab.notebook import footer

__version__ = "0.1.0"
__all__ = ["Runtime", "setup", "footer", "__version__"]
