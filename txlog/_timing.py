"""How the client's classes count time: a ``timeout`` in seconds becomes a deadline on the monotonic
clock (``None`` or negative: no limit), a long poll waits no longer than the time left, and the pause
after a failed attempt doubles from ``retry.backoff.ms`` up to a ceiling."""

from __future__ import annotations

import time


def deadline(timeout: float | None) -> float | None:
    if timeout is None or timeout < 0:
        return None
    return time.monotonic() + timeout


def remaining(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    return max(deadline - time.monotonic(), 0.0)


def wait_ms(wait_max_ms: int, remaining: float | None) -> int:
    """A long poll's wait: ``fetch.wait.max.ms`` at most, and never past the caller's timeout."""
    return wait_max_ms if remaining is None else int(min(wait_max_ms, remaining * 1000))


def backoff(attempt: int, backoff_s: float, backoff_max_s: float) -> float:
    """The pause after the ``attempt``-th failure in a row (the first is 1): ``backoff_s`` doubled
    each time, at most ``backoff_max_s``."""
    return min(backoff_s * 2 ** (attempt - 1), backoff_max_s)
