"""The read side an operator needs: partitions and their offsets, the log with what became of each
record, producer state, transactions and their histories, consumer groups, and what looks stuck.

Read-only: every function reads one snapshot (``broker.db.read()``) through the storage modules
(``app.storage.admin_reads`` and those of each entity) and shapes it into plain values for the admin
pages. Time comes from ``broker.now()``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from app.domain.log import LogRecord, LsoHolder, PartitionStatus, unknown_partition
from app.domain.producer_state import BatchMetadata
from app.domain.transactions import OPEN_STATE_NAMES, TxnEvent, TxnMetadata, TxnState
from app.errors import ErrorCode, TxlogError
from app.services import Broker
from app.storage import admin_reads
from app.storage import groups as groups_store
from app.storage import log as log_store
from app.storage import topics as topics_store
from app.storage import transactions as transactions_store

RATE_BUCKET_MS = 60_000
RATE_BUCKETS = 15
# An open transaction holding a partition's last stable offset back for longer than this is
# reported, whatever its own timeout: read_committed consumers of that partition are stalled.
LSO_HOLD_ALERT_MS = 60_000
# A prepared transaction normally completes within one request; one left longer is reported.
PREPARED_ALERT_MS = 60_000

BrowseMode = Literal["read_uncommitted", "read_committed", "all"]
BROWSE_MODES: tuple[BrowseMode, ...] = ("read_uncommitted", "read_committed", "all")


# --- record rate ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class RatePoint:
    """Records appended (data and control) in [start_ms, end_ms)."""

    start_ms: int
    end_ms: int
    records: int

    @property
    def per_second(self) -> float:
        return self.records * 1000 / max(self.end_ms - self.start_ms, 1)


def bucket_bounds(now_ms: int, buckets: int = RATE_BUCKETS, width_ms: int = RATE_BUCKET_MS) -> list[int]:
    """Bucket boundaries aligned to whole minutes, the last bucket ending now (partial)."""
    current = now_ms - now_ms % width_ms
    return [current - (buckets - 1 - i) * width_ms for i in range(buckets)] + [now_ms]


def _record_rate(conn, now_ms: int, topic: str | None = None, partition: int | None = None) -> list[RatePoint]:
    bounds = bucket_bounds(now_ms)
    # The last bucket includes records stamped exactly now.
    offsets = log_store.partition_offsets_at(conn, bounds[:-1] + [now_ms + 1], topic, partition)
    counts = [0] * (len(bounds) - 1)
    for found in offsets.values():
        for i in range(len(counts)):
            counts[i] += max(found[i + 1] - found[i], 0)
    return [RatePoint(bounds[i], bounds[i + 1], counts[i]) for i in range(len(counts))]


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
            transactional_id=meta.transactional_id, producer_id=meta.producer_id, producer_epoch=meta.producer_epoch,
            state=meta.state.value, reasons=[reason], since_ms=since, timeout_ms=meta.timeout_ms, held=[],
        )
    for h in holders:
        since = h.started_at_ms if h.started_at_ms is not None else h.last_append_ms
        if now_ms - since <= LSO_HOLD_ALERT_MS:
            continue
        key = h.transactional_id if h.transactional_id is not None else ("pid", h.producer_id)
        entry = by_key.setdefault(
            key,
            dict(
                transactional_id=h.transactional_id, producer_id=h.producer_id, producer_epoch=h.producer_epoch,
                state=h.state, reasons=[], since_ms=since, timeout_ms=None, held=[],
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


# --- overview and topics --------------------------------------------------------------------------

@dataclass(frozen=True)
class TopicSummary:
    name: str
    partitions: list[PartitionStatus]

    @property
    def records(self) -> int:
        return sum(p.high_watermark - p.log_start_offset for p in self.partitions)

    @property
    def unstable(self) -> int:
        """Records between the last stable offset and the high watermark, over all partitions."""
        return sum(p.high_watermark - p.last_stable_offset for p in self.partitions)

    @property
    def open_transactions(self) -> int:
        return sum(p.open_transactions for p in self.partitions)

    @property
    def max_high_watermark(self) -> int:
        return max((p.high_watermark for p in self.partitions), default=0)


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


def _topics(statuses: list[PartitionStatus]) -> list[TopicSummary]:
    by_topic: dict[str, list[PartitionStatus]] = {}
    for s in statuses:
        by_topic.setdefault(s.topic, []).append(s)
    return [TopicSummary(name, parts) for name, parts in by_topic.items()]


def overview(broker: Broker) -> Overview:
    now = broker.now()
    with broker.db.read() as conn:
        statuses = log_store.partition_status_all(conn)
        counts = transactions_store.txn_state_counts(conn)
        alerts = _alerts(conn, now)
        rate = _record_rate(conn, now)
    return Overview(now, _topics(statuses), {s.value: counts.get(s.value, 0) for s in TxnState}, alerts, rate)


@dataclass(frozen=True)
class TopicDetail:
    now_ms: int
    topic: TopicSummary
    rate: list[RatePoint]
    holders: dict[int, LsoHolder]  # by partition


def topic_detail(broker: Broker, topic: str) -> TopicDetail:
    now = broker.now()
    with broker.db.read() as conn:
        statuses = log_store.partition_status_all(conn, topic)
        if not statuses:
            raise TxlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"Topic {topic!r} does not exist")
        rate = _record_rate(conn, now, topic)
        holders = {h.partition: h for h in admin_reads.lso_holders(conn) if h.topic == topic}
    return TopicDetail(now, TopicSummary(topic, statuses), rate, holders)


# --- the log --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RecordPage:
    status: PartitionStatus
    mode: BrowseMode
    records: list[LogRecord]
    upper: int  # the mode's end of the log: the last stable offset for read_committed, else the high watermark
    older: int | None  # ask with before=older for the previous page
    newer: int | None  # ask with offset=newer for the next page
    rate: list[RatePoint] = field(default_factory=list)


def browse_partition(
    broker: Broker,
    topic: str,
    partition: int,
    mode: BrowseMode = "all",
    offset: int | None = None,
    before: int | None = None,
    limit: int = 50,
) -> RecordPage:
    """A page of a partition's log as a reader at ``mode`` sees it (``all``: control records and
    aborted records too, each flagged). From ``offset`` forwards, or the page ending just before
    ``before``, or else the tail of the log. Offsets out of range are clamped."""
    if mode not in BROWSE_MODES:
        raise TxlogError(ErrorCode.INVALID_REQUEST, f"Unknown mode {mode!r}; one of {', '.join(BROWSE_MODES)}")
    if not 1 <= limit <= 1000:
        raise TxlogError(ErrorCode.INVALID_REQUEST, "limit must be between 1 and 1000")
    now = broker.now()
    with broker.db.read() as conn:
        status = log_store.partition_status(conn, topic, partition)
        upper = status.last_stable_offset if mode == "read_committed" else status.high_watermark
        common = dict(include_control=mode == "all", include_aborted=mode != "read_committed")
        if offset is not None:
            start = min(max(offset, status.log_start_offset), upper)
            records = admin_reads.records_page(conn, topic, partition, start, upper, limit, **common)
        else:
            end = upper if before is None else min(max(before, status.log_start_offset), upper)
            records = admin_reads.records_page(conn, topic, partition, status.log_start_offset, end, limit, backwards=True, **common)
        rate = _record_rate(conn, now, topic, partition)
    first = records[0].offset if records else None
    last = records[-1].offset if records else None
    older = first if first is not None and first > status.log_start_offset else None
    newer = last + 1 if last is not None and last + 1 < upper else None
    if not records and offset is not None and offset > status.log_start_offset:
        older = min(offset, upper)
    return RecordPage(status, mode, records, upper, older, newer, rate)


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
        states = {(s["topic"], s["partition"]): s for s in admin_reads.producer_states_by_id(conn, meta.producer_id)} if meta.partitions else {}
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
        first = entry["txn_first_offset"] if entry and meta.state.is_open and entry["producer_epoch"] == meta.producer_epoch else None
        status = statuses[tp]
        parts.append(TxnPartition(status, tp[0], tp[1], first, first is not None and status is not None and status.last_stable_offset == first))
    return TxnDetail(now, meta, events, meta.version, parts, pending, epoch_history(events), alerts[0] if alerts else None)


# --- producers ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ProducerEntry:
    """Kafka's ProducerStateEntry of one producer id on one partition, as stored."""

    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    transactional_id: str | None
    last_sequence: int | None
    last_offset: int | None
    batches: int
    last_timestamp_ms: int
    txn_first_offset: int | None
    expires_at_ms: int | None  # None while a transaction is open: open state never expires


