"""A share partition's acquisition (KIP-932's ShareFetch, RocketMQ's ReceiveMessage): where the
caller reads the log from, how many new records the in-flight window has room for, and ``acquire``,
which hands records to a member under a lock. Plain rules over ``app.domain.share_partition``'s
state, no I/O, no clock, as every operation on it.
"""

from __future__ import annotations

from typing import Sequence

from app.domain.share_partition import (
    AcquiredRecords,
    Acquisition,
    ArchiveReason,
    DeliveryConfig,
    InFlightRange,
    RecordState,
    SharePartitionState,
    _expired,
    _merged,
    _normalised,
    _Outcomes,
)


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
