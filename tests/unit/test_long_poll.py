"""The long poll every fetch shares (``app.services.notify.wait_for_records``): woken by a
notification, or at the time its reading says it will be out of date (a share fetch's next lock
deadline), and otherwise not before its wait ends."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncIterator

from app.services.notify import Subscription, wait_for_records


class FakeNotifier:
    """Subscriptions without a database; ``fire`` stands for a NOTIFY of a partition."""

    def __init__(self) -> None:
        self.waiting = 0
        self.subs: dict[tuple[str, int], set[Subscription]] = {}

    @contextlib.asynccontextmanager
    async def subscribe_all(self, partitions: list[tuple[str, int]]) -> AsyncIterator[Subscription]:
        sub = Subscription()
        for tp in partitions:
            self.subs.setdefault(tp, set()).add(sub)
        try:
            yield sub
        finally:
            for tp in partitions:
                self.subs[tp].discard(sub)

    def fire(self, topic: str, partition: int) -> None:
        for sub in self.subs.get((topic, partition), ()):
            sub.fire()


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_a_reading_due_later_is_read_again_then_without_a_notification() -> None:
    """Records held by another member until a deadline: the wait reads again at the deadline,
    not at the end of its MaxWaitMs, and nothing else makes it read."""
    events: list[str] = []

    async def scenario() -> Any:
        readings = iter([None, None, "records"])  # the first reading, the one after subscribing, at the deadline

        async def read() -> Any:
            value = next(readings)
            events.append(f"read {value}")
            return value

        return await wait_for_records(
            FakeNotifier(),  # type: ignore[arg-type]
            [("t", 0)],
            wait_ms=60_000,
            max_wait_ms=60_000,
            max_waiting=10,
            read=read,
            enough=lambda v: v is not None,
            due_in=lambda v: 0.05,
        )

    assert _run(scenario()) == "records"
    assert events == ["read None", "read None", "read records"]


def test_without_a_due_time_only_a_notification_or_the_wait_ends_it() -> None:
    events: list[str] = []

    async def scenario() -> Any:
        notifier = FakeNotifier()
        readings = iter([None, None, "appended"])

        async def read() -> Any:
            value = next(readings)
            events.append(f"read {value}")
            if len(events) == 2:  # parked now: an append arrives
                asyncio.get_running_loop().call_soon(notifier.fire, "t", 0)
            return value

        return await wait_for_records(
            notifier,  # type: ignore[arg-type]
            [("t", 0)],
            wait_ms=60_000,
            max_wait_ms=60_000,
            max_waiting=10,
            read=read,
            enough=lambda v: v is not None,
            due_in=lambda v: None,
        )

    assert _run(scenario()) == "appended"
    assert events == ["read None", "read None", "read appended"]


def test_a_due_time_past_the_wait_does_not_read_again() -> None:
    reads: list[int] = []

    async def scenario() -> Any:
        async def read() -> Any:
            reads.append(1)
            return None

        return await wait_for_records(
            FakeNotifier(),  # type: ignore[arg-type]
            [("t", 0)],
            wait_ms=50,
            max_wait_ms=60_000,
            max_waiting=10,
            read=read,
            enough=lambda v: v is not None,
            due_in=lambda v: 30.0,
        )

    assert _run(scenario()) is None
    assert len(reads) == 2  # before and after subscribing; the wait ended before the due time
