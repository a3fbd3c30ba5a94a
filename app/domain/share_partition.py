"""A share partition's delivery state, as Kafka's share groups keep it (KIP-932): which records of
one topic partition a share group has delivered, to whom, how often, and what became of them.

Plain rules over plain data, no I/O, no clock: time comes in as ``now_ms`` (epoch ms). Every
operation takes a ``SharePartitionState`` and answers a new one inside a named outcome (or a
``Refused`` carrying Kafka's error), so storage can persist the outcome under a row lock and every
process serving the partition takes the same decisions.

The state is Kafka's: the share-partition start offset (SPSO) — every record below it is done — and
the in-flight records from there to the end offset, each ``Available``, ``Acquired`` (by a member,
until a lock deadline, its delivery count raised by each acquisition), ``Acknowledged`` or
``Archived``. The SPSO moves past every leading Acknowledged/Archived record at once, and the
in-flight window is bounded (``group.share.partition.max.record.locks``). Here ``end_offset`` is
exclusive: one past the last offset ever taken in flight (Kafka's SPEO + 1), so an empty window is
``start_offset == end_offset``.

In-flight records are kept as ranges, as Kafka keeps batches: one ``InFlightRange`` per run of
offsets that share state, member, lock deadline and delivery count, split only where an operation
touches part of a range and merged again when neighbours agree. Records acquired and accepted
together stay one range (one row), however many they are; the number of ranges is bounded by the
window, never by the log.

Nothing here is Kafka-only: RocketMQ's simple consumer (ReceiveMessage with an invisible duration,
AckMessage, ChangeInvisibleDuration) is ``acquire`` with ``lock_duration_ms``, ``ACCEPT``, and
``RENEW`` with ``lock_duration_ms``; its maximum reconsume times is the delivery count limit, and
the ``Archived`` outcomes (with their reason) are what it moves to a dead-letter topic.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from decimal import Decimal
from enum import Enum, IntEnum
from typing import Callable, Iterable, Literal, Sequence

from app.errors import ErrorCode, TxlogError


class RecordState(Enum):
    """An in-flight record's state; the values are Kafka's ids (as Kafka persists them)."""

    AVAILABLE = 0  # may be acquired (again)
    ACQUIRED = 1  # delivered to one member, locked until its deadline
    ACKNOWLEDGED = 2  # accepted: done
    ARCHIVED = 4  # rejected, a gap, not deliverable, or out of deliveries: done, never delivered again

    @property
    def is_final(self) -> bool:
        return self in FINAL_STATES


FINAL_STATES = frozenset({RecordState.ACKNOWLEDGED, RecordState.ARCHIVED})

# The one table of moves (Kafka's RecordState.validateTransition): final states are final, an
# Available record can only be acquired, an Acquired one can go anywhere else (and stays Acquired
# when its lock is renewed).
VALID_PREVIOUS: dict[RecordState, frozenset[RecordState]] = {
    RecordState.AVAILABLE: frozenset({RecordState.ACQUIRED}),
    RecordState.ACQUIRED: frozenset({RecordState.AVAILABLE, RecordState.ACQUIRED}),
    RecordState.ACKNOWLEDGED: frozenset({RecordState.ACQUIRED}),
    RecordState.ARCHIVED: frozenset({RecordState.AVAILABLE, RecordState.ACQUIRED}),
}


def check_transition(current: RecordState, to: RecordState) -> None:
    """The one guard of the state machine (a broken move is a bug here, not a client's error)."""
    if current not in VALID_PREVIOUS[to]:
        raise ValueError(f"an in-flight record cannot go from {current.name} to {to.name}")


class AcknowledgeType(IntEnum):
    """ShareAcknowledge's and ShareFetch's acknowledgement types (KIP-932; RENEW is KIP-1222's)."""

    GAP = 0  # no record at this offset (compacted away, a control record): archived
    ACCEPT = 1  # processed: acknowledged
    RELEASE = 2  # give it back: available again (archived if it used its last delivery)
    REJECT = 3  # unprocessable: archived
    RENEW = 4  # still working on it: the lock is extended, nothing else changes


class ArchiveReason(Enum):
    """Why records were archived: said in the outcomes (the state keeps only ``Archived``), for the
    log, a dead-letter topic, and whoever checks that nothing was lost."""

    REJECTED = "rejected"  # the member rejected them
    GAP = "gap"  # the member said there is no record there
    DELIVERY_COUNT_LIMIT = "delivery_count_limit"  # released or expired on their last delivery
    NOT_DELIVERABLE = "not_deliverable"  # aborted transactions' records and control records (read_committed)


# Kafka's defaults: share.record.lock.duration.ms, share.delivery.count.limit (group configs, their
# broker defaults group.share.*), group.share.partition.max.record.locks.
DEFAULT_RECORD_LOCK_DURATION_MS = 30_000
DEFAULT_DELIVERY_COUNT_LIMIT = 5
DEFAULT_MAX_RECORD_LOCKS = 2_000


@dataclass(frozen=True)
class DeliveryConfig:
    """What a share group's configs decide for its partitions' delivery."""

    record_lock_duration_ms: int = DEFAULT_RECORD_LOCK_DURATION_MS
    delivery_count_limit: int = DEFAULT_DELIVERY_COUNT_LIMIT
    max_record_locks: int = DEFAULT_MAX_RECORD_LOCKS

    def __post_init__(self) -> None:
        if self.record_lock_duration_ms < 1 or self.delivery_count_limit < 1 or self.max_record_locks < 1:
            raise ValueError(f"delivery settings must be at least 1: {self}")


@dataclass(frozen=True)
class InFlightRange:
    """Offsets ``first_offset``..``last_offset`` (inclusive) in one state: one stored row. Only an
    Acquired range has a member and a lock deadline; the delivery count is kept through every state
    (a released record keeps its count, so its next acquisition is one more)."""

    first_offset: int
    last_offset: int
    state: RecordState
    delivery_count: int
    member_id: str | None = None
    lock_deadline_ms: int | None = None

    @property
    def count(self) -> int:
        return self.last_offset - self.first_offset + 1

    def lock_expired(self, now_ms: int) -> bool:
        return self.state is RecordState.ACQUIRED and self.lock_deadline_ms is not None and now_ms >= self.lock_deadline_ms

    def _same_as(self, other: InFlightRange) -> bool:
        return (self.state, self.delivery_count, self.member_id, self.lock_deadline_ms) == (
            other.state,
            other.delivery_count,
            other.member_id,
            other.lock_deadline_ms,
        )

    def _part(self, first: int, last: int) -> InFlightRange:
        return replace(self, first_offset=first, last_offset=last)

    def _to(
        self,
        state: RecordState,
        *,
        delivery_count: int | None = None,
        member_id: str | None = None,
        lock_deadline_ms: int | None = None,
    ) -> InFlightRange:
        check_transition(self.state, state)
        return InFlightRange(
            self.first_offset,
            self.last_offset,
            state,
            self.delivery_count if delivery_count is None else delivery_count,
            member_id,
            lock_deadline_ms,
        )


@dataclass(frozen=True)
class SharePartitionState:
    """One share group's state on one topic partition. ``in_flight`` covers exactly
    [``start_offset``, ``end_offset``), in order, without overlaps; it never starts with a final
    range (the SPSO has moved past those) and no two neighbours agree (they are merged)."""

    start_offset: int
    end_offset: int
    in_flight: tuple[InFlightRange, ...] = ()

    def check(self) -> None:
        """Raise ``ValueError`` if the state breaks its own rules (rows read back from storage)."""
        if self.start_offset < 0 or self.end_offset < self.start_offset:
            raise ValueError(f"bad window [{self.start_offset}, {self.end_offset})")
        expected = self.start_offset
        previous: InFlightRange | None = None
        for r in self.in_flight:
            if r.first_offset != expected or r.last_offset < r.first_offset:
                raise ValueError(f"in-flight ranges do not cover the window at offset {expected}: {r}")
            if (r.state is RecordState.ACQUIRED) != (r.member_id is not None and r.lock_deadline_ms is not None):
                raise ValueError(f"only an acquired range has a member and a lock deadline: {r}")
            if r.delivery_count < 0 or (r.state is RecordState.ACQUIRED and r.delivery_count < 1):
                raise ValueError(f"bad delivery count: {r}")
            if previous is None and r.state.is_final:
                raise ValueError(f"the start offset should have moved past {r}")
            if previous is not None and previous._same_as(r):
                raise ValueError(f"neighbours {previous} and {r} should be one range")
            expected = r.last_offset + 1
            previous = r
        if expected != self.end_offset:
            raise ValueError(f"in-flight ranges end at {expected}, not at the end offset {self.end_offset}")

    @classmethod
    def from_rows(cls, start_offset: int, end_offset: int, rows: Iterable[InFlightRange]) -> SharePartitionState:
        """A state from stored rows (any order), checked."""
        state = cls(start_offset, end_offset, tuple(sorted(rows, key=lambda r: r.first_offset)))
        state.check()
        return state

    def record(self, offset: int) -> InFlightRange | None:
        """The range holding ``offset`` (None below the start offset or from the end offset on)."""
        for r in self.in_flight:
            if r.first_offset <= offset <= r.last_offset:
                return r
        return None

    @property
    def in_flight_count(self) -> int:
        return self.end_offset - self.start_offset


# --- what operations answer -----------------------------------------------------------------------


@dataclass(frozen=True)
class OffsetRange:
    first_offset: int
    last_offset: int


@dataclass(frozen=True)
class AcquiredRecords:
    """Kafka's AcquiredRecords: a run of offsets acquired now, all at the same delivery count."""

    first_offset: int
    last_offset: int
    delivery_count: int


@dataclass(frozen=True)
class ArchivedRecords:
    """Offsets archived by this operation, and why."""

    first_offset: int
    last_offset: int
    delivery_count: int
    reason: ArchiveReason


@dataclass(frozen=True)
class Acquisition:
    """What ``acquire`` did. ``released``/``archived`` also list the expired locks it found."""

    state: SharePartitionState
    acquired: tuple[AcquiredRecords, ...]
    released: tuple[OffsetRange, ...] = ()
    archived: tuple[ArchivedRecords, ...] = ()

    @property
    def acquired_count(self) -> int:
        return sum(a.last_offset - a.first_offset + 1 for a in self.acquired)


@dataclass(frozen=True)
class Acknowledgement:
    """What ``acknowledge`` did (every batch of the request took effect)."""

    state: SharePartitionState
    accepted: tuple[OffsetRange, ...] = ()
    released: tuple[OffsetRange, ...] = ()
    archived: tuple[ArchivedRecords, ...] = ()
    renewed: tuple[OffsetRange, ...] = ()


@dataclass(frozen=True)
class Release:
    """What ``expire`` or ``release_member`` did: records made available again, or archived on
    their last delivery."""

    state: SharePartitionState
    released: tuple[OffsetRange, ...] = ()
    archived: tuple[ArchivedRecords, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.released or self.archived)


@dataclass(frozen=True)
class Refused:
    """The request is refused as Kafka refuses it; nothing changed (an acknowledgement of a share
    partition takes effect whole or not at all, as Kafka's rolls back)."""

    code: ErrorCode
    message: str

    def error(self) -> TxlogError:
        return TxlogError(self.code, self.message)


@dataclass(frozen=True)
class AcknowledgementBatch:
    """ShareAcknowledge's AcknowledgementBatch: one type for the whole range, or one per offset."""

    first_offset: int
    last_offset: int
    acknowledge_types: tuple[int, ...]


# --- the ranges -----------------------------------------------------------------------------------


def _normalised(start_offset: int, end_offset: int, ranges: Iterable[InFlightRange]) -> SharePartitionState:
    """Merge neighbours that agree, move the start offset past the leading final ranges."""
    merged = _merged(ranges)
    skip = 0
    while skip < len(merged) and merged[skip].state.is_final:
        skip += 1
    kept = tuple(merged[skip:])
    start = kept[0].first_offset if kept else max(start_offset, end_offset)
    return SharePartitionState(start, end_offset, kept)


def _merged(ranges: Iterable[InFlightRange]) -> list[InFlightRange]:
    """Neighbours that agree joined (the start offset left where it is)."""
    merged: list[InFlightRange] = []
    for r in ranges:
        if merged and merged[-1]._same_as(r) and merged[-1].last_offset + 1 == r.first_offset:
            merged[-1] = merged[-1]._part(merged[-1].first_offset, r.last_offset)
        else:
            merged.append(r)
    return merged


def _map_span(
    ranges: Sequence[InFlightRange], first: int, last: int, change: Callable[[InFlightRange], InFlightRange]
) -> list[InFlightRange]:
    """``ranges`` with ``change`` applied to the parts of them within [first, last] (split there)."""
    out: list[InFlightRange] = []
    for r in ranges:
        if r.last_offset < first or r.first_offset > last:
            out.append(r)
            continue
        a, b = max(r.first_offset, first), min(r.last_offset, last)
        if r.first_offset < a:
            out.append(r._part(r.first_offset, a - 1))
        out.append(change(r._part(a, b)))
        if b < r.last_offset:
            out.append(r._part(b + 1, r.last_offset))
    return out


class _Outcomes:
    """Collects what an operation did, as runs (neighbouring runs joined)."""

    def __init__(self) -> None:
        self.acquired: list[AcquiredRecords] = []
        self.accepted: list[OffsetRange] = []
        self.released: list[OffsetRange] = []
        self.renewed: list[OffsetRange] = []
        self.archived: list[ArchivedRecords] = []

    def acquire(self, r: InFlightRange) -> None:
        last = self.acquired[-1] if self.acquired else None
        if last and last.last_offset + 1 == r.first_offset and last.delivery_count == r.delivery_count:
            self.acquired[-1] = AcquiredRecords(last.first_offset, r.last_offset, r.delivery_count)
        else:
            self.acquired.append(AcquiredRecords(r.first_offset, r.last_offset, r.delivery_count))

    @staticmethod
    def _add(runs: list[OffsetRange], r: InFlightRange) -> None:
        if runs and runs[-1].last_offset + 1 == r.first_offset:
            runs[-1] = OffsetRange(runs[-1].first_offset, r.last_offset)
        else:
            runs.append(OffsetRange(r.first_offset, r.last_offset))

    def archive(self, r: InFlightRange, reason: ArchiveReason) -> None:
        last = self.archived[-1] if self.archived else None
        if last and last.last_offset + 1 == r.first_offset and (last.reason, last.delivery_count) == (reason, r.delivery_count):
            self.archived[-1] = replace(last, last_offset=r.last_offset)
        else:
            self.archived.append(ArchivedRecords(r.first_offset, r.last_offset, r.delivery_count, reason))

    def give_back(self, r: InFlightRange, limit: int) -> InFlightRange:
        """An Acquired range released (by its member, its lock's expiry or its member leaving):
        available again with its delivery count, or archived if that was its last delivery."""
        if r.delivery_count >= limit:
            self.archive(r, ArchiveReason.DELIVERY_COUNT_LIMIT)
            return r._to(RecordState.ARCHIVED)
        self._add(self.released, r)
        return r._to(RecordState.AVAILABLE)


def _expired(state: SharePartitionState, now_ms: int, config: DeliveryConfig, outcomes: _Outcomes) -> list[InFlightRange]:
    """The ranges with every lock that has expired by ``now_ms`` given back (a lock whose deadline
    is ``now_ms`` has expired)."""
    return [outcomes.give_back(r, config.delivery_count_limit) if r.lock_expired(now_ms) else r for r in state.in_flight]


# --- starting a share partition -------------------------------------------------------------------


@dataclass(frozen=True)
class OffsetReset:
    """``share.auto.offset.reset``: where a share partition starts when the group first reads it."""

    strategy: Literal["earliest", "latest", "by_duration"]
    duration_ms: int | None = None  # for by_duration


_DURATION = re.compile(
    r"P(?:(?P<d>\d+)D)?(?:T(?=\d)(?:(?P<h>\d+)H)?(?:(?P<m>\d+)M)?(?:(?P<s>\d+(?:\.\d{1,9})?)S)?)?", re.IGNORECASE
)


def parse_offset_reset(value: str) -> OffsetReset:
    """``earliest``, ``latest`` or ``by_duration:<ISO-8601 duration>`` (KIP-1106, e.g.
    ``by_duration:PT1H``: the first record at most that old), as Kafka accepts them."""
    text = value.strip().lower()
    if text == "earliest":
        return OffsetReset("earliest")
    if text == "latest":
        return OffsetReset("latest")
    if text.startswith("by_duration:"):
        spec = value.strip()[len("by_duration:") :]
        m = _DURATION.fullmatch(spec)
        if m and spec.upper() not in ("P", "PT") and any(m.group(g) for g in "dhms"):
            seconds = (
                int(m.group("d") or 0) * 86_400
                + int(m.group("h") or 0) * 3_600
                + int(m.group("m") or 0) * 60
                + Decimal(m.group("s") or 0)
            )
            return OffsetReset("by_duration", int(seconds * 1000))
        raise TxlogError(
            ErrorCode.INVALID_CONFIG,
            f"Invalid value {value} for configuration share.auto.offset.reset: "
            "the duration must be an ISO-8601 duration such as PT1H or P1DT12H",
        )
    raise TxlogError(
        ErrorCode.INVALID_CONFIG,
        f"Invalid value {value} for configuration share.auto.offset.reset: "
        "String must be one of: latest, earliest, by_duration:<ISO-8601 duration>",
    )


def reset_timestamp(reset: OffsetReset, now_ms: int) -> int | None:
    """For by_duration: the timestamp whose first offset (ListOffsets' answer) starts the share
    partition. None for earliest and latest."""
    return None if reset.duration_ms is None else now_ms - reset.duration_ms


def initial_state(
    reset: OffsetReset, *, log_start_offset: int, log_end_offset: int, offset_for_timestamp: int | None = None
) -> SharePartitionState:
    """A share partition the group has never read: it starts at the log start (earliest), the log
    end (latest), or the first offset at or after ``reset_timestamp`` (by_duration; the caller
    looks it up, None if no record is that recent: the log end), with nothing in flight."""
    if reset.strategy == "earliest":
        start = log_start_offset
    elif reset.strategy == "latest":
        start = log_end_offset
    else:
        start = log_end_offset if offset_for_timestamp is None else offset_for_timestamp
    start = min(max(start, log_start_offset), log_end_offset)
    return SharePartitionState(start, start)


def altered(start_offset: int) -> SharePartitionState:
    """AlterShareGroupOffsets: the share partition starts over at ``start_offset`` with nothing in
    flight. Kafka allows it only while no member holds the group (the caller checks: then no
    record can be acquired, and dropping the in-flight state loses no member's lock)."""
    if start_offset < 0:
        raise TxlogError(ErrorCode.INVALID_REQUEST, f"The start offset {start_offset} must not be negative")
    return SharePartitionState(start_offset, start_offset)


def advance_log_start(state: SharePartitionState, log_start_offset: int) -> SharePartitionState:
    """The log's start offset moved past the share partition's (retention, DeleteRecords): the
    records below it are gone, so are their in-flight states (an acknowledgement of them later is
    below the start offset: refused, or its part there skipped, as ``acknowledge`` says)."""
    if log_start_offset <= state.start_offset:
        return state
    end = max(state.end_offset, log_start_offset)
    kept = [
        r._part(max(r.first_offset, log_start_offset), r.last_offset)
        for r in state.in_flight
        if r.last_offset >= log_start_offset
    ]
    return _normalised(log_start_offset, end, kept)


# --- fetching -------------------------------------------------------------------------------------


def next_fetch_offset(state: SharePartitionState, now_ms: int) -> int:
    """Where the caller reads the log from for the next acquisition: the first in-flight record
    that can be acquired (available, or its lock expired), else the end offset."""
    for r in state.in_flight:
        if r.state is RecordState.AVAILABLE or r.lock_expired(now_ms):
            return r.first_offset
    return state.end_offset


def new_records_room(state: SharePartitionState, config: DeliveryConfig) -> int:
    """How many records past the end offset may be taken in flight now
    (group.share.partition.max.record.locks bounds the window from the start offset)."""
    return max(0, state.start_offset + config.max_record_locks - state.end_offset)


def throttle_delivery_count(config: DeliveryConfig) -> int:
    """From this delivery count on, records are redelivered in smaller and smaller responses of
    their own (Kafka's: half the delivery count limit, rounded up, at least 2)."""
    return max(2, -(-config.delivery_count_limit // 2))


def next_lock_deadline(state: SharePartitionState) -> int | None:
    """When the earliest lock expires (the timer that calls ``expire``), None if none is held."""
    deadlines = [r.lock_deadline_ms for r in state.in_flight if r.lock_deadline_ms is not None]
    return min(deadlines) if deadlines else None


def in_batches(acquired: Sequence[AcquiredRecords], batch_size: int | None) -> tuple[AcquiredRecords, ...]:
    """The acquired runs cut into runs of at most ``batch_size`` records: a ShareFetch's BatchSize,
    the consumer's preferred unit of acquisition and acknowledgement, which Kafka's AcquiredRecords
    follow (None or less than 1: as they are). Offsets and delivery counts are unchanged."""
    if batch_size is None or batch_size < 1:
        return tuple(acquired)
    out: list[AcquiredRecords] = []
    for a in acquired:
        for first in range(a.first_offset, a.last_offset + 1, batch_size):
            out.append(AcquiredRecords(first, min(a.last_offset, first + batch_size - 1), a.delivery_count))
    return tuple(out)


def acquire(
    state: SharePartitionState,
    member_id: str,
    first_offset: int,
    last_offset: int,
    *,
    now_ms: int,
    config: DeliveryConfig,
    max_records: int,
    not_deliverable: Sequence[tuple[int, int]] = (),
    lock_duration_ms: int | None = None,
) -> Acquisition:
    """``member_id`` acquires up to ``max_records`` records of the log range the caller read,
    [``first_offset``, ``last_offset``] (it read from ``next_fetch_offset``, at most to the high
    watermark, or the last stable offset for read_committed). Offsets with no record in the range
    (compacted away) are acquired with the rest: the member acknowledges them as GAP, as Kafka's
    clients do.

    The caller reads from ``next_fetch_offset`` (after ``advance_log_start`` if the log's start
    moved past the end offset: reading past the end offset is a bug, refused with ``ValueError``).
    In-flight records in the range are acquired if available (or their lock expired); offsets past
    the end offset are taken in flight, within ``new_records_room``. ``not_deliverable`` lists
    (first, last) offset runs that must never be delivered — records of aborted transactions and
    control records for read_committed — they are archived when first met, without a delivery.
    Each acquisition counts one more delivery and locks the records until ``now_ms`` plus the lock
    duration (``lock_duration_ms`` overrides the group's: RocketMQ's invisible duration). An
    available record that already had its last delivery (the limit was lowered) is archived.

    As Kafka 4.2 does, records delivered ``throttle_delivery_count`` times or more are redelivered
    apart, so that one record that keeps failing does not take a whole batch to the delivery limit
    with it: such a run ends the acquisition, starts it only if nothing was acquired before it, and
    is cut to half its length for each delivery from that count on (at least one record) — to one
    record on its last delivery.
    """
    if lock_duration_ms is not None and lock_duration_ms < 1:
        raise ValueError(f"a lock duration must be at least 1 ms, not {lock_duration_ms}")
    if first_offset > state.end_offset and first_offset <= last_offset:
        raise ValueError(f"read from {first_offset}, past the end offset {state.end_offset}: nothing there was taken in flight")
    outcomes = _Outcomes()
    ranges = _expired(state, now_ms, config, outcomes)
    deadline = now_ms + (config.record_lock_duration_ms if lock_duration_ms is None else lock_duration_ms)
    limit = config.delivery_count_limit
    remaining = max(0, max_records)
    low = max(first_offset, state.start_offset)

    throttle = throttle_delivery_count(config)
    stopped = False
    out: list[InFlightRange] = []
    for r in _merged(ranges):
        if stopped or r.state is not RecordState.AVAILABLE or r.last_offset < low or r.first_offset > last_offset:
            out.append(r)
            continue
        a = max(r.first_offset, low)
        d = r.delivery_count
        if d >= limit:
            b = min(r.last_offset, last_offset)
        elif remaining == 0:
            out.append(r)
            continue
        else:
            n = remaining
            if d >= throttle:
                # Records delivered this often may be what keeps failing: they go in a response of
                # their own, fewer at each further delivery, and alone on their last one.
                stopped = True
                if outcomes.acquired:
                    out.append(r)
                    continue
                run = min(r.last_offset, last_offset) - a + 1
                n = min(n, 1 if limit > 2 and d == limit - 1 else max(1, run >> (d - throttle + 1)))
            b = min(r.last_offset, last_offset, a + n - 1)
        if r.first_offset < a:
            out.append(r._part(r.first_offset, a - 1))
        part = r._part(a, b)
        if r.delivery_count >= limit:
            outcomes.archive(part, ArchiveReason.DELIVERY_COUNT_LIMIT)
            out.append(part._to(RecordState.ARCHIVED))
        else:
            taken = part._to(
                RecordState.ACQUIRED, delivery_count=r.delivery_count + 1, member_id=member_id, lock_deadline_ms=deadline
            )
            outcomes.acquire(taken)
            out.append(taken)
            remaining -= b - a + 1
        if b < r.last_offset:
            out.append(r._part(b + 1, r.last_offset))

    # Records past the end offset: new in flight, up to the window's bound.
    offset = state.end_offset
    high = (
        min(last_offset, state.start_offset + config.max_record_locks - 1)
        if first_offset <= offset and not stopped
        else offset - 1
    )
    skips = sorted((max(a, offset), b) for a, b in not_deliverable if b >= offset and a <= b)
    while offset <= high and remaining > 0:
        while skips and skips[0][1] < offset:
            skips.pop(0)
        if skips and skips[0][0] <= offset:
            b = min(skips[0][1], high)
            part = InFlightRange(offset, b, RecordState.ARCHIVED, 0)
            outcomes.archive(part, ArchiveReason.NOT_DELIVERABLE)
        else:
            b = min(high, offset + remaining - 1, skips[0][0] - 1 if skips else high)
            part = InFlightRange(offset, b, RecordState.ACQUIRED, 1, member_id, deadline)
            outcomes.acquire(part)
            remaining -= b - offset + 1
        out.append(part)
        offset = b + 1
    return Acquisition(
        _normalised(state.start_offset, max(state.end_offset, offset), out),
        tuple(outcomes.acquired),
        tuple(outcomes.released),
        tuple(outcomes.archived),
    )


# --- acknowledging --------------------------------------------------------------------------------


def _segments(batch: AcknowledgementBatch) -> list[tuple[int, int, AcknowledgeType]]:
    """A batch as runs of one acknowledgement type."""
    types = [AcknowledgeType(t) for t in batch.acknowledge_types]
    if len(types) == 1:
        return [(batch.first_offset, batch.last_offset, types[0])]
    runs: list[tuple[int, int, AcknowledgeType]] = []
    for i, t in enumerate(types):
        o = batch.first_offset + i
        if runs and runs[-1][2] is t:
            runs[-1] = (runs[-1][0], o, t)
        else:
            runs.append((o, o, t))
    return runs


def _request_problem(batches: Sequence[AcknowledgementBatch]) -> str | None:
    previous_last = -1
    for b in batches:
        if b.first_offset < 0 or b.last_offset < b.first_offset:
            return f"Invalid acknowledgement batch offsets: first {b.first_offset}, last {b.last_offset}"
        if b.first_offset <= previous_last:
            return "Acknowledgement batches must be in increasing order of offsets and must not overlap"
        n = b.last_offset - b.first_offset + 1
        if len(b.acknowledge_types) not in (1, n):
            return f"Acknowledgement batch {b.first_offset}-{b.last_offset} has {len(b.acknowledge_types)} acknowledge types"
        if any(t not in AcknowledgeType._value2member_map_ for t in b.acknowledge_types):
            return f"Invalid acknowledge type: {[int(t) for t in b.acknowledge_types]}"
        previous_last = b.last_offset
    return None


class _Acknowledge:
    def __init__(self, kind: AcknowledgeType, outcomes: _Outcomes, limit: int, renewed_deadline: int) -> None:
        self.kind, self.outcomes, self.limit, self.renewed_deadline = kind, outcomes, limit, renewed_deadline

    def __call__(self, r: InFlightRange) -> InFlightRange:
        o, kind = self.outcomes, self.kind
        if kind is AcknowledgeType.ACCEPT:
            o._add(o.accepted, r)
            return r._to(RecordState.ACKNOWLEDGED)
        if kind is AcknowledgeType.RELEASE:
            return o.give_back(r, self.limit)
        if kind is AcknowledgeType.RENEW:
            o._add(o.renewed, r)
            return r._to(RecordState.ACQUIRED, member_id=r.member_id, lock_deadline_ms=self.renewed_deadline)
        o.archive(r, ArchiveReason.REJECTED if kind is AcknowledgeType.REJECT else ArchiveReason.GAP)
        return r._to(RecordState.ARCHIVED)


def acknowledge(
    state: SharePartitionState,
    member_id: str,
    batches: Sequence[AcknowledgementBatch],
    *,
    now_ms: int,
    config: DeliveryConfig,
    lock_duration_ms: int | None = None,
) -> Acknowledgement | Refused:
    """``member_id`` acknowledges records it holds: ACCEPT, RELEASE, REJECT, GAP, or RENEW (its lock
    runs again from ``now_ms`` for the group's lock duration, or ``lock_duration_ms``: RocketMQ's
    ChangeInvisibleDuration). A batch wholly below the start offset is refused with
    INVALID_RECORD_STATE (its records are done: whoever acknowledges them no longer holds them); the
    part of a batch below the start offset is skipped, as Kafka skips it. Every other offset must be
    acquired by this member with its lock not expired at ``now_ms``; if one is
    not, the whole acknowledgement is refused with INVALID_RECORD_STATE (a lock that expired has
    given its records back, as Kafka's timer does: an acknowledgement from their former holder finds
    them not acquired). Offsets never taken in flight are INVALID_REQUEST, as a malformed request."""
    problem = _request_problem(batches)
    if problem:
        return Refused(ErrorCode.INVALID_REQUEST, problem)
    if lock_duration_ms is not None and lock_duration_ms < 1:
        return Refused(ErrorCode.INVALID_REQUEST, f"A lock duration must be at least 1 ms, not {lock_duration_ms}")
    outcomes = _Outcomes()
    ranges = _expired(state, now_ms, config, outcomes)
    start = state.start_offset
    work: list[tuple[int, int, AcknowledgeType]] = []
    for batch in batches:
        if batch.last_offset < start:
            # Every record of the batch is done: accepted, archived, or gone with the log's start.
            # Whoever acknowledges them now no longer holds them (its lock expired and another
            # member settled them, or this is a repeat): refused as Kafka refuses a batch it no
            # longer caches, so that no one is told that an acknowledgement took effect when the
            # records' fate was someone else's.
            return Refused(
                ErrorCode.INVALID_RECORD_STATE, "Batch record not found. The request batch offsets are not found in the cache."
            )
        if batch.first_offset >= state.end_offset:
            return Refused(
                ErrorCode.INVALID_REQUEST, "Batch record not found. The first offset in request is past acquired records."
            )
        if batch.last_offset >= state.end_offset:
            return Refused(
                ErrorCode.INVALID_REQUEST, "Batch record not found. The last offset in request is past acquired records."
            )
        for a, b, kind in _segments(batch):
            if b < start:
                continue
            a = max(a, start)
            for r in ranges:
                if r.last_offset < a or r.first_offset > b:
                    continue
                if r.state is not RecordState.ACQUIRED:
                    return Refused(
                        ErrorCode.INVALID_RECORD_STATE, "The offset cannot be acknowledged. The offset is not acquired."
                    )
                if r.member_id != member_id:
                    return Refused(ErrorCode.INVALID_RECORD_STATE, "Member is not the owner of offset")
            work.append((a, b, kind))
    renewed_deadline = now_ms + (config.record_lock_duration_ms if lock_duration_ms is None else lock_duration_ms)
    for a, b, kind in work:
        ranges = _map_span(ranges, a, b, _Acknowledge(kind, outcomes, config.delivery_count_limit, renewed_deadline))
    return Acknowledgement(
        _normalised(start, state.end_offset, ranges),
        tuple(outcomes.accepted),
        tuple(outcomes.released),
        tuple(outcomes.archived),
        tuple(outcomes.renewed),
    )


# --- giving locks back ----------------------------------------------------------------------------


def expire(state: SharePartitionState, *, now_ms: int, config: DeliveryConfig) -> Release:
    """The lock timer: every lock expired by ``now_ms`` gives its records back — available again,
    or archived if that was their last delivery (Kafka never delivers a record more than
    ``share.delivery.count.limit`` times)."""
    outcomes = _Outcomes()
    ranges = _expired(state, now_ms, config, outcomes)
    if not (outcomes.released or outcomes.archived):
        return Release(state)
    return Release(_normalised(state.start_offset, state.end_offset, ranges), tuple(outcomes.released), tuple(outcomes.archived))


def release_member(state: SharePartitionState, member_id: str, *, now_ms: int, config: DeliveryConfig) -> Release:
    """A member left the group, or its share session ended: what it holds is available again at
    once, and — as Kafka's releaseAcquiredRecords has it — that acquisition does not count as a
    delivery (the member is gone before it could process them: its delivery count goes back down,
    and nothing is archived for it). Locks that had already expired, its own or others', go back as
    on expiry, counted."""
    outcomes = _Outcomes()
    ranges = []
    for r in _expired(state, now_ms, config, outcomes):
        if r.state is RecordState.ACQUIRED and r.member_id == member_id:
            outcomes._add(outcomes.released, r)
            r = r._to(RecordState.AVAILABLE, delivery_count=r.delivery_count - 1)
        ranges.append(r)
    if not (outcomes.released or outcomes.archived):
        return Release(state)
    return Release(_normalised(state.start_offset, state.end_offset, ranges), tuple(outcomes.released), tuple(outcomes.archived))


# --- storage --------------------------------------------------------------------------------------


def row_changes(old: SharePartitionState, new: SharePartitionState) -> tuple[tuple[int, ...], tuple[InFlightRange, ...]]:
    """What storage writes to go from ``old`` to ``new``, rows keyed by their first offset: the
    first offsets of rows to delete, and the rows to insert or overwrite. Untouched ranges are not
    written."""
    kept = {r.first_offset: r for r in old.in_flight}
    new_by_first = {r.first_offset: r for r in new.in_flight}
    deleted = tuple(f for f in kept if f not in new_by_first)
    upserted = tuple(r for r in new.in_flight if kept.get(r.first_offset) != r)
    return deleted, upserted
