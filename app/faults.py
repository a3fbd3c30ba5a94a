"""Crash points and stop points for tests: a process dies like ``kill -9``, or its host freezes,
where an environment variable says.

The server's crash points are named by ``TXLOG_CRASH_AT`` (see ``SERVER_CRASH_ENV``), its stop
points by ``TXLOG_STOP_AT`` (``SERVER_STOP_ENV``); Spark jobs have their own variables. Unset, a
crash point or a stop point does nothing."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections import Counter

SERVER_CRASH_ENV = "TXLOG_CRASH_AT"
SERVER_STOP_ENV = "TXLOG_STOP_AT"


def crash_point(env: str, name: str) -> None:
    """``os._exit(137)`` right here when ``$env == name`` (no cleanup, no flush of Spark state)."""
    if os.environ.get(env) == name:
        print(f"crashing at {name} ({env})", file=sys.stderr, flush=True)
        os._exit(137)


_passes: Counter[str] = Counter()
_passes_lock = threading.Lock()


def stop_point(env: str, name: str) -> None:
    """Freeze right here, as a stalled VM freezes its host: when ``$env`` is ``name`` or
    ``name:N``, the N-th time (default: the first) this process passes, SIGSTOP every process of
    its process group (``txlog serve`` and its workers), holding whatever sessions and row locks
    they hold. SIGCONT resumes them where they stood. Passes are counted per process and a process
    stops the group once: with several workers each would stop it at its own N-th pass, so tests
    that resume the server run it with one worker."""
    spec = os.environ.get(env)
    if not spec:
        return
    target, _, nth = spec.partition(":")
    if target != name:
        return
    with _passes_lock:
        _passes[name] += 1
        if _passes[name] != int(nth or 1):
            return
    print(f"stopping at {name} ({env}); SIGCONT resumes", file=sys.stderr, flush=True)
    os.killpg(os.getpgrp(), signal.SIGSTOP)
