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

Here are the state, its value types and what operations answer, where a share partition starts,
and the giving back of locks (``expire``, ``release_member``); the two operations a member drives
have modules of their own: ``app.domain.share_acquisition`` (``acquire``) and
``app.domain.share_acknowledgement`` (``acknowledge``).

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
from typing import Iterable, Literal, Protocol

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


class _Run(Protocol):
    @property
    def first_offset(self) -> int: ...
    @property
    def last_offset(self) -> int: ...


def record_count(runs: Iterable[_Run]) -> int:
    """How many offsets ``runs`` hold (each from its first offset to its last, both included)."""
    return sum(r.last_offset - r.first_offset + 1 for r in runs)


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
        return record_count(self.acquired)


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
    below the start offset: refused, or its part there skipped, as
    ``share_acknowledgement.acknowledge`` says)."""
    if log_start_offset <= state.start_offset:
        return state
    end = max(state.end_offset, log_start_offset)
    kept = [
        r._part(max(r.first_offset, log_start_offset), r.last_offset)
        for r in state.in_flight
        if r.last_offset >= log_start_offset
    ]
    return _normalised(log_start_offset, end, kept)


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
