"""Long-poll support: one LISTEN connection per process wakes the fetches waiting on a partition.

Producers ``NOTIFY txlog_append, 'topic:partition'`` in the appending transaction, so the
notification arrives only after the records are committed. A fetch subscribes *before* it reads,
so an append between its read and its wait still wakes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from typing import AsyncIterator

import psycopg

from app.storage.db import libpq_url
from app.storage.queries import NOTIFY_CHANNEL

log = logging.getLogger("txlog.notify")


class Subscription:
    def __init__(self) -> None:
        self._event = asyncio.Event()

    def fire(self) -> None:
        self._event.set()

    async def wait(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        self._event.clear()
        return True


class AppendNotifier:
    def __init__(self, database_url: str) -> None:
        self.url = libpq_url(database_url)
        self._subs: dict[str, set[Subscription]] = defaultdict(set)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._listen_forever())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    @contextlib.asynccontextmanager
    async def subscribe(self, topic: str, partition: int) -> AsyncIterator[Subscription]:
        key = f"{topic}:{partition}"
        sub = Subscription()
        self._subs[key].add(sub)
        try:
            yield sub
        finally:
            self._subs[key].discard(sub)
            if not self._subs[key]:
                del self._subs[key]

    def _wake_all(self) -> None:
        for subs in self._subs.values():
            for sub in subs:
                sub.fire()

    async def _listen_forever(self) -> None:
        backoff = 0.1
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
                    await conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    backoff = 0.1
                    self._wake_all()  # anything missed while disconnected: let waiters re-read
                    async for note in conn.notifies():
                        for sub in list(self._subs.get(note.payload, ())):
                            sub.fire()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # database away: keep trying; waiters just time out meanwhile
                log.debug("listener disconnected: %s", exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
