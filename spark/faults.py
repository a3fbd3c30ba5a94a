"""Crash points for crash tests: a job dies like ``kill -9`` where an environment variable says."""

from __future__ import annotations

import os
import sys


def crash_point(env: str, name: str) -> None:
    """``os._exit(137)`` right here when ``$env == name`` (no cleanup, no flush of Spark state)."""
    if os.environ.get(env) == name:
        print(f"crashing at {name} ({env})", file=sys.stderr, flush=True)
        os._exit(137)
