"""Crash points for crash tests: a process dies like ``kill -9`` where an environment variable says.

The server's points are named by ``TXLOG_CRASH_AT`` (see ``SERVER_CRASH_ENV``); Spark jobs have
their own variables. Unset, a crash point does nothing."""

from __future__ import annotations

import os
import sys


SERVER_CRASH_ENV = "TXLOG_CRASH_AT"


def crash_point(env: str, name: str) -> None:
    """``os._exit(137)`` right here when ``$env == name`` (no cleanup, no flush of Spark state)."""
    if os.environ.get(env) == name:
        print(f"crashing at {name} ({env})", file=sys.stderr, flush=True)
        os._exit(137)
