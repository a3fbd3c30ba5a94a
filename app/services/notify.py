"""Long-poll support: one LISTEN connection per process wakes the fetches waiting on a partition.

An append ``NOTIFY txlog_append, 'topic:partition'`` in its own transaction (so the notification
arrives only after the records are committed), and only while some process holds a listening
lease on the partition: appends nobody waits for pay nothing. A fetch subscribes *before* it
reads, and the subscription makes sure the process's lease covers the longest wait before the
fetch reads, so an append between its read and its wait still wakes it.

Used by every asyncio way in: the HTTP API's fetch (``api/notify.py`` runs the blocking lease
calls in Starlette's thread pool) and the Kafka gateway's (in its executor, or ``asyncio.to_thread``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from typing import Any, AsyncIterator, Awaitable, Callable, Sequence, TypeVar

from app.domain.limits import long_poll_wait_ms
from app.storage.log import append_notifications
from app.storage.topics import deleted_topic_payload

DELETED_TOPIC_SUFFIX = deleted_topic_payload("")  # a topic's deletion: every lease on it is gone

log = logging.getLogger("txlog.notify")

# How a blocking call runs off the event loop: ``run(fn, *args)`` → awaitable of its result.
RunBlocking = Callable[..., Awaitable[Any]]
T = TypeVar("T")


class Subscription:
    def __init__(self) -> None:
        self._event = asyncio.Event()

    def fire(self) -> None:
        self._event.set()

    async def wait(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
        except TimeoutError:
            return False
        self._event.clear()
        return True


# A process's listening lease on a partition lasts LEASE_S and is renewed by a subscription that
# finds less than RENEW_BELOW_S left, which is more than the longest long-poll (60 s): a lease
# always outlasts the wait that checked it. A process that dies leaves appends notifying for at
# most LEASE_S.
LEASE_S = 120.0
RENEW_BELOW_S = 65.0


class AppendNotifier:
    def __init__(
        self,
        database_url: str,
        listen: Callable[[Sequence[tuple[str, int]], int], set[tuple[str, int]]],
        run_blocking: RunBlocking | None = None,
    ) -> None:
        """``listen(partitions, lease_ms)`` takes or renews the process's lease on each partition,
        answering those that exist (blocking: it runs through ``run_blocking``, by default
        ``asyncio.to_thread``)."""
        self.database_url = database_url
        self._listen = listen
        self._run_blocking: RunBlocking = run_blocking or asyncio.to_thread
        self._subs: dict[str, set[Subscription]] = defaultdict(set)
        self._leases: dict[tuple[str, int], float] = {}  # monotonic time each lease ends
        self._task: asyncio.Task[None] | None = None
        self.waiting = 0  # long-polling fetches subscribed now

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._listen_forever())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def _ensure_leases(self, partitions: Sequence[tuple[str, int]]) -> None:
        """The process's lease on each of ``partitions`` that has less than RENEW_BELOW_S left,
        taken or renewed for all of them in one statement."""
        now = time.monotonic()
        due = [key for key in partitions if self._leases.get(key, 0.0) - now < RENEW_BELOW_S]
        if not due:
            return
        try:
            granted = await self._run_blocking(self._listen, due, int(LEASE_S * 1000))
        except Exception as exc:  # the database is away: the fetch itself will say so, or time out
            log.debug("cannot take listening leases on %d partitions: %s", len(due), exc)
            return
        for key in granted:
            self._leases[key] = now + LEASE_S

    def subscribe(self, topic: str, partition: int) -> contextlib.AbstractAsyncContextManager[Subscription]:
        return self.subscribe_all([(topic, partition)])

    @contextlib.asynccontextmanager
    async def subscribe_all(self, partitions: Sequence[tuple[str, int]]) -> AsyncIterator[Subscription]:
        """One wait on appends to any of ``partitions``: one subscription fired by each of them,
        counted once in ``waiting`` however many partitions it covers (the bound on long polls is
        on fetches waiting, and a fetch of 1,000 partitions is one of them)."""
        unique = list(dict.fromkeys(partitions))
        keys = [f"{topic}:{partition}" for topic, partition in unique]
        sub = Subscription()
        for key in keys:
            self._subs[key].add(sub)
        self.waiting += 1
        try:
            await self._ensure_leases(unique)
            yield sub
        finally:
            self.waiting -= 1
            for key in keys:
                self._subs[key].discard(sub)
                if not self._subs[key]:
                    del self._subs[key]

    def _topic_deleted(self, topic: str) -> None:
        """The topic's leases went with it: forgotten, so that a topic made again under the name
        is leased anew; its waiters wake and read that it is gone."""
        self._leases = {key: ends for key, ends in self._leases.items() if key[0] != topic}
        for key, subs in list(self._subs.items()):
            if key.rpartition(":")[0] == topic:
                for sub in list(subs):
                    sub.fire()

    def _wake_all(self) -> None:
        for subs in self._subs.values():
            for sub in subs:
                sub.fire()

    async def _listen_forever(self) -> None:
        backoff = 0.1
        while True:
            try:
                async with append_notifications(self.database_url) as payloads:
                    backoff = 0.1
                    self._wake_all()  # anything missed while disconnected: let waiters re-read
                    async for payload in payloads:
                        if payload.endswith(DELETED_TOPIC_SUFFIX):
                            self._topic_deleted(payload[: -len(DELETED_TOPIC_SUFFIX)])
                            continue
                        for sub in list(self._subs.get(payload, ())):
                            sub.fire()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # database away: keep trying; waiters just time out meanwhile
                log.debug("listener disconnected: %s", exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)


# The least a wait sleeps before reading again at a reading's due time (``wait_for_records``).
MIN_DUE_S = 0.01


async def wait_for_records(
    notifier: AppendNotifier | None,
    partitions: Sequence[tuple[str, int]],
    wait_ms: int,
    max_wait_ms: int,
    max_waiting: int,
    read: Callable[[], Awaitable[T]],
    enough: Callable[[T], bool],
    due_in: Callable[[T], float | None] | None = None,
) -> T:
    """A fetch's long poll, for every way in: ``read()`` once, and while what it read is not
    ``enough``, wait for an append to one of ``partitions`` and read again, for at most ``wait_ms``
    from now (bounded by ``max_wait_ms``, and not at all when ``max_waiting`` fetches already wait
    in this process: ``limits.long_poll_wait_ms``). Subscribed before the second reading, so an
    append between the first reading and the subscription still wakes it. Answers the last reading.
    Without a notifier (no database to listen to) it does not wait.

    ``due_in(reading)``: in how many seconds that reading will be out of date with no notification
    (a share fetch's next lock deadline: the records come back by the clock, and nobody appends or
    notifies). The wait then also ends at that time, to read again: one timer per wait, not a poll."""
    deadline = time.monotonic() + wait_ms / 1000
    reading = await read()
    if enough(reading) or notifier is None:
        return reading
    wait_ms = long_poll_wait_ms(wait_ms, max_wait_ms, notifier.waiting, max_waiting)
    deadline = min(deadline, time.monotonic() + wait_ms / 1000)
    if deadline <= time.monotonic():
        return reading
    # One subscription for all the partitions: an append to any of them fires it, and a wait is one
    # event and one timer however many partitions the fetch has.
    async with notifier.subscribe_all(partitions) as subscription:
        reading = await read()
        while not enough(reading) and (left := deadline - time.monotonic()) > 0:
            due = due_in(reading) if due_in is not None else None
            if due is not None and due < left:
                # Read again when it is due (at least a moment on: a deadline just passed is
                # taken by that reading, never met again by the next).
                await subscription.wait(max(due, MIN_DUE_S))
            elif not await subscription.wait(left):
                break
            reading = await read()
    return reading
