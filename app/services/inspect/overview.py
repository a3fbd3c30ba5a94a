"""The overview page: every topic, the transactions by state, the ones that look stuck, and the
record rate.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.domain.transactions import OPEN_STATE_NAMES, TxnState
from app.services import Broker
from app.services.inspect.rates import RatePoint, _record_rate
from app.services.inspect.topics import TopicSummary, _topics
from app.services.inspect.transactions import Alert, _alerts
from app.storage import log as log_store
from app.storage import transactions as transactions_store


@dataclass(frozen=True)
class Overview:
    now_ms: int
    topics: list[TopicSummary]
    state_counts: dict[str, int]
    alerts: list[Alert]
    rate: list[RatePoint]

    @property
    def open_transactions(self) -> int:
        return sum(self.state_counts.get(s, 0) for s in OPEN_STATE_NAMES)


def overview(broker: Broker) -> Overview:
    now = broker.now()
    with broker.db.read() as conn:
        statuses = log_store.partition_status_all(conn)
        counts = transactions_store.txn_state_counts(conn)
        alerts = _alerts(conn, now)
        rate = _record_rate(conn, now)
    return Overview(now, _topics(statuses), {s.value: counts.get(s.value, 0) for s in TxnState}, alerts, rate)
