"""The background sweeper: aborts timed-out transactions (fencing their producers), completes
prepared transactions left behind by a crash, expires idle transactional ids and producer state.

Safe with many workers on many hosts at once: each transaction is handled in its own database
transaction under ``FOR UPDATE SKIP LOCKED``, and every condition is re-checked under the lock.
"""

from __future__ import annotations

import logging
import random
import threading
from dataclasses import dataclass

from app.domain import transactions as txn
from app.domain.transactions import TxnState
from app.errors import TxlogError
from app.services import Broker, coordinator
from app.storage import queries as q

log = logging.getLogger("txlog.sweeper")


@dataclass
class SweepReport:
    timed_out: int = 0
    recovered: int = 0
    expired: int = 0
    removed: int = 0
    producer_states_expired: int = 0


def abort_timed_out(broker: Broker) -> int:
    with broker.db.read() as conn:
        candidates = q.txn_ids_timed_out(conn, broker.now())
    done = 0
    for tid in candidates:
        with broker.db.transaction() as conn:
            meta = q.txn_get(conn, tid, for_update=True, skip_locked=True)
            if meta is None or not txn.is_timed_out(meta, broker.now()):
                continue
            coordinator.finish_open(conn, broker, meta, "timed_out")
            done += 1
            log.info("aborted transaction %r at epoch %d: timed out after %d ms", tid, meta.producer_epoch, meta.timeout_ms)
    return done


def complete_prepared(broker: Broker) -> int:
    """A prepared transaction not locked by anyone is one whose EndTxn died between its steps."""
    with broker.db.read() as conn:
        candidates = q.txn_ids_prepared(conn)
    done = 0
    for tid in candidates:
        with broker.db.transaction() as conn:
            meta = q.txn_get(conn, tid, for_update=True, skip_locked=True)
            if meta is None or not meta.state.is_prepared:
                continue
            coordinator.complete(conn, broker, meta)
            done += 1
            log.info("completed prepared transaction %r (%s)", tid, meta.state.value)
    return done


def expire_transactional_ids(broker: Broker) -> tuple[int, int]:
    """Idle past transactional.id.expiration.ms: Dead; Dead for another interval: removed."""
    now = broker.now()
    expiration = broker.settings.transactional_id_expiration_ms
    ended = [s.value for s in TxnState if s.expiration_allowed]
    with broker.db.read() as conn:
        idle = q.txn_ids_idle(conn, ended, now - expiration)
        dead = q.txn_ids_idle(conn, [TxnState.DEAD.value], now - broker.settings.transaction_abort_check_interval_ms)
    expired = removed = 0
    for tid in idle:
        with broker.db.transaction() as conn:
            meta = q.txn_get(conn, tid, for_update=True, skip_locked=True)
            if meta is None or not meta.state.expiration_allowed or meta.updated_at_ms >= now - expiration:
                continue
            coordinator.record(conn, broker, meta, txn.expired(meta, broker.now()))
            expired += 1
    for tid in dead:
        with broker.db.transaction() as conn:
            meta = q.txn_get(conn, tid, for_update=True, skip_locked=True)
            if meta is None or meta.state is not TxnState.DEAD:
                continue
            q.txn_delete(conn, tid)
            removed += 1
    return expired, removed


def expire_producer_states(broker: Broker) -> int:
    with broker.db.transaction() as conn:
        return q.producer_states_expire(conn, broker.now() - broker.settings.producer_id_expiration_ms)


def sweep(broker: Broker) -> SweepReport:
    report = SweepReport()
    report.timed_out = abort_timed_out(broker)
    report.recovered = complete_prepared(broker)
    report.expired, report.removed = expire_transactional_ids(broker)
    report.producer_states_expired = expire_producer_states(broker)
    return report


class SweeperThread(threading.Thread):
    """Runs ``sweep`` every transaction.abort.timed.out.transaction.cleanup.interval.ms (with jitter,
    so several workers do not all wake together)."""

    def __init__(self, broker: Broker) -> None:
        super().__init__(name="txlog-sweeper", daemon=True)
        self.broker = broker
        self._stop_event = threading.Event()

    def run(self) -> None:
        interval = self.broker.settings.transaction_abort_check_interval_ms / 1000
        self._stop_event.wait(random.uniform(0, min(interval, 1.0)))
        while not self._stop_event.is_set():
            try:
                sweep(self.broker)
            except TxlogError as exc:
                log.warning("sweep failed: %s", exc)
            except Exception:  # keep sweeping whatever one round hit
                log.exception("sweep failed")
            self._stop_event.wait(interval * random.uniform(0.8, 1.0))

    def stop(self) -> None:
        self._stop_event.set()
