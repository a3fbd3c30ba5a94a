"""The background sweeper: aborts timed-out transactions (fencing their producers), completes
prepared transactions left behind by a crash, expires idle transactional ids and producer state,
applies retention, fences share groups' members whose session ended and consumer groups' members
past their session or rebalance timeout, and gives back share groups'
records whose acquisition lock expired.

Every worker on every host runs one, and they share the work: each due item is claimed with
``FOR UPDATE SKIP LOCKED`` and handled in its own database transaction, its condition re-checked
under the lock, until nothing is due (a round that runs out of time is followed by the next one at
once). One item that fails is logged and left for the next round; it does not end this one. Time
is the database's clock (``Broker.now``), so hosts whose own clocks disagree still agree on what
is due.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import Callable

from sqlalchemy.engine import Connection

from app.domain import transactions as txn
from app.domain.transactions import TxnMetadata, TxnState
from app.errors import DatabaseUnavailable, TxlogError
from app.services import Broker, consumer_groups, coordinator, retention, share_groups, share_locks
from app.services.rounds import RoundReport
from app.storage import producers as producers_store
from app.storage import transactions as transactions_store

log = logging.getLogger("txlog.sweeper")

# Rows one statement of a bulk job deletes at most.
BATCH_ROWS = 1000


@dataclass
class SweepReport(RoundReport):
    timed_out: int = 0
    recovered: int = 0
    expired: int = 0
    removed: int = 0
    producer_states_expired: int = 0
    producer_ids_forgotten: int = 0
    log_start_moved: int = 0
    records_deleted: int = 0
    share_records_released: int = 0  # share groups' records whose lock expired: available again
    share_records_archived: int = 0  # ... or archived at the delivery-count limit
    share_members_fenced: int = 0  # share groups' members whose session ended (their records given back)
    consumer_members_fenced: int = 0  # consumer groups' (KIP-848) members past their session or rebalance timeout
    failed: int = 0
    more_due: bool = False  # a job spent its budget with items still due: the next round should not wait


def _each_claimed(
    broker: Broker,
    what: str,
    claim: Callable[[Connection, list[str]], TxnMetadata | None],
    handle: Callable[[Connection, TxnMetadata], bool],
    budget_s: float,
    report: SweepReport,
) -> int:
    """Claim and handle due transactions one at a time, each in its own database transaction,
    until none is due or ``budget_s`` is spent. ``claim`` skips the ids it is given: those that
    failed in this round, and those found not due after all once locked."""
    done = 0
    passed: list[str] = []
    deadline = time.monotonic() + budget_s
    while True:
        if time.monotonic() >= deadline:
            report.more_due = True
            break
        tid = None
        try:
            with broker.db.transaction() as conn:
                meta = claim(conn, passed)
                if meta is None:
                    break
                tid = meta.transactional_id
                if handle(conn, meta):
                    done += 1
                else:
                    passed.append(tid)
        except Exception as exc:  # one bad item does not end the round
            if tid is None:
                raise
            passed.append(tid)
            report.failed += 1
            log.warning("sweeper could not %s transaction %r: %s", what, tid, exc)
    return done


def abort_timed_out(broker: Broker, report: SweepReport | None = None, budget_s: float = 60.0) -> int:
    """Ongoing transactions past their timeout: aborted, their producers fenced (``timed_out``)."""
    report = report or SweepReport()

    def claim(conn: Connection, skip: list[str]) -> TxnMetadata | None:
        return transactions_store.txn_claim(conn, "timed_out", now_ms=broker.now(), skip=skip)

    def handle(conn: Connection, meta: TxnMetadata) -> bool:
        if not txn.is_timed_out(meta, broker.now()):
            return False
        coordinator.finish_open(conn, broker, meta, "timed_out")
        log.info(
            "aborted transaction %r at epoch %d: timed out after %d ms",
            meta.transactional_id,
            meta.producer_epoch,
            meta.timeout_ms,
        )
        return True

    return _each_claimed(broker, "abort", claim, handle, budget_s, report)


def complete_prepared(broker: Broker, report: SweepReport | None = None, budget_s: float = 60.0, older_than_ms: int = 0) -> int:
    """A prepared transaction not locked by anyone is one whose EndTxn died between its steps (or is
    between them right now: ``older_than_ms`` leaves those alone for a moment)."""
    report = report or SweepReport()

    def before() -> int:  # prepared at or before older_than_ms ago
        return broker.now() - older_than_ms + 1

    def claim(conn: Connection, skip: list[str]) -> TxnMetadata | None:
        return transactions_store.txn_claim(conn, "prepared", before_ms=before(), skip=skip)

    def handle(conn: Connection, meta: TxnMetadata) -> bool:
        if not txn.is_stuck_prepared(meta, before()):
            return False
        coordinator.complete(conn, broker, meta)
        log.info("completed prepared transaction %r (%s)", meta.transactional_id, meta.state.value)
        return True

    return _each_claimed(broker, "complete", claim, handle, budget_s, report)


def expire_transactional_ids(broker: Broker, report: SweepReport | None = None, budget_s: float = 60.0) -> tuple[int, int]:
    """Idle past transactional.id.expiration.ms: Dead; Dead for another interval: removed."""
    report = report or SweepReport()
    expiration = broker.settings.transactional_id_expiration_ms
    ended = [s.value for s in TxnState if s.expiration_allowed]

    def claim_idle(conn: Connection, skip: list[str]) -> TxnMetadata | None:
        return transactions_store.txn_claim(conn, "idle", before_ms=broker.now() - expiration, states=ended, skip=skip)

    def expire(conn: Connection, meta: TxnMetadata) -> bool:
        if not meta.state.expiration_allowed or meta.updated_at_ms >= broker.now() - expiration:
            return False
        coordinator.record(conn, broker, meta, txn.expired(meta, broker.now()))
        return True

    def claim_dead(conn: Connection, skip: list[str]) -> TxnMetadata | None:
        before = broker.now() - broker.settings.transaction_abort_check_interval_ms
        return transactions_store.txn_claim(conn, "idle", before_ms=before, states=[TxnState.DEAD.value], skip=skip)

    def remove(conn: Connection, meta: TxnMetadata) -> bool:
        transactions_store.txn_delete(conn, meta.transactional_id)
        return True

    expired = _each_claimed(broker, "expire", claim_idle, expire, budget_s, report)
    removed = _each_claimed(broker, "remove", claim_dead, remove, budget_s, report)
    return expired, removed


def _until_done(broker: Broker, step: Callable[[Connection], int], budget_s: float) -> int:
    """Run a bulk step (each in its own database transaction, at most BATCH_ROWS rows) until it
    finds less than a full batch to do, or the budget is spent."""
    total = 0
    deadline = time.monotonic() + budget_s
    while time.monotonic() < deadline:
        with broker.db.transaction() as conn:
            n = step(conn)
        total += n
        if n < BATCH_ROWS:
            break
    return total


def expire_producer_states(broker: Broker, budget_s: float = 60.0) -> int:
    older_than = broker.now() - broker.settings.producer_id_expiration_ms
    return _until_done(broker, lambda conn: producers_store.producer_states_expire(conn, older_than, BATCH_ROWS), budget_s)


def forget_producer_ids(broker: Broker, budget_s: float = 60.0) -> int:
    """Producer ids retired longer than producer.id.expiration.ms ago are forgotten."""
    older_than = broker.now() - broker.settings.producer_id_expiration_ms
    return _until_done(broker, lambda conn: producers_store.producer_ids_forget(conn, older_than, BATCH_ROWS), budget_s)


def sweep(broker: Broker, budget_s: float | None = None) -> SweepReport:
    """One round of every job. Each job gets ``budget_s`` (default: the check interval, at least a
    second) before the next one runs; whatever is left is for the next round."""
    budget = budget_s if budget_s is not None else max(1.0, broker.settings.transaction_abort_check_interval_ms / 1000)
    report = SweepReport()
    jobs: list[tuple[str, Callable[[], None]]] = [
        ("timed_out", lambda: setattr(report, "timed_out", abort_timed_out(broker, report, budget))),
        ("recovered", lambda: setattr(report, "recovered", complete_prepared(broker, report, budget))),
        ("expired", lambda: _set_pair(report, expire_transactional_ids(broker, report, budget))),
        ("producer_states_expired", lambda: setattr(report, "producer_states_expired", expire_producer_states(broker, budget))),
        ("producer_ids_forgotten", lambda: setattr(report, "producer_ids_forgotten", forget_producer_ids(broker, budget))),
        ("retention", lambda: _set_retention(report, retention.apply(broker, budget))),
        ("share_sessions", lambda: setattr(report, "share_members_fenced", share_groups.expire_sessions(broker))),
        ("consumer_group_members", lambda: setattr(report, "consumer_members_fenced", consumer_groups.expire_members(broker))),
        ("share_locks", lambda: _set_share_locks(report, share_locks.expire_due(broker, budget_s=budget))),
    ]
    for name, job in jobs:
        try:
            job()
        except DatabaseUnavailable as exc:  # the others would fail the same way: the next round tries again
            report.failed += 1
            log.warning("sweeper round stopped at job %s: %s", name, exc)
            break
        except TxlogError as exc:  # a conflict, or too slow an answer: the next job and round try again
            report.failed += 1
            log.warning("sweeper job %s failed: %s", name, exc)
        except Exception:
            report.failed += 1
            log.exception("sweeper job %s failed", name)
    return report


def _set_pair(report: SweepReport, pair: tuple[int, int]) -> None:
    report.expired, report.removed = pair


def _set_retention(report: SweepReport, result: "retention.RetentionReport") -> None:
    report.log_start_moved, report.records_deleted = result.log_start_moved, result.records_deleted
    report.failed += result.failed


def _set_share_locks(report: SweepReport, result: "share_locks.ExpiryReport") -> None:
    report.share_records_released, report.share_records_archived = result.released, result.archived
    report.failed += result.failed
    report.more_due = report.more_due or result.more_due


class SweeperThread(threading.Thread):
    """Runs ``sweep`` every transaction.abort.timed.out.transaction.cleanup.interval.ms (with jitter,
    so several workers do not all wake together), and again at once after a round that left items
    due (many transactions timing out together). ``totals`` adds up its rounds' reports."""

    def __init__(self, broker: Broker) -> None:
        super().__init__(name="txlog-sweeper", daemon=True)
        self.broker = broker
        self.totals = SweepReport()
        self.rounds = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        interval = self.broker.settings.transaction_abort_check_interval_ms / 1000
        self._stop_event.wait(random.uniform(0, min(interval, 1.0)))
        while not self._stop_event.is_set():
            report = None
            try:
                report = sweep(self.broker)
                self.totals.add(report)
            except Exception:  # keep sweeping whatever one round hit
                log.exception("sweep failed")
            self.rounds += 1
            if report is None or not report.more_due:
                self._stop_event.wait(interval * random.uniform(0.8, 1.0))

    def stop(self) -> None:
        self._stop_event.set()
