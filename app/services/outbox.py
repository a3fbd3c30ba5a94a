"""The in-database outbox: applications whose tables live in the same PostgreSQL append records
inside their own database transactions (``SELECT txlog.send(...)``), and the records reach their
partitions if and only if those transactions commit — no half message, no check-back.

``txlog.send`` only inserts a row into ``txlog.outbox``: it takes no lock any producer waits for,
so a slow or long application transaction holds up nobody. Every worker of every host runs a
drainer that moves committed rows into the log: per partition, under the partition's drain lock (a
transaction-level advisory lock, so drainers take turns and never queue), it reads the
partition's first rows in id order, appends them through the produce path and deletes them, all
in one database transaction — each row appended exactly once, whatever dies when.

Order, exactly: rows of one application transaction keep the order of their ``txlog.send`` calls;
and if a transaction committed before another began, all its rows come before the other's on
every partition (its ids were drawn first, and a drainer that can see the later rows can see the
earlier ones). Transactions that overlap in time may come in either order, and their rows may
interleave — as records of concurrent Kafka transactions do. The order is never "by commit time"
for overlapping transactions: PostgreSQL does not expose one without serializing every commit.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from app import faults
from app.services import Broker, produce
from app.storage import outbox as q
from app.storage.outbox import Backlog

log = logging.getLogger("txlog.outbox")


@dataclass
class DrainReport:
    appended: int = 0  # rows appended to the log (and deleted from the outbox)
    busy: int = 0  # partitions another drainer was draining
    failed: int = 0


def drain_partition(broker: Broker, topic: str, partition: int, report: DrainReport, budget_s: float = 10.0) -> None:
    """Drain one partition's committed rows, a batch per database transaction, until none is left
    (or the budget is spent, or another drainer holds the partition)."""
    settings = broker.settings
    deadline = time.monotonic() + budget_s
    while time.monotonic() < deadline:
        with broker.db.transaction() as conn:
            if not q.outbox_lock(conn, topic, partition):
                report.busy += 1
                return
            rows = q.outbox_rows(conn, topic, partition, settings.outbox_batch_records)
            if not rows:
                return
            # As many rows as fit in one request (a row larger than that goes alone).
            taken, size = 0, 0
            for row in rows:
                size += row.record.size()
                if taken and size > settings.max_request_bytes:
                    break
                taken += 1
            batch = rows[:taken]
            produce.append(conn, broker, topic, partition, produce.ProduceRequest([r.record for r in batch]), broker.now())
            q.outbox_delete(conn, [r.id for r in batch])
            faults.crash_point(faults.SERVER_CRASH_ENV, "outbox_appended")  # tests only: appended, not committed
        faults.crash_point(faults.SERVER_CRASH_ENV, "outbox_committed")  # tests only: committed
        report.appended += len(batch)
        if len(batch) == len(rows) and len(rows) < settings.outbox_batch_records:
            return


def drain(broker: Broker, budget_s: float = 10.0) -> DrainReport:
    """One pass over every partition with committed rows waiting. A partition that fails is logged
    and left for the next pass."""
    report = DrainReport()
    with broker.db.transaction() as conn:
        waiting = q.outbox_partitions(conn)
    for topic, partition in waiting:
        try:
            drain_partition(broker, topic, partition, report, budget_s)
        except Exception as exc:
            report.failed += 1
            log.warning("could not drain the outbox of %s/%d: %s", topic, partition, exc)
    return report


def backlog(broker: Broker) -> list[Backlog]:
    """Per partition: committed rows not yet in the log, the oldest's id and how long it has waited."""
    with broker.db.read() as conn:
        return q.outbox_backlog(conn)


class DrainerThread(threading.Thread):
    """Drains the outbox every ``TXLOG_OUTBOX_POLL_INTERVAL_MS``, and again at once after a pass that
    appended something; each pass finding nothing doubles the wait, up to
    ``TXLOG_OUTBOX_IDLE_POLL_INTERVAL_MS`` (every worker of every host polls: an idle outbox must
    cost next to nothing, and a busy one is drained back to back). ``appended`` counts the rows it
    moved."""

    def __init__(self, broker: Broker) -> None:
        super().__init__(name="txlog-outbox-drainer", daemon=True)
        self.broker = broker
        self.appended = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        settings = self.broker.settings
        busy = settings.outbox_poll_interval_ms / 1000
        idle = max(busy, settings.outbox_idle_poll_interval_ms / 1000)
        interval = busy
        while not self._stop_event.is_set():
            moved = 0
            try:
                report = drain(self.broker)
                moved = report.appended
                self.appended += moved
            except Exception as exc:  # the database is away, say: try again after the interval
                log.warning("outbox drain failed: %s", exc)
            if moved:
                interval = busy
                continue
            self._stop_event.wait(interval)
            interval = min(idle, interval * 2)

    def stop(self) -> None:
        self._stop_event.set()
