"""Appends notify long-polling fetches only on partitions some process listens to: an append nobody
waits for sends no NOTIFY (and so takes no notify lock); a listening lease makes the appends to its
partition notify until it ends; taking a lease waits for an append in flight on the partition, so
the fetch that reads after it sees that append."""

from __future__ import annotations

import threading
import time

import psycopg

from app.domain.records import NewRecord
from app.services import fetch as fetch_service
from app.services import topics
from app.services.produce import ProduceRequest, produce
from app.storage.log import NOTIFY_CHANNEL


def _notifications(db_url: str, action) -> list[str]:  # type: ignore[no-untyped-def]
    """The payloads notified on the append channel while ``action`` runs (and shortly after)."""
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
        action()
        return [n.payload for n in listener.notifies(timeout=0.5)]


def _append(broker, topic: str, partition: int = 0) -> None:  # type: ignore[no-untyped-def]
    produce(broker, topic, partition, ProduceRequest([NewRecord(None, b"v")]))


def test_appends_notify_only_partitions_with_a_live_lease(broker, db_url):
    topics.create_topic(broker, "t", 2)
    assert _notifications(db_url, lambda: _append(broker, "t", 0)) == []  # nobody listens

    assert fetch_service.listen(broker, [("t", 0)], lease_ms=60_000) == {("t", 0)}
    assert _notifications(db_url, lambda: (_append(broker, "t", 0), _append(broker, "t", 1))) == ["t:0"]

    # a lease that ends: appends stop notifying
    # Long enough that a loaded machine still appends inside it.
    started = time.monotonic()
    assert fetch_service.listen(broker, [("t", 1)], lease_ms=1500) == {("t", 1)}
    assert _notifications(db_url, lambda: _append(broker, "t", 1)) == ["t:1"]
    time.sleep(max(started + 1.6 - time.monotonic(), 0))
    assert _notifications(db_url, lambda: _append(broker, "t", 1)) == []


def test_a_shorter_lease_never_cuts_a_longer_one(broker, db_url):
    topics.create_topic(broker, "t", 1)
    assert fetch_service.listen(broker, [("t", 0)], lease_ms=60_000) == {("t", 0)}
    assert fetch_service.listen(broker, [("t", 0)], lease_ms=1) == {("t", 0)}  # another process, about to stop
    time.sleep(0.05)
    assert _notifications(db_url, lambda: _append(broker, "t", 0)) == ["t:0"]


def test_no_lease_on_a_partition_that_does_not_exist(broker):
    topics.create_topic(broker, "t", 1)
    assert fetch_service.listen(broker, [("t", 5), ("t", 0), ("nope", 0), ("t", 0)], lease_ms=60_000) == {("t", 0)}
    assert fetch_service.listen(broker, [("t", 5)], lease_ms=60_000) == set()
    assert fetch_service.listen(broker, [("nope", 0)], lease_ms=60_000) == set()


def test_taking_a_lease_waits_for_the_append_in_flight(broker, db_url):
    topics.create_topic(broker, "t", 1)
    taken = threading.Event()
    with psycopg.connect(db_url) as appender:
        # an append holding the partition's append lock, not yet committed
        appender.execute("SELECT 1 FROM txlog.partitions WHERE topic = 't' AND partition = 0 FOR UPDATE")
        thread = threading.Thread(target=lambda: (fetch_service.listen(broker, [("t", 0)], 60_000), taken.set()))
        thread.start()
        assert not taken.wait(0.5), "the lease was taken while an append held the partition"
        appender.commit()
    assert taken.wait(5)
    thread.join()
