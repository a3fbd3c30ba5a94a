"""The transactions' pages: transactions that look stuck (``hanging_transactions``: timed out, left
prepared, or holding a partition's last stable offset back), the transactions page, one
transaction's detail with its epochs, and the open transactions on partitions as
kafka-transactions.sh find-hanging reads them (KIP-664).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from app.domain.log import PartitionStatus, unknown_partition
from app.domain.transactions import OPEN_STATE_NAMES, TxnEvent, TxnMetadata, TxnState
from app.errors import ErrorCode, TxlogError
from app.services import Broker
from app.storage import admin_reads
from app.storage import groups as groups_store
from app.storage import log as log_store
from app.storage import topics as topics_store
from app.storage import transactions as transactions_store

# An open transaction holding a partition's last stable offset back for longer than this is
# reported, whatever its own timeout: read_committed consumers of that partition are stalled.
LSO_HOLD_ALERT_MS = 60_000
# A prepared transaction normally completes within one request; one left longer is reported.
PREPARED_ALERT_MS = 60_000


# --- hanging transactions -------------------------------------------------------------------------

AlertReason = Literal["timed_out", "stuck_prepared", "holding_lso"]


@dataclass(frozen=True)
class HeldPartition:
    topic: str
    partition: int
    last_stable_offset: int
    high_watermark: int

    @property
    def waiting(self) -> int:
        """Records above the last stable offset that read_committed readers cannot see yet."""
        return self.high_watermark - self.last_stable_offset


@dataclass(frozen=True)
class Alert:
    """A transaction that looks stuck, and why. ``transactional_id`` is None when a partition is
    held by a producer id no transactional id currently maps to."""

    transactional_id: str | None
    producer_id: int
    producer_epoch: int
    state: str | None
    reasons: tuple[AlertReason, ...]
    since_ms: int  # when the transaction started (or was prepared)
    timeout_ms: int | None
    held: tuple[HeldPartition, ...] = ()

    @property
    def abortable(self) -> bool:
        return self.transactional_id is not None and self.state in OPEN_STATE_NAMES


def _alerts(conn, now_ms: int) -> list[Alert]:
    overdue = transactions_store.txns_overdue(conn, now_ms, now_ms - PREPARED_ALERT_MS)
    holders = admin_reads.lso_holders(conn)
    by_key: dict[object, dict] = {}
    for meta in overdue:
        reason: AlertReason = "timed_out" if meta.state is TxnState.ONGOING else "stuck_prepared"
        since = meta.started_at_ms if reason == "timed_out" and meta.started_at_ms is not None else meta.updated_at_ms
        by_key[meta.transactional_id] = dict(
            transactional_id=meta.transactional_id,
            producer_id=meta.producer_id,
            producer_epoch=meta.producer_epoch,
            state=meta.state.value,
            reasons=[reason],
            since_ms=since,
            timeout_ms=meta.timeout_ms,
            held=[],
        )
    for h in holders:
        since = h.started_at_ms if h.started_at_ms is not None else h.last_append_ms
        if now_ms - since <= LSO_HOLD_ALERT_MS:
            continue
        key = h.transactional_id if h.transactional_id is not None else ("pid", h.producer_id)
        entry = by_key.setdefault(
            key,
            dict(
                transactional_id=h.transactional_id,
                producer_id=h.producer_id,
                producer_epoch=h.producer_epoch,
                state=h.state,
                reasons=[],
                since_ms=since,
                timeout_ms=None,
                held=[],
            ),
        )
        if "holding_lso" not in entry["reasons"]:
            entry["reasons"].append("holding_lso")
        entry["held"].append(HeldPartition(h.topic, h.partition, h.last_stable_offset, h.high_watermark))
    alerts = [Alert(**{**e, "reasons": tuple(e["reasons"]), "held": tuple(e["held"])}) for e in by_key.values()]
    return sorted(alerts, key=lambda a: a.since_ms)


def hanging_transactions(broker: Broker) -> list[Alert]:
    with broker.db.read() as conn:
        return _alerts(conn, broker.now())


# --- transactions ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TxnPage:
    transactions: list[TxnMetadata]
    next_after: str | None  # the id to continue after, if there may be more


def transactions_page(
    broker: Broker,
    states: list[str] | None = None,
    older_than_ms: int | None = None,
    prefix: str | None = None,
    after: str | None = None,
    limit: int = 100,
) -> TxnPage:
    known = {s.value for s in TxnState}
    for s in states or ():
        if s not in known:
            raise TxlogError(ErrorCode.INVALID_REQUEST, f"Unknown state {s!r}; one of {', '.join(sorted(known))}")
    started_before = broker.now() - older_than_ms if older_than_ms is not None else None
    with broker.db.read() as conn:
        rows = admin_reads.txn_browse(conn, states, started_before, prefix, after, limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    return TxnPage(rows, rows[-1].transactional_id if more and rows else None)


@dataclass(frozen=True)
class EpochSpan:
    """A producer id and epoch the transactional id held, from the event that introduced it."""

    producer_id: int
    producer_epoch: int
    since_ms: int
    cause: str  # what introduced it, in words
    reason: str | None  # when the server ended the previous epoch's transaction: why (timed_out, ...)


def _epoch_cause(e: TxnEvent) -> str:
    if e.from_state is None:
        return "InitProducerId (new id)"
    if e.to_state is TxnState.EMPTY:
        return "InitProducerId (fences older)"
    if e.to_state is TxnState.COMPLETE_COMMIT:
        return "after a commit"
    if e.to_state is TxnState.COMPLETE_ABORT:
        return "after an abort"
    return f"{e.to_state.value}"


def epoch_history(events: list[TxnEvent]) -> list[EpochSpan]:
    """Where the producer id or epoch changed, oldest first (each transaction has its own epoch)."""
    spans: list[EpochSpan] = []
    previous: TxnEvent | None = None
    for e in events:
        if previous is None or (e.producer_id, e.producer_epoch) != (previous.producer_id, previous.producer_epoch):
            reason = e.reason if e.to_state in (TxnState.COMPLETE_ABORT, TxnState.COMPLETE_COMMIT) else None
            spans.append(EpochSpan(e.producer_id, e.producer_epoch, e.at_ms, _epoch_cause(e), reason))
        previous = e
    return spans


@dataclass(frozen=True)
class TxnPartition:
    status: PartitionStatus | None  # None when the topic is gone
    topic: str
    partition: int
    first_offset: int | None  # the open transaction's first offset on it
    holds_lso: bool


@dataclass(frozen=True)
class TxnDetail:
    now_ms: int
    meta: TxnMetadata
    events: list[TxnEvent]  # the most recent ones, oldest first
    total_events: int
    partitions: list[TxnPartition]
    pending_offsets: list[dict]
    epochs: list[EpochSpan]
    alert: Alert | None

    @property
    def deadline_ms(self) -> int | None:
        if self.meta.state is not TxnState.ONGOING or self.meta.started_at_ms is None:
            return None
        return self.meta.started_at_ms + self.meta.timeout_ms


def transaction_detail(broker: Broker, transactional_id: str, events_limit: int = 200) -> TxnDetail:
    now = broker.now()
    with broker.db.read() as conn:
        meta = transactions_store.txn_get(conn, transactional_id)
        if meta is None:
            raise TxlogError(ErrorCode.TRANSACTIONAL_ID_NOT_FOUND, f"Transactional id {transactional_id!r} not found")
        events = transactions_store.txn_events(conn, transactional_id, events_limit)
        pending = groups_store.pending_offsets_of_txn(conn, transactional_id)
        states = (
            {(s["topic"], s["partition"]): s for s in admin_reads.producer_states_by_id(conn, meta.producer_id)}
            if meta.partitions
            else {}
        )
        statuses: dict[tuple[str, int], PartitionStatus | None] = {}  # None: the partition is gone
        for topic, partition in meta.partitions:
            try:
                statuses[(topic, partition)] = log_store.partition_status(conn, topic, partition)
            except TxlogError:
                statuses[(topic, partition)] = None
        alerts = [a for a in _alerts(conn, now) if a.transactional_id == transactional_id]
    parts = []
    for tp in meta.partitions:
        entry = states.get(tp)
        first = (
            entry["txn_first_offset"] if entry and meta.state.is_open and entry["producer_epoch"] == meta.producer_epoch else None
        )
        status = statuses[tp]
        parts.append(
            TxnPartition(
                status, tp[0], tp[1], first, first is not None and status is not None and status.last_stable_offset == first
            )
        )
    return TxnDetail(now, meta, events, meta.version, parts, pending, epoch_history(events), alerts[0] if alerts else None)


# --- open transactions on partitions, as kafka-transactions.sh find-hanging reads them (KIP-664) ---

# Why an open transaction on a partition is hanging: the transaction coordinator does not know its
# producer id, knows it but no longer as this open transaction (another epoch, or ended), or has it
# open without this partition — then nothing will ever write its marker there; or it has been open
# longer than the maximum transaction timeout, past which the coordinator should have aborted it.
HangingReason = Literal["unknown_to_coordinator", "not_ongoing_at_coordinator", "partition_not_in_transaction", "open_too_long"]


@dataclass(frozen=True)
class OpenTransaction:
    """A producer's open transaction on one partition as the partition's producer state has it
    (Kafka's DescribeProducers: ``start_offset`` is its currentTxnStartOffset), beside what the
    transaction coordinator says of it."""

    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    start_offset: int
    last_timestamp_ms: int
    transactional_id: str | None
    coordinator_state: str | None  # the transactional id's current state
    started_at_ms: int | None  # when the coordinator started it, when the coordinator has it open
    duration_ms: int
    hanging: tuple[HangingReason, ...]

    @property
    def ongoing_at_coordinator(self) -> bool:
        """The coordinator has this transaction open with this partition: ending it there ends it
        everywhere, markers included."""
        return all(r == "open_too_long" for r in self.hanging)


def coordinator_reason(
    topic: str, partition: int, producer_id: int, producer_epoch: int, meta: TxnMetadata | None
) -> HangingReason | None:
    """Why the transaction coordinator will never end this open transaction on this partition
    (``meta``: the state of the transactional id its producer id belongs to), or ``None`` when it
    has it open with this partition and will."""
    if meta is None:
        return "unknown_to_coordinator"
    if (meta.producer_id, meta.producer_epoch) != (producer_id, producer_epoch) or not meta.state.is_open:
        return "not_ongoing_at_coordinator"
    if (topic, partition) not in meta.partitions:
        return "partition_not_in_transaction"
    return None


def open_transactions(
    broker: Broker, topic: str | None = None, partition: int | None = None, max_transaction_timeout_ms: int | None = None
) -> list[OpenTransaction]:
    """Every open transaction on the partitions asked for (all, a topic's, or one partition's), each
    with the reasons it is hanging, if any, judged against ``max_transaction_timeout_ms`` (default:
    the server's maximum transaction timeout). One snapshot: the producer states' partial index of
    open transactions, then one lookup per transactional id."""
    if partition is not None and topic is None:
        raise TxlogError(ErrorCode.INVALID_REQUEST, "A partition needs its topic")
    max_timeout = broker.settings.max_transaction_timeout_ms if max_transaction_timeout_ms is None else max_transaction_timeout_ms
    if max_timeout < 0:
        raise TxlogError(ErrorCode.INVALID_REQUEST, "max_transaction_timeout_ms must not be negative")
    now = broker.now()
    with broker.db.read() as conn:
        if topic is not None:
            count = topics_store.topic_partitions(conn, topic)
            if count is None:
                raise TxlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"Topic {topic!r} does not exist")
            if partition is not None and not 0 <= partition < count:
                raise unknown_partition(topic, partition)
        rows: list[dict] = []
        after = (topic, partition, -1) if topic is not None and partition is not None else None
        while True:
            page = admin_reads.producer_states_page(conn, after, 1000, topic, open_only=True)
            rows.extend(r for r in page if partition is None or r["partition"] == partition)
            if len(page) < 1000 or (partition is not None and page[-1]["partition"] != partition):
                break
            after = (page[-1]["topic"], page[-1]["partition"], page[-1]["producer_id"])
        metas = {tid: transactions_store.txn_get(conn, tid) for tid in {r["transactional_id"] for r in rows} if tid is not None}
    found = []
    for r in rows:
        meta = metas.get(r["transactional_id"]) if r["transactional_id"] is not None else None
        stale = coordinator_reason(r["topic"], r["partition"], r["producer_id"], r["producer_epoch"], meta)
        # Open since the coordinator started it, when it has it; else at least since its last append.
        started = meta.started_at_ms if stale is None and meta is not None else None
        duration = max(now - (started if started is not None else r["last_timestamp_ms"]), 0)
        reasons: tuple[HangingReason, ...] = (stale,) if stale is not None else ()
        if duration > max_timeout:
            reasons += ("open_too_long",)
        found.append(
            OpenTransaction(
                topic=r["topic"],
                partition=r["partition"],
                producer_id=r["producer_id"],
                producer_epoch=r["producer_epoch"],
                start_offset=r["txn_first_offset"],
                last_timestamp_ms=r["last_timestamp_ms"],
                transactional_id=r["transactional_id"],
                coordinator_state=meta.state.value if meta is not None else None,
                started_at_ms=started,
                duration_ms=duration,
                hanging=reasons,
            )
        )
    return found


def find_hanging(
    broker: Broker, topic: str | None = None, partition: int | None = None, max_transaction_timeout_ms: int | None = None
) -> list[OpenTransaction]:
    """kafka-transactions.sh find-hanging: the open transactions on those partitions that are hanging."""
    return [o for o in open_transactions(broker, topic, partition, max_transaction_timeout_ms) if o.hanging]