@dataclass(frozen=True)
class ProducerPage:
    entries: list[ProducerEntry]
    next_after: tuple[str, int, int] | None


def _producer_entry(row: dict, expiration_ms: int) -> ProducerEntry:
    batches = [BatchMetadata.from_json(b) for b in row["batches"]]
    last = batches[-1] if batches else None
    return ProducerEntry(
        topic=row["topic"],
        partition=row["partition"],
        producer_id=row["producer_id"],
        producer_epoch=row["producer_epoch"],
        transactional_id=row["transactional_id"],
        last_sequence=last.last_seq if last else None,
        last_offset=last.last_offset if last else None,
        batches=len(batches),
        last_timestamp_ms=row["last_timestamp_ms"],
        txn_first_offset=row["txn_first_offset"],
        expires_at_ms=row["last_timestamp_ms"] + expiration_ms if row["txn_first_offset"] is None else None,
    )


def producers_page(
    broker: Broker,
    after: tuple[str, int, int] | None = None,
    limit: int = 100,
    topic: str | None = None,
    open_only: bool = False,
    producer_id: int | None = None,
) -> ProducerPage:
    expiration = broker.settings.producer_id_expiration_ms
    with broker.db.read() as conn:
        if producer_id is not None:
            rows = [r for r in admin_reads.producer_states_by_id(conn, producer_id)
                    if (topic is None or r["topic"] == topic) and (not open_only or r["txn_first_offset"] is not None)]
            return ProducerPage([_producer_entry(r, expiration) for r in rows], None)
        rows = admin_reads.producer_states_page(conn, after, limit + 1, topic, open_only)
    more = len(rows) > limit
    entries = [_producer_entry(r, expiration) for r in rows[:limit]]
    last = entries[-1] if more and entries else None
    return ProducerPage(entries, (last.topic, last.partition, last.producer_id) if last else None)


