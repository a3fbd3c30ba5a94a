"""Client quota budgets shared through the database: what one process records, another counts after
their flushes; the usage table keeps only the windows still counted; a quota change reaches a
process at its next poll."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from app.domain.quotas import PRODUCER_BYTE_RATE, QuotaWindow
from app.services import Broker
from app.services.quotas import QuotaAlteration, QuotaManager, QuotaOp, alter_quotas


def _rows(broker: Broker) -> list[tuple]:
    with broker.db.read() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                text(
                    "SELECT user_tag, client_tag, quota_key, window_index, amount FROM txlog.client_quota_usage ORDER BY window_index"
                )
            ).all()
        ]


def test_two_processes_spend_one_budget_and_old_windows_go(broker: Broker) -> None:
    now = [1_000_000.25]
    window = QuotaWindow(3, 1)
    a = QuotaManager(broker.db, window, clock=lambda: now[0])
    b = QuotaManager(broker.db, window, clock=lambda: now[0])
    a.refresh()
    b.refresh()
    assert not a.enabled and a.record(None, "app", PRODUCER_BYTE_RATE, 10**9) == 0  # no quota: nothing recorded
    a.flush()
    assert _rows(broker) == []

    assert alter_quotas(broker.db, [QuotaAlteration([("client-id", "app")], [QuotaOp(PRODUCER_BYTE_RATE, 1000)])]) == [None]
    assert a.refresh() and b.refresh() and a.enabled
    # 1500 bytes over the 2.25 s measured: within 1000/s for each process alone
    assert a.record(None, "app", PRODUCER_BYTE_RATE, 1500) == 0
    assert b.record("someone", "app", PRODUCER_BYTE_RATE, 1500) == 0  # a client-id quota: every user's
    a.flush()
    b.flush()
    assert _rows(broker) == [("", "app", PRODUCER_BYTE_RATE, 1_000_000, 3000.0)]
    # b has read a's: 3000 over 2.25 s is 1333/s, (1333 - 1000) / 1000 × 2250 ms
    assert b.throttle_ms(None, "app", PRODUCER_BYTE_RATE) == 750
    # a learns b's at its next flush
    assert a.throttle_ms(None, "app", PRODUCER_BYTE_RATE) == 0
    a.flush()
    assert a.throttle_ms(None, "app", PRODUCER_BYTE_RATE) == 750

    # three windows later the first is no longer counted, and its row goes at the next flush
    now[0] += 3
    assert a.record(None, "app", PRODUCER_BYTE_RATE, 10) == 0
    a.flush()
    assert _rows(broker) == [("", "app", PRODUCER_BYTE_RATE, 1_000_003, 10.0)]
    # a process that records nothing for the whole span stops watching the budget
    now[0] += 10
    a.flush()
    b.flush()
    assert _rows(broker) == [] and a._watched == {} and b._watched == {}


def test_a_process_that_cannot_flush_keeps_its_counts(broker: Broker) -> None:
    now = [2_000_000.5]
    alter_quotas(broker.db, [QuotaAlteration([("user", None)], [QuotaOp(PRODUCER_BYTE_RATE, 1000)])])
    m = QuotaManager(broker.db, QuotaWindow(3, 1), clock=lambda: now[0])
    m.refresh()
    m.record("alice", "x", PRODUCER_BYTE_RATE, 100)
    good = m.db
    m.db = None  # type: ignore[assignment]  # any failure of the flush's statement
    with pytest.raises(AttributeError):
        m.flush()
    m.db = good
    assert m._pending  # counted again at the next flush
    m.flush()
    assert _rows(broker) == [("alice", "", PRODUCER_BYTE_RATE, 2_000_000, 100.0)]
