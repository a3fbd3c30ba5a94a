"""A share partition's acknowledgement (KIP-932's ShareAcknowledge and a ShareFetch's
acknowledgements, RocketMQ's AckMessage and ChangeInvisibleDuration): ``acknowledge`` checks a
member's batches against the records it holds and takes them whole or refuses them whole. Plain
rules over ``app.domain.share_partition``'s state, no I/O, no clock, as every operation on it.
"""

from __future__ import annotations

from typing import Callable, Sequence

from app.domain.share_partition import (
    Acknowledgement,
    AcknowledgementBatch,
    AcknowledgeType,
    ArchiveReason,
    DeliveryConfig,
    InFlightRange,
    RecordState,
    Refused,
    SharePartitionState,
    _expired,
    _normalised,
    _Outcomes,
)
from app.errors import ErrorCode


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
