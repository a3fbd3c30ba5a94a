"""The C part of txlog, ``app._native`` (app/_native.c), or None where it was not built (no C
compiler at install time): then the Python definitions it accelerates run alone.

Each of its functions answers None for anything but the plain case it was written for, and its
caller then runs the Python definition, which stays the reference: the tests hold the two equal.
"""

from __future__ import annotations

import importlib
from types import ModuleType

native: ModuleType | None
try:
    native = importlib.import_module("app._native")  # by name: the type checker sees no module to read
except ImportError:  # pragma: no cover - a build without a C compiler
    native = None
