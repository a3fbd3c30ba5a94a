"""Long-poll support for the HTTP API: ``app.services.notify``'s notifier, its blocking lease calls
run in Starlette's thread pool as the API's other blocking work."""

from __future__ import annotations

from typing import Callable, Sequence

from fastapi.concurrency import run_in_threadpool

from app.services import notify
from app.services.notify import LEASE_S, RENEW_BELOW_S, Subscription

__all__ = ["AppendNotifier", "LEASE_S", "RENEW_BELOW_S", "Subscription"]


class AppendNotifier(notify.AppendNotifier):
    def __init__(self, database_url: str, listen: Callable[[Sequence[tuple[str, int]], int], set[tuple[str, int]]]) -> None:
        super().__init__(database_url, listen, run_blocking=run_in_threadpool)