# --- consumer groups ------------------------------------------------------------------------------

@dataclass(frozen=True)
class GroupSummary:
    group_id: str
    partitions: int
    lag: int
    last_commit_ms: int | None
    pending_offsets: int
    pending_transactions: int


def groups(broker: Broker, limit: int = 1000) -> list[GroupSummary]:
    with broker.db.read() as conn:
        return [GroupSummary(**r) for r in admin_reads.group_summaries(conn, limit)]


@dataclass(frozen=True)
class GroupPartition:
    topic: str
    partition: int
    offset: int
    metadata: str
    committed_at_ms: int
    log_start_offset: int | None
    last_stable_offset: int | None
    high_watermark: int | None

    @property
    def lag(self) -> int | None:
        """What a read_committed consumer of the group still has to read."""
        if self.last_stable_offset is None:
            return None
        return max(self.last_stable_offset - self.offset, 0)


@dataclass(frozen=True)
class GroupDetail:
    group_id: str
    offsets: list[GroupPartition]
    pending: list[dict]

    @property
    def lag(self) -> int:
        return sum(p.lag or 0 for p in self.offsets)


def group_detail(broker: Broker, group_id: str) -> GroupDetail:
    """A group's committed and pending offsets; an unknown group simply has none (as Kafka's
    OffsetFetch answers)."""
    with broker.db.read() as conn:
        offsets = [GroupPartition(**r) for r in admin_reads.group_offsets_with_status(conn, group_id)]
        pending = groups_store.pending_offsets_of_group(conn, group_id)
    return GroupDetail(group_id, offsets, pending)


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
                topic=r["topic"], partition=r["partition"], producer_id=r["producer_id"], producer_epoch=r["producer_epoch"],
                start_offset=r["txn_first_offset"], last_timestamp_ms=r["last_timestamp_ms"], transactional_id=r["transactional_id"],
                coordinator_state=meta.state.value if meta is not None else None, started_at_ms=started, duration_ms=duration,
                hanging=reasons,
            )
        )
    return found


def find_hanging(
    broker: Broker, topic: str | None = None, partition: int | None = None, max_transaction_timeout_ms: int | None = None
) -> list[OpenTransaction]:
    """kafka-transactions.sh find-hanging: the open transactions on those partitions that are hanging."""
    return [o for o in open_transactions(broker, topic, partition, max_transaction_timeout_ms) if o.hanging]
