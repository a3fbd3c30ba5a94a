"""Long-poll wake-ups outside FastAPI (app.services.notify), as the Kafka gateway uses them: a
subscription before the read is woken by an append committed after it, only for its partition;
the blocking lease calls run where the caller says."""

from __future__ import annotations

import asyncio
import functools
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from app.domain.records import NewRecord
from app.services import fetch as fetch_service
from app.services import produce as produce_service
from app.services import topics
from app.services.notify import AppendNotifier
from app.services.produce import ProduceRequest


def test_the_notifier_needs_no_web_framework():
    code = "import sys, app.services.notify; assert not any(m.split('.')[0] in ('fastapi', 'starlette') for m in sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_an_append_wakes_the_subscription_of_its_partition_only(broker, db_url):
    topics.create_topic(broker, "n", 2)
    ran_in: list[str] = []
    pool = ThreadPoolExecutor(2, thread_name_prefix="gateway-pool")

    def listen(partitions: list[tuple[str, int]], lease_ms: int) -> set[tuple[str, int]]:
        import threading

        ran_in.append(threading.current_thread().name)
        return fetch_service.listen(broker, partitions, lease_ms)

    async def run_in_pool(fn, *args):  # type: ignore[no-untyped-def]
        return await asyncio.get_running_loop().run_in_executor(pool, functools.partial(fn, *args))

    async def scenario() -> tuple[bool, bool, int]:
        notifier = AppendNotifier(db_url, listen, run_blocking=run_in_pool)
        notifier.start()
        try:
            await asyncio.sleep(0.3)  # the listener connected (connecting wakes every waiter: it may have missed appends)
            async with notifier.subscribe("n", 0) as woken, notifier.subscribe("n", 1) as other:
                assert notifier.waiting == 2
                await asyncio.to_thread(produce_service.produce, broker, "n", 0, ProduceRequest([NewRecord(None, b"x")]))
                got = await woken.wait(10)
                stray = await other.wait(0.3)
            return got, stray, notifier.waiting
        finally:
            await notifier.stop()

    try:
        got, stray, waiting = asyncio.run(scenario())
    finally:
        pool.shutdown()
    assert (got, stray, waiting) == (True, False, 0)
    assert ran_in and all(name.startswith("gateway-pool") for name in ran_in)


def test_by_default_the_lease_is_taken_in_a_worker_thread(broker, db_url):
    topics.create_topic(broker, "d", 1)

    async def scenario() -> bool:
        notifier = AppendNotifier(db_url, functools.partial(fetch_service.listen, broker))
        notifier.start()
        try:
            async with notifier.subscribe("d", 0) as sub:
                await asyncio.sleep(0.3)
                await asyncio.to_thread(produce_service.produce, broker, "d", 0, ProduceRequest([NewRecord(None, b"y")]))
                return await sub.wait(10)
        finally:
            await notifier.stop()

    assert asyncio.run(scenario()) is True


def test_a_topic_deleted_and_made_again_is_leased_anew(broker, db_url):
    """The lease rows go with a deleted topic; every notifier forgets its leases on it (the deletion
    notifies), so appends to a topic made again under the name wake the next long poll at once."""
    topics.create_topic(broker, "again", 1)

    def append() -> None:
        produce_service.produce(broker, "again", 0, ProduceRequest([NewRecord(None, b"z")]))

    async def scenario() -> tuple[bool, bool, bool]:
        notifier = AppendNotifier(db_url, functools.partial(fetch_service.listen, broker))
        notifier.start()
        try:
            async with notifier.subscribe("again", 0) as sub:
                await asyncio.to_thread(append)
                before = await sub.wait(10)
            async with notifier.subscribe("again", 0) as sub:
                await asyncio.to_thread(topics.delete_topic, broker, "again")
                deleted = await sub.wait(10)  # the deletion's notification was handled
            await asyncio.to_thread(topics.create_topic, broker, "again", 1)
            async with notifier.subscribe("again", 0) as sub:
                await asyncio.to_thread(append)
                after = await sub.wait(10)
            return before, deleted, after
        finally:
            await notifier.stop()

    assert asyncio.run(scenario()) == (True, True, True)
