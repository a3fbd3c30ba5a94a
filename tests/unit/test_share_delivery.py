"""The share-partition delivery state machine (app.domain.share_partition): every transition and
every refusal, then a hypothesis model driving random members, acquisitions, acknowledgements,
lock expiries, departures and log truncation through it, against a per-offset reference model:

- the ranges always equal the reference's per-offset states (and are well formed: contiguous,
  merged, never starting with a final record);
- no offset is held by two members at once, nor acquired while its holder's lock still runs;
- the start offset only moves forward, and only past acknowledged or archived records;
- every offset ever handed out is still in flight, or was accepted or archived (with a reason) —
  or removed by the log's own truncation — never lost, and never accepted twice;
- no record is delivered more often than the delivery count limit;
- the in-flight window never exceeds max_record_locks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from app.domain.share_acknowledgement import acknowledge
from app.domain.share_acquisition import (
    acquire,
    in_batches,
    new_records_room,
    next_fetch_offset,
    next_lock_deadline,
    throttle_delivery_count,
)
from app.domain.share_partition import (
    Acknowledgement,
    AcknowledgementBatch,
    AcknowledgeType,
    AcquiredRecords,
    ArchivedRecords,
    ArchiveReason,
    DeliveryConfig,
    InFlightRange,
    OffsetRange,
    OffsetReset,
    RecordState,
    Refused,
    SharePartitionState,
    advance_log_start,
    altered,
    check_transition,
    expire,
    initial_state,
    parse_offset_reset,
    release_member,
    reset_timestamp,
    row_changes,
)
from app.errors import ErrorCode, TxlogError

R = RecordState
A = AcknowledgeType
CFG = DeliveryConfig(record_lock_duration_ms=1_000, delivery_count_limit=3, max_record_locks=20)


def acq(first: int, last: int, count: int, member: str, deadline: int) -> InFlightRange:
    return InFlightRange(first, last, R.ACQUIRED, count, member, deadline)


def avail(first: int, last: int, count: int) -> InFlightRange:
    return InFlightRange(first, last, R.AVAILABLE, count)


def batch(first: int, last: int, *types: int) -> AcknowledgementBatch:
    return AcknowledgementBatch(first, last, tuple(types))


def fresh(start: int = 0) -> SharePartitionState:
    return SharePartitionState(start, start)


def take(state: SharePartitionState, member: str, first: int, last: int, now: int = 0, **kw: object) -> SharePartitionState:
    kw.setdefault("max_records", 100)
    out = acquire(state, member, first, last, now_ms=now, config=CFG, **kw)  # type: ignore[arg-type]
    out.state.check()
    return out.state


def ack(state: SharePartitionState, member: str, *batches: AcknowledgementBatch, now: int = 0, **kw: object) -> Acknowledgement:
    out = acknowledge(state, member, batches, now_ms=now, config=CFG, **kw)  # type: ignore[arg-type]
    assert isinstance(out, Acknowledgement), out
    out.state.check()
    return out


def refused(state: SharePartitionState, member: str, *batches: AcknowledgementBatch, now: int = 0) -> Refused:
    out = acknowledge(state, member, batches, now_ms=now, config=CFG)
    assert isinstance(out, Refused), out
    return out


# --- the state and its rows ----------------------------------------------------------------------


def test_transitions_follow_kafkas_table() -> None:
    for to in (R.AVAILABLE, R.ACKNOWLEDGED, R.ARCHIVED):
        check_transition(R.ACQUIRED, to)
    check_transition(R.AVAILABLE, R.ACQUIRED)
    check_transition(R.ACQUIRED, R.ACQUIRED)  # a renewed lock
    check_transition(R.AVAILABLE, R.ARCHIVED)  # out of deliveries before being acquired again
    for bad in (
        (R.AVAILABLE, R.ACKNOWLEDGED),
        (R.AVAILABLE, R.AVAILABLE),
        (R.ACKNOWLEDGED, R.AVAILABLE),
        (R.ARCHIVED, R.ACQUIRED),
        (R.ACKNOWLEDGED, R.ARCHIVED),
    ):
        with pytest.raises(ValueError):
            check_transition(*bad)
    assert [s.value for s in R] == [0, 1, 2, 4]  # Kafka's ids, as persisted
    assert [t.value for t in A] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(
    "state, why",
    [
        (SharePartitionState(5, 4), "bad window"),
        (SharePartitionState(-1, 0), "bad window"),
        (SharePartitionState(0, 3, (avail(0, 1, 1),)), "end at 2"),
        (SharePartitionState(0, 3, (avail(0, 1, 1), avail(3, 3, 1))), "do not cover"),
        (SharePartitionState(0, 2, (avail(1, 1, 1),)), "do not cover"),
        (SharePartitionState(0, 2, (avail(0, 0, 1), avail(1, 1, 1))), "should be one range"),
        (SharePartitionState(0, 1, (InFlightRange(0, 0, R.ARCHIVED, 1),)), "should have moved"),
        (SharePartitionState(0, 1, (InFlightRange(0, 0, R.ACQUIRED, 1),)), "member and a lock"),
        (SharePartitionState(0, 1, (InFlightRange(0, 0, R.AVAILABLE, 1, "m", 5),)), "member and a lock"),
        (SharePartitionState(0, 1, (acq(0, 0, 0, "m", 5),)), "delivery count"),
        (SharePartitionState(0, 1, (InFlightRange(0, 0, R.AVAILABLE, -1),)), "delivery count"),
        (SharePartitionState(0, 2, (avail(0, 0, 1), avail(1, 0, 1))), "do not cover"),
    ],
)
def test_malformed_states_are_caught(state: SharePartitionState, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        state.check()


def test_rows_round_trip_and_changes_touch_only_what_moved() -> None:
    s = take(fresh(), "m1", 0, 9, max_records=10)
    assert s.in_flight == (acq(0, 9, 1, "m1", 1_000),)  # 10 records, one row
    rows = list(reversed(s.in_flight))
    assert SharePartitionState.from_rows(s.start_offset, s.end_offset, rows) == s
    with pytest.raises(ValueError):
        SharePartitionState.from_rows(0, 11, rows)
    s2 = ack(s, "m1", batch(3, 4, A.RELEASE)).state
    deleted, upserted = row_changes(s, s2)
    assert deleted == ()
    assert upserted == (acq(0, 2, 1, "m1", 1_000), avail(3, 4, 1), acq(5, 9, 1, "m1", 1_000))
    s3 = ack(s2, "m1", batch(0, 2, A.ACCEPT), batch(5, 9, A.ACCEPT)).state
    assert row_changes(s2, s3) == ((0,), (InFlightRange(5, 9, R.ACKNOWLEDGED, 1),))
    assert s3 == SharePartitionState(3, 10, (avail(3, 4, 1), InFlightRange(5, 9, R.ACKNOWLEDGED, 1)))
    assert row_changes(s3, s3) == ((), ())
    assert s3.record(4) == avail(3, 4, 1) and s3.record(2) is None and s3.record(10) is None
    assert s3.in_flight_count == 7


# --- starting points -----------------------------------------------------------------------------


def test_auto_offset_reset_decides_the_start_only() -> None:
    assert initial_state(OffsetReset("earliest"), log_start_offset=5, log_end_offset=50) == SharePartitionState(5, 5)
    assert initial_state(OffsetReset("latest"), log_start_offset=5, log_end_offset=50) == SharePartitionState(50, 50)
    by = parse_offset_reset("by_duration:PT1H")
    assert by == OffsetReset("by_duration", 3_600_000)
    assert reset_timestamp(by, 10_000_000) == 6_400_000
    assert reset_timestamp(OffsetReset("latest"), 10_000_000) is None
    assert initial_state(by, log_start_offset=5, log_end_offset=50, offset_for_timestamp=20) == SharePartitionState(20, 20)
    assert initial_state(by, log_start_offset=5, log_end_offset=50) == SharePartitionState(50, 50)  # nothing that recent
    assert initial_state(by, log_start_offset=5, log_end_offset=50, offset_for_timestamp=1) == SharePartitionState(5, 5)


@pytest.mark.parametrize(
    "value, expected",
    [
        ("earliest", OffsetReset("earliest")),
        (" LATEST ", OffsetReset("latest")),
        ("by_duration:P1D", OffsetReset("by_duration", 86_400_000)),
        ("by_duration:P1DT2H3M4.5S", OffsetReset("by_duration", 93_784_500)),
        ("by_duration:pt0.001s", OffsetReset("by_duration", 1)),
        ("by_duration:PT0S", OffsetReset("by_duration", 0)),
    ],
)
def test_offset_reset_values(value: str, expected: OffsetReset) -> None:
    assert parse_offset_reset(value) == expected


@pytest.mark.parametrize(
    "value",
    [
        "none",
        "",
        "by_duration:",
        "by_duration:P",
        "by_duration:PT",
        "by_duration:1H",
        "by_duration:-PT1H",
        "by_duration:PT1H2D",
        "by_duration:P1W",
        "by_duration:PT1.5H",
    ],
)
def test_bad_offset_reset_values(value: str) -> None:
    with pytest.raises(TxlogError) as e:
        parse_offset_reset(value)
    assert e.value.code is ErrorCode.INVALID_CONFIG
    assert "share.auto.offset.reset" in e.value.message


def test_altering_offsets_starts_over() -> None:
    s = take(fresh(), "m1", 0, 9)
    assert altered(4) == SharePartitionState(4, 4)
    assert altered(100) == SharePartitionState(100, 100)
    with pytest.raises(TxlogError) as e:
        altered(-1)
    assert e.value.code is ErrorCode.INVALID_REQUEST
    assert s.end_offset == 10  # the old state is a value: untouched


def test_log_start_moving_past_the_start_offset_drops_what_is_gone() -> None:
    s = take(fresh(), "m1", 0, 9)
    assert advance_log_start(s, 0) is s
    s2 = advance_log_start(s, 4)
    assert s2 == SharePartitionState(4, 10, (acq(4, 9, 1, "m1", 1_000),))
    assert advance_log_start(s, 25) == SharePartitionState(25, 25)
    # a final record left at the new start is passed at once
    s3 = ack(s, "m1", batch(5, 5, A.ACCEPT)).state
    assert advance_log_start(s3, 5) == SharePartitionState(6, 10, (acq(6, 9, 1, "m1", 1_000),))
    # acknowledging what the truncation removed is skipped, as below any start offset, or refused
    # when nothing of the batch is left
    out = ack(s2, "m1", batch(0, 5, A.ACCEPT))
    assert out.accepted == (OffsetRange(4, 5),)
    assert refused(s2, "m1", batch(0, 3, A.ACCEPT)).code is ErrorCode.INVALID_RECORD_STATE


# --- acquiring -----------------------------------------------------------------------------------


def test_acquire_new_records_locks_them_for_the_member() -> None:
    out = acquire(fresh(), "m1", 0, 9, now_ms=100, config=CFG, max_records=500)
    assert out.acquired == (AcquiredRecords(0, 9, 1),)
    assert out.acquired_count == 10
    assert out.state == SharePartitionState(0, 10, (acq(0, 9, 1, "m1", 1_100),))
    assert next_lock_deadline(out.state) == 1_100
    assert next_lock_deadline(fresh()) is None


def test_acquire_stops_at_max_records() -> None:
    out = acquire(fresh(), "m1", 0, 9, now_ms=0, config=CFG, max_records=4)
    assert out.acquired == (AcquiredRecords(0, 3, 1),)
    assert out.state.end_offset == 4
    assert acquire(fresh(), "m1", 0, 9, now_ms=0, config=CFG, max_records=0).acquired == ()


def test_acquired_runs_in_batches_of_the_fetchs_batch_size() -> None:
    runs = (AcquiredRecords(0, 4, 1), AcquiredRecords(5, 5, 3), AcquiredRecords(8, 11, 2))
    assert in_batches(runs, 2) == (
        AcquiredRecords(0, 1, 1),
        AcquiredRecords(2, 3, 1),
        AcquiredRecords(4, 4, 1),
        AcquiredRecords(5, 5, 3),
        AcquiredRecords(8, 9, 2),
        AcquiredRecords(10, 11, 2),
    )
    assert in_batches(runs, 4) == (AcquiredRecords(0, 3, 1), AcquiredRecords(4, 4, 1), runs[1], runs[2])
    assert in_batches(runs, 500) == runs
    assert in_batches(runs, None) == in_batches(runs, 0) == runs
    assert in_batches((), 3) == ()


def test_acquire_with_its_own_lock_duration() -> None:
    out = acquire(fresh(), "m1", 0, 0, now_ms=100, config=CFG, max_records=1, lock_duration_ms=60_000)
    assert out.state.in_flight == (acq(0, 0, 1, "m1", 60_100),)
    with pytest.raises(ValueError):
        acquire(fresh(), "m1", 0, 0, now_ms=100, config=CFG, max_records=1, lock_duration_ms=0)


def test_acquire_stops_when_the_window_is_full() -> None:
    s = take(fresh(), "m1", 0, 99)
    assert s.end_offset == 20 and new_records_room(s, CFG) == 0
    assert acquire(s, "m2", 20, 99, now_ms=0, config=CFG, max_records=100).acquired == ()
    # the window moves with the start offset
    s = ack(s, "m1", batch(0, 4, A.ACCEPT)).state
    assert s.start_offset == 5 and new_records_room(s, CFG) == 5
    out = acquire(s, "m2", 20, 99, now_ms=0, config=CFG, max_records=100)
    assert out.acquired == (AcquiredRecords(20, 24, 1),)
    # in-flight records can be acquired again with the window full
    s = ack(out.state, "m1", batch(6, 7, A.RELEASE)).state
    assert new_records_room(s, CFG) == 0
    assert acquire(s, "m2", 6, 99, now_ms=0, config=CFG, max_records=100).acquired == (AcquiredRecords(6, 7, 2),)


def test_acquire_archives_records_not_to_deliver() -> None:
    out = acquire(fresh(), "m1", 0, 9, now_ms=0, config=CFG, max_records=100, not_deliverable=[(3, 4), (9, 12), (0, 0)])
    assert out.acquired == (AcquiredRecords(1, 2, 1), AcquiredRecords(5, 8, 1))
    assert out.archived == (
        ArchivedRecords(0, 0, 0, ArchiveReason.NOT_DELIVERABLE),
        ArchivedRecords(3, 4, 0, ArchiveReason.NOT_DELIVERABLE),
        ArchivedRecords(9, 9, 0, ArchiveReason.NOT_DELIVERABLE),
    )
    assert out.state.start_offset == 1 and out.state.end_offset == 10
    # a read of nothing but aborted records and markers passes them all
    only = acquire(fresh(), "m1", 0, 4, now_ms=0, config=CFG, max_records=1, not_deliverable=[(0, 4)])
    assert only.acquired == () and only.state == SharePartitionState(5, 5)


def test_not_deliverable_after_max_records_waits_for_the_next_read() -> None:
    out = acquire(fresh(), "m1", 0, 9, now_ms=0, config=CFG, max_records=2, not_deliverable=[(2, 3)])
    assert out.acquired == (AcquiredRecords(0, 1, 1),) and out.archived == ()
    assert out.state.end_offset == 2


def test_acquire_takes_available_in_flight_records_then_new_ones() -> None:
    s = take(fresh(), "m1", 0, 5)
    s = ack(s, "m1", batch(1, 2, A.RELEASE), batch(4, 4, A.RELEASE)).state
    assert next_fetch_offset(s, 0) == 1
    out = acquire(s, "m2", 0, 9, now_ms=10, config=CFG, max_records=100)
    assert out.acquired == (AcquiredRecords(1, 2, 2), AcquiredRecords(4, 4, 2), AcquiredRecords(6, 9, 1))
    assert out.state.in_flight == (
        acq(0, 0, 1, "m1", 1_000),
        acq(1, 2, 2, "m2", 1_010),
        acq(3, 3, 1, "m1", 1_000),
        acq(4, 4, 2, "m2", 1_010),
        acq(5, 5, 1, "m1", 1_000),
        acq(6, 9, 1, "m2", 1_010),
    )
    assert next_fetch_offset(out.state, 10) == 10


def test_acquire_runs_of_one_delivery_count_are_one_entry() -> None:
    cfg = DeliveryConfig(record_lock_duration_ms=1_000, delivery_count_limit=5, max_record_locks=20)
    s = acquire(fresh(), "m1", 0, 3, now_ms=0, config=cfg, max_records=100).state
    s = ack(s, "m1", batch(2, 3, A.RELEASE)).state
    out = acquire(s, "m2", 2, 7, now_ms=0, config=cfg, max_records=100)
    assert out.acquired == (AcquiredRecords(2, 3, 2), AcquiredRecords(4, 7, 1))
    s = ack(out.state, "m2", batch(2, 7, A.RELEASE)).state
    s = ack(s, "m1", batch(0, 1, A.RELEASE)).state
    assert s.in_flight == (avail(0, 1, 1), avail(2, 3, 2), avail(4, 7, 1))
    out = acquire(s, "m3", 0, 7, now_ms=0, config=cfg, max_records=100)
    assert out.acquired == (AcquiredRecords(0, 1, 2), AcquiredRecords(2, 3, 3), AcquiredRecords(4, 7, 2))


def test_records_delivered_often_are_redelivered_apart() -> None:
    cfg = DeliveryConfig(record_lock_duration_ms=1_000, delivery_count_limit=5, max_record_locks=100)
    assert throttle_delivery_count(cfg) == 3
    assert [throttle_delivery_count(DeliveryConfig(delivery_count_limit=n)) for n in (1, 2, 3, 4, 6, 10)] == [2, 2, 2, 2, 3, 5]
    s = SharePartitionState(0, 20, (avail(0, 1, 1), avail(2, 9, 3), avail(10, 19, 4)))
    # after other records: the throttled run waits for a response of its own, and so do new records
    out = acquire(s, "m1", 0, 40, now_ms=0, config=cfg, max_records=100)
    assert out.acquired == (AcquiredRecords(0, 1, 2),)
    assert out.state.end_offset == 20
    # alone: half of the run at the throttle count (3 delivered, 1 shift)
    out = acquire(out.state, "m1", 0, 40, now_ms=0, config=cfg, max_records=100)
    assert out.acquired == (AcquiredRecords(2, 5, 4),)
    assert out.state.in_flight[-2:] == (avail(6, 9, 3), avail(10, 19, 4))
    # on the last delivery: one record
    s = SharePartitionState(10, 20, (avail(10, 19, 4),))
    out = acquire(s, "m1", 10, 40, now_ms=0, config=cfg, max_records=100)
    assert out.acquired == (AcquiredRecords(10, 10, 5),) and out.state.end_offset == 20
    # a limit of 3 throttles from 2, which is the last delivery: one at a time
    s = SharePartitionState(0, 4, (avail(0, 3, 2),))
    assert acquire(s, "m1", 0, 3, now_ms=0, config=CFG, max_records=100).acquired == (AcquiredRecords(0, 0, 3),)
    # a limit of 7 throttles from 4: a run of 9 at 5 deliveries gives 9 >> 2 = 2, at 4 gives 4
    cfg7 = DeliveryConfig(delivery_count_limit=7)
    s = SharePartitionState(0, 9, (avail(0, 8, 5),))
    assert acquire(s, "m1", 0, 8, now_ms=0, config=cfg7, max_records=100).acquired == (AcquiredRecords(0, 1, 6),)
    s = SharePartitionState(0, 9, (avail(0, 8, 4),))
    assert acquire(s, "m1", 0, 8, now_ms=0, config=cfg7, max_records=3).acquired == (AcquiredRecords(0, 2, 5),)
    # the run counted is what the caller read of it
    assert acquire(s, "m1", 0, 1, now_ms=0, config=cfg7, max_records=100).acquired == (AcquiredRecords(0, 0, 5),)


def test_acquire_partly_within_an_available_range_and_the_read() -> None:
    s = ack(take(fresh(), "m1", 0, 9), "m1", batch(0, 9, A.RELEASE)).state
    assert s.in_flight == (avail(0, 9, 1),)
    out = acquire(s, "m2", 3, 5, now_ms=0, config=CFG, max_records=100)  # the caller read less
    assert out.acquired == (AcquiredRecords(3, 5, 2),)
    assert out.state.in_flight == (avail(0, 2, 1), acq(3, 5, 2, "m2", 1_000), avail(6, 9, 1))
    out = acquire(s, "m2", 0, 9, now_ms=0, config=CFG, max_records=4)
    assert out.state.in_flight == (acq(0, 3, 2, "m2", 1_000), avail(4, 9, 1))
    # reads starting below the start offset only take what is in flight
    s = ack(out.state, "m2", batch(0, 3, A.ACCEPT)).state
    assert acquire(s, "m3", 0, 5, now_ms=0, config=CFG, max_records=100).acquired == (AcquiredRecords(4, 5, 2),)


def test_acquire_never_takes_held_or_final_records() -> None:
    s = take(fresh(), "m1", 0, 4)
    s = ack(s, "m1", batch(1, 1, A.ACCEPT), batch(2, 2, A.REJECT)).state
    out = acquire(s, "m2", 0, 4, now_ms=999, config=CFG, max_records=100)
    assert out.acquired == () and out.state == s


def test_acquire_reading_past_the_end_offset_is_a_bug() -> None:
    with pytest.raises(ValueError, match="past the end offset"):
        acquire(fresh(), "m1", 5, 9, now_ms=0, config=CFG, max_records=10)
    assert acquire(fresh(), "m1", 5, 4, now_ms=0, config=CFG, max_records=10).acquired == ()  # an empty read


def test_acquire_treats_expired_locks_as_released() -> None:
    s = take(fresh(), "m1", 0, 4, now=0)
    assert next_fetch_offset(s, 999) == 5
    assert next_fetch_offset(s, 1_000) == 0  # a lock whose deadline is now has expired
    out = acquire(s, "m2", 0, 4, now_ms=1_000, config=CFG, max_records=100)
    assert out.released == (OffsetRange(0, 4),)
    assert out.acquired == (AcquiredRecords(0, 4, 2),)
    assert out.state.in_flight == (acq(0, 4, 2, "m2", 2_000),)


def test_acquire_archives_records_out_of_deliveries() -> None:
    # the limit was lowered while records were available with more deliveries than it allows
    s = SharePartitionState(0, 4, (avail(0, 1, 3), avail(2, 3, 1)))
    out = acquire(s, "m1", 0, 3, now_ms=0, config=CFG, max_records=1)
    assert out.archived == (ArchivedRecords(0, 1, 3, ArchiveReason.DELIVERY_COUNT_LIMIT),)
    assert out.acquired == (AcquiredRecords(2, 2, 2),)
    assert out.state == SharePartitionState(2, 4, (acq(2, 2, 2, "m1", 1_000), avail(3, 3, 1)))


# --- acknowledging -------------------------------------------------------------------------------


def test_accept_acknowledges_and_moves_the_start_offset() -> None:
    s = take(fresh(), "m1", 0, 9)
    out = ack(s, "m1", batch(0, 9, A.ACCEPT))
    assert out.accepted == (OffsetRange(0, 9),)
    assert out.state == SharePartitionState(10, 10)


def test_accept_out_of_order_waits_for_the_prefix() -> None:
    s = take(fresh(), "m1", 0, 9)
    s = ack(s, "m1", batch(5, 9, A.ACCEPT)).state
    assert s.start_offset == 0 and s.in_flight[-1] == InFlightRange(5, 9, R.ACKNOWLEDGED, 1)
    s = ack(s, "m1", batch(0, 4, A.ACCEPT)).state
    assert s == SharePartitionState(10, 10)


def test_release_makes_available_keeping_the_delivery_count() -> None:
    s = take(fresh(), "m1", 0, 4)
    out = ack(s, "m1", batch(0, 4, A.RELEASE))
    assert out.released == (OffsetRange(0, 4),)
    assert out.state.in_flight == (avail(0, 4, 1),)


def test_release_on_the_last_delivery_archives() -> None:
    s = SharePartitionState(0, 2, (acq(0, 0, 3, "m1", 1_000), acq(1, 1, 2, "m1", 1_000)))
    out = ack(s, "m1", batch(0, 1, A.RELEASE))
    assert out.archived == (ArchivedRecords(0, 0, 3, ArchiveReason.DELIVERY_COUNT_LIMIT),)
    assert out.released == (OffsetRange(1, 1),)
    assert out.state == SharePartitionState(1, 2, (avail(1, 1, 2),))


def test_reject_and_gap_archive() -> None:
    s = take(fresh(), "m1", 0, 4)
    out = ack(s, "m1", batch(0, 4, A.REJECT, A.GAP, A.GAP, A.ACCEPT, A.REJECT))
    assert out.archived == (
        ArchivedRecords(0, 0, 1, ArchiveReason.REJECTED),
        ArchivedRecords(1, 2, 1, ArchiveReason.GAP),
        ArchivedRecords(4, 4, 1, ArchiveReason.REJECTED),
    )
    assert out.accepted == (OffsetRange(3, 3),)
    assert out.state == SharePartitionState(5, 5)


def test_renew_extends_the_lock_only() -> None:
    s = take(fresh(), "m1", 0, 4, now=0)
    out = ack(s, "m1", batch(1, 2, A.RENEW), now=900)
    assert out.renewed == (OffsetRange(1, 2),)
    assert out.state.in_flight == (acq(0, 0, 1, "m1", 1_000), acq(1, 2, 1, "m1", 1_900), acq(3, 4, 1, "m1", 1_000))
    out = ack(s, "m1", batch(0, 4, A.RENEW), now=900, lock_duration_ms=5_000)  # ChangeInvisibleDuration
    assert out.state.in_flight == (acq(0, 4, 1, "m1", 5_900),)
    assert acknowledge(s, "m1", [batch(0, 0, A.RENEW)], now_ms=0, config=CFG, lock_duration_ms=0) == Refused(
        ErrorCode.INVALID_REQUEST, "A lock duration must be at least 1 ms, not 0"
    )
    # expired: too late to renew
    assert refused(s, "m1", batch(0, 0, A.RENEW), now=1_000).code is ErrorCode.INVALID_RECORD_STATE


def test_per_offset_types_in_one_batch() -> None:
    s = take(fresh(), "m1", 0, 5)
    out = ack(s, "m1", batch(0, 5, A.ACCEPT, A.ACCEPT, A.RELEASE, A.RENEW, A.RELEASE, A.ACCEPT), now=10)
    assert out.accepted == (OffsetRange(0, 1), OffsetRange(5, 5))
    assert out.released == (OffsetRange(2, 2), OffsetRange(4, 4))
    assert out.renewed == (OffsetRange(3, 3),)
    assert out.state.in_flight == (
        avail(2, 2, 1),
        acq(3, 3, 1, "m1", 1_010),
        avail(4, 4, 1),
        InFlightRange(5, 5, R.ACKNOWLEDGED, 1),
    )


def test_acknowledging_below_the_start_offset_is_skipped_or_refused() -> None:
    s = ack(take(fresh(), "m1", 0, 9), "m1", batch(0, 4, A.ACCEPT)).state
    out = ack(s, "m1", batch(3, 6, A.ACCEPT))
    assert out.archived == () and out.accepted == (OffsetRange(5, 6),)
    # a batch wholly below the start offset: its records are done, refused as Kafka refuses it
    assert refused(s, "m1", batch(0, 2, A.REJECT), batch(3, 6, A.ACCEPT)) == Refused(
        ErrorCode.INVALID_RECORD_STATE, "Batch record not found. The request batch offsets are not found in the cache."
    )
    # per-offset types, partly below the start offset
    out = ack(s, "m1", batch(3, 6, A.REJECT, A.REJECT, A.RELEASE, A.ACCEPT))
    assert out.released == (OffsetRange(5, 5),) and out.accepted == (OffsetRange(6, 6),) and out.archived == ()


def test_a_late_acknowledgement_of_records_another_member_settled_is_refused() -> None:
    """m1's lock expires, m2 acquires the records and accepts them: the start offset passes them.
    m1's acknowledgement, arriving late, must not be told it took effect."""
    s = take(fresh(), "m1", 0, 2)  # locked until 1 000
    s = acquire(s, "m2", 0, 2, now_ms=1_000, config=CFG, max_records=500).state
    s = ack(s, "m2", batch(0, 2, A.ACCEPT), now=1_100).state
    assert (s.start_offset, s.in_flight) == (3, ())
    for kind in (A.ACCEPT, A.REJECT, A.RELEASE):
        assert refused(s, "m1", batch(0, 2, kind), now=1_200).code is ErrorCode.INVALID_RECORD_STATE


def test_an_acknowledgement_is_all_or_nothing() -> None:
    s = take(fresh(), "m1", 0, 4)
    s = take(s, "m2", 5, 9)
    r = refused(s, "m1", batch(0, 4, A.ACCEPT), batch(5, 5, A.ACCEPT))
    assert r == Refused(ErrorCode.INVALID_RECORD_STATE, "Member is not the owner of offset")
    assert r.error().code is ErrorCode.INVALID_RECORD_STATE and r.error().message == r.message


@pytest.mark.parametrize(
    "batches, message",
    [
        ([batch(3, 2, A.ACCEPT)], "Invalid acknowledgement batch offsets: first 3, last 2"),
        ([batch(-1, 2, A.ACCEPT)], "Invalid acknowledgement batch offsets: first -1, last 2"),
        ([batch(0, 2, A.ACCEPT), batch(2, 3, A.ACCEPT)], "Acknowledgement batches must be in increasing order"),
        ([batch(3, 4, A.ACCEPT), batch(0, 1, A.ACCEPT)], "Acknowledgement batches must be in increasing order"),
        ([batch(0, 2, A.ACCEPT, A.ACCEPT)], "Acknowledgement batch 0-2 has 2 acknowledge types"),
        ([batch(0, 2)], "Acknowledgement batch 0-2 has 0 acknowledge types"),
        ([batch(0, 1, 5)], "Invalid acknowledge type: [5]"),
        ([batch(0, 1, A.ACCEPT, -1)], "Invalid acknowledge type: [1, -1]"),
        ([batch(10, 12, A.ACCEPT)], "Batch record not found. The first offset in request is past acquired records."),
        ([batch(8, 10, A.ACCEPT)], "Batch record not found. The last offset in request is past acquired records."),
    ],
)
def test_malformed_acknowledgements_are_invalid_requests(batches: list[AcknowledgementBatch], message: str) -> None:
    s = take(fresh(), "m1", 0, 9)
    r = acknowledge(s, "m1", batches, now_ms=0, config=CFG)
    assert isinstance(r, Refused) and r.code is ErrorCode.INVALID_REQUEST
    assert r.message.startswith(message)


def test_acknowledging_what_is_not_acquired_is_invalid_record_state() -> None:
    s = take(fresh(), "m1", 0, 5)
    s = ack(s, "m1", batch(1, 1, A.RELEASE), batch(2, 2, A.ACCEPT), batch(3, 3, A.REJECT)).state
    for offset in (1, 2, 3):  # available, acknowledged, archived
        assert refused(s, "m1", batch(offset, offset, A.ACCEPT)) == Refused(
            ErrorCode.INVALID_RECORD_STATE, "The offset cannot be acknowledged. The offset is not acquired."
        )
    assert refused(s, "m2", batch(4, 5, A.ACCEPT)) == Refused(ErrorCode.INVALID_RECORD_STATE, "Member is not the owner of offset")
    # a double acknowledgement is refused as Kafka refuses it
    s = ack(s, "m1", batch(4, 4, A.ACCEPT)).state
    assert refused(s, "m1", batch(4, 4, A.ACCEPT)).code is ErrorCode.INVALID_RECORD_STATE


def test_an_expired_lock_refuses_its_former_holder() -> None:
    s = take(fresh(), "m1", 0, 4, now=0)
    assert isinstance(acknowledge(s, "m1", [batch(0, 4, A.ACCEPT)], now_ms=999, config=CFG), Acknowledgement)
    assert refused(s, "m1", batch(0, 4, A.ACCEPT), now=1_000) == Refused(
        ErrorCode.INVALID_RECORD_STATE, "The offset cannot be acknowledged. The offset is not acquired."
    )
    # ... and once another member holds them, it is not their owner
    s2 = take(s, "m2", 0, 4, now=1_000)
    assert refused(s2, "m1", batch(0, 4, A.ACCEPT), now=1_000).message == "Member is not the owner of offset"


def test_an_acknowledgement_gives_back_other_expired_locks() -> None:
    s = take(fresh(), "m1", 0, 4, now=0)
    s = take(s, "m2", 5, 9, now=500)
    out = ack(s, "m2", batch(5, 9, A.ACCEPT), now=1_200)
    assert out.released == (OffsetRange(0, 4),)
    assert out.state.in_flight == (avail(0, 4, 1), InFlightRange(5, 9, R.ACKNOWLEDGED, 1))


# --- locks given back ----------------------------------------------------------------------------


def test_expire_releases_and_archives_on_the_last_delivery() -> None:
    s = SharePartitionState(0, 6, (acq(0, 1, 3, "m1", 1_000), acq(2, 3, 1, "m2", 1_000), acq(4, 5, 1, "m1", 2_000)))
    assert expire(s, now_ms=999, config=CFG).state is s
    assert not expire(s, now_ms=999, config=CFG).changed
    out = expire(s, now_ms=1_000, config=CFG)
    assert out.changed
    assert out.archived == (ArchivedRecords(0, 1, 3, ArchiveReason.DELIVERY_COUNT_LIMIT),)
    assert out.released == (OffsetRange(2, 3),)
    assert out.state == SharePartitionState(2, 6, (avail(2, 3, 1), acq(4, 5, 1, "m1", 2_000)))
    assert next_lock_deadline(out.state) == 2_000


def test_a_leaving_member_gives_back_what_it_holds_uncounted() -> None:
    s = SharePartitionState(0, 6, (acq(0, 1, 3, "m1", 5_000), acq(2, 3, 1, "m2", 5_000), acq(4, 5, 1, "m1", 5_000)))
    out = release_member(s, "m1", now_ms=0, config=CFG)
    assert out.archived == ()  # even on its last delivery: that one did not count
    assert out.released == (OffsetRange(0, 1), OffsetRange(4, 5))
    assert out.state == SharePartitionState(0, 6, (avail(0, 1, 2), acq(2, 3, 1, "m2", 5_000), avail(4, 5, 0)))
    out.state.check()
    assert release_member(s, "m3", now_ms=0, config=CFG).state is s
    # expired locks go back as on expiry, counted, its own included
    out = release_member(s, "m1", now_ms=5_000, config=CFG)
    assert out.archived == (ArchivedRecords(0, 1, 3, ArchiveReason.DELIVERY_COUNT_LIMIT),)
    assert out.released == (OffsetRange(2, 5),)
    assert out.state == SharePartitionState(2, 6, (avail(2, 5, 1),))


def test_a_config_below_one_is_refused() -> None:
    for bad in ({"record_lock_duration_ms": 0}, {"delivery_count_limit": 0}, {"max_record_locks": 0}):
        with pytest.raises(ValueError):
            DeliveryConfig(**bad)
    assert DeliveryConfig() == DeliveryConfig(30_000, 5, 2_000)


def test_a_batch_of_500_stays_one_row_through_its_life() -> None:
    cfg = DeliveryConfig()
    s = acquire(fresh(), "m1", 0, 499, now_ms=0, config=cfg, max_records=500).state
    assert len(s.in_flight) == 1
    s = ack(s, "m1", batch(0, 249, A.RELEASE), batch(250, 499, A.ACCEPT)).state
    assert s.in_flight == (avail(0, 249, 1), InFlightRange(250, 499, R.ACKNOWLEDGED, 1))
    s = acquire(s, "m2", 0, 499, now_ms=0, config=cfg, max_records=500).state
    out = acknowledge(s, "m2", [batch(0, 249, A.ACCEPT)], now_ms=1, config=cfg)
    assert isinstance(out, Acknowledgement) and out.state == SharePartitionState(500, 500)


# --- the model -----------------------------------------------------------------------------------


@dataclass
class Rec:
    state: RecordState
    count: int
    member: str | None = None
    deadline: int | None = None


@dataclass
class Reference:
    """The same rules, one offset at a time."""

    limit: int
    locks: int
    lock_ms: int
    start: int = 0
    end: int = 0
    recs: dict[int, Rec] = field(default_factory=dict)

    def give_back(self, o: int, released: set[int], archived: dict[int, ArchiveReason]) -> None:
        r = self.recs[o]
        r.member = r.deadline = None
        if r.count >= self.limit:
            r.state = R.ARCHIVED
            archived[o] = ArchiveReason.DELIVERY_COUNT_LIMIT
        else:
            r.state = R.AVAILABLE
            released.add(o)

    def expire(self, now: int, released: set[int], archived: dict[int, ArchiveReason]) -> None:
        for o, r in self.recs.items():
            if r.state is R.ACQUIRED and r.deadline is not None and now >= r.deadline:
                self.give_back(o, released, archived)

    def settle(self) -> None:
        while self.start < self.end and self.recs[self.start].state.is_final:
            del self.recs[self.start]
            self.start += 1

    def acquire(
        self, member: str, first: int, last: int, now: int, max_records: int, skip: set[int], dur: int | None
    ) -> tuple[list[tuple[int, int]], set[int], dict[int, ArchiveReason]]:
        released: set[int] = set()
        archived: dict[int, ArchiveReason] = {}
        self.expire(now, released, archived)
        deadline = now + (dur or self.lock_ms)
        remaining = max_records
        got: list[tuple[int, int]] = []
        throttle = max(2, -(-self.limit // 2))
        stopped = False
        top = min(last, self.end - 1)
        o = max(first, self.start)
        while o <= top and not stopped:
            r = self.recs[o]
            if r.state is R.AVAILABLE and r.count >= self.limit:
                r.state = R.ARCHIVED
                archived[o] = ArchiveReason.DELIVERY_COUNT_LIMIT
            elif r.state is R.AVAILABLE and remaining > 0:
                d = r.count
                n = 1
                if d >= throttle:
                    stopped = True
                    if got:
                        break
                    run = 0
                    while o + run <= top and self.recs[o + run].state is R.AVAILABLE and self.recs[o + run].count == d:
                        run += 1
                    n = min(remaining, 1 if self.limit > 2 and d == self.limit - 1 else max(1, run >> (d - throttle + 1)))
                for x in range(o, o + n):
                    rx = self.recs[x]
                    rx.state, rx.count, rx.member, rx.deadline = R.ACQUIRED, rx.count + 1, member, deadline
                    got.append((x, rx.count))
                remaining -= n
                o += n
                continue
            o += 1
        o = self.end
        while not stopped and first <= self.end and o <= min(last, self.start + self.locks - 1) and remaining > 0:
            if o in skip:
                self.recs[o] = Rec(R.ARCHIVED, 0)
                archived[o] = ArchiveReason.NOT_DELIVERABLE
            else:
                self.recs[o] = Rec(R.ACQUIRED, 1, member, deadline)
                got.append((o, 1))
                remaining -= 1
            o += 1
        self.end = max(self.end, o)
        self.settle()
        return got, released, archived

    def acknowledge(
        self, member: str, batches: list[AcknowledgementBatch], now: int, dur: int | None
    ) -> tuple[ErrorCode, str] | tuple[dict[int, str], set[int], dict[int, ArchiveReason]]:
        for b in batches:
            if any(t not in AcknowledgeType._value2member_map_ for t in b.acknowledge_types):
                return ErrorCode.INVALID_REQUEST, "type"
        released: set[int] = set()
        archived: dict[int, ArchiveReason] = {}
        trial = {o: Rec(r.state, r.count, r.member, r.deadline) for o, r in self.recs.items()}
        saved, self.recs = self.recs, trial
        self.expire(now, released, archived)
        plan: list[tuple[int, AcknowledgeType]] = []
        for b in batches:
            if b.last_offset < self.start:  # every record of it done: not the member's to acknowledge
                self.recs = saved
                return (
                    ErrorCode.INVALID_RECORD_STATE,
                    "Batch record not found. The request batch offsets are not found in the cache.",
                )
            if b.last_offset >= self.end:
                self.recs = saved
                return ErrorCode.INVALID_REQUEST, "past"
            for o in range(max(b.first_offset, self.start), b.last_offset + 1):
                r = self.recs[o]
                t = b.acknowledge_types[0 if len(b.acknowledge_types) == 1 else o - b.first_offset]
                if r.state is not R.ACQUIRED:
                    self.recs = saved
                    return ErrorCode.INVALID_RECORD_STATE, "The offset cannot be acknowledged. The offset is not acquired."
                if r.member != member:
                    self.recs = saved
                    return ErrorCode.INVALID_RECORD_STATE, "Member is not the owner of offset"
                plan.append((o, AcknowledgeType(t)))
        done: dict[int, str] = {}
        for o, t in plan:
            r = self.recs[o]
            if t is A.ACCEPT:
                r.state, r.member, r.deadline = R.ACKNOWLEDGED, None, None
                done[o] = "accepted"
            elif t is A.RELEASE:
                self.give_back(o, released, archived)
            elif t is A.RENEW:
                r.deadline = now + (dur or self.lock_ms)
                done[o] = "renewed"
            else:
                r.state, r.member, r.deadline = R.ARCHIVED, None, None
                archived[o] = ArchiveReason.REJECTED if t is A.REJECT else ArchiveReason.GAP
        self.settle()
        return done, released, archived


def per_offset(state: SharePartitionState) -> dict[int, Rec]:
    return {
        o: Rec(r.state, r.delivery_count, r.member_id, r.lock_deadline_ms)
        for r in state.in_flight
        for o in range(r.first_offset, r.last_offset + 1)
    }


def offsets(runs: tuple[OffsetRange, ...]) -> set[int]:
    return {o for r in runs for o in range(r.first_offset, r.last_offset + 1)}


def archived_offsets(runs: tuple[ArchivedRecords, ...]) -> dict[int, ArchiveReason]:
    return {o: r.reason for r in runs for o in range(r.first_offset, r.last_offset + 1)}


MEMBERS = ["m1", "m2", "m3"]
TYPES = st.sampled_from([A.ACCEPT, A.ACCEPT, A.RELEASE, A.RELEASE, A.REJECT, A.GAP, A.RENEW])


class ShareDeliveryModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.config = DeliveryConfig(record_lock_duration_ms=100, delivery_count_limit=4, max_record_locks=12)
        self.state = SharePartitionState(0, 0)
        self.ref = Reference(self.config.delivery_count_limit, self.config.max_record_locks, self.config.record_lock_duration_ms)
        self.now = 0
        self.log_start = 0
        self.holders: dict[int, tuple[str, int]] = {}  # offset -> (member, lock deadline), from the outcomes
        self.handed_out: set[int] = set()
        self.fate: dict[int, str] = {}  # offset -> accepted / archived:<reason> / truncated
        self.max_delivery = 0

    # what each outcome says happened, checked against the rules
    def _record_release(self, released: tuple[OffsetRange, ...], archived: tuple[ArchivedRecords, ...]) -> None:
        for o in offsets(released):
            self.holders.pop(o, None)
        for a in archived:
            event(f"archived: {a.reason.value}")
        for o, reason in archived_offsets(archived).items():
            self.holders.pop(o, None)
            assert o not in self.fate, f"offset {o} finished twice"
            self.fate[o] = f"archived:{reason.value}"

    @rule(
        member=st.sampled_from(MEMBERS),
        span=st.integers(0, 15),
        back=st.integers(0, 4),
        max_records=st.integers(0, 8),
        skip=st.sets(st.integers(0, 60), max_size=6),
        dur=st.sampled_from([None, None, 30, 250]),
    )
    def do_acquire(self, member: str, span: int, back: int, max_records: int, skip: set[int], dur: int | None) -> None:
        first = max(self.state.start_offset, next_fetch_offset(self.state, self.now) - back)
        last = first + span
        runs = sorted(skip)
        ranges = [(o, o) for o in runs]
        out = acquire(
            self.state,
            member,
            first,
            last,
            now_ms=self.now,
            config=self.config,
            max_records=max_records,
            not_deliverable=ranges,
            lock_duration_ms=dur,
        )
        got, released, archived = self.ref.acquire(member, first, last, self.now, max_records, skip, dur)
        assert [(o, a.delivery_count) for a in out.acquired for o in range(a.first_offset, a.last_offset + 1)] == got
        assert offsets(out.released) == released and archived_offsets(out.archived) == archived
        assert out.acquired_count <= max_records
        event(
            f"acquire: {'redelivered' if any(a.delivery_count > 1 for a in out.acquired) else 'first' if out.acquired else 'none'}"
        )
        if any(a.delivery_count > throttle_delivery_count(self.config) for a in out.acquired):
            event("acquire: throttled")
        for a, b in zip(out.acquired, out.acquired[1:]):  # runs are maximal
            assert a.last_offset < b.first_offset and not (
                a.last_offset + 1 == b.first_offset and a.delivery_count == b.delivery_count
            )
        self._record_release(out.released, out.archived)
        for o, count in got:
            held = self.holders.get(o)
            assert held is None or held[1] <= self.now, f"offset {o} acquired while {held} holds it"
            assert o not in self.fate
            self.holders[o] = (member, self.now + (dur or self.config.record_lock_duration_ms))
            self.handed_out.add(o)
            self.max_delivery = max(self.max_delivery, count)
        self.state = out.state

    @rule(member=st.sampled_from(MEMBERS), data=st.data(), dur=st.sampled_from([None, 400]))
    def do_acknowledge(self, member: str, data: st.DataObject, dur: int | None) -> None:
        lo = max(0, self.state.start_offset - 3)
        hi = self.state.end_offset + 1
        points = sorted(data.draw(st.sets(st.integers(lo, hi), min_size=1, max_size=6)))
        batches = []
        for i in range(0, len(points), 2):
            a, b = points[i], points[min(i + 1, len(points) - 1)]
            per = data.draw(st.booleans())
            types = tuple(data.draw(st.lists(TYPES, min_size=b - a + 1, max_size=b - a + 1))) if per else (data.draw(TYPES),)
            batches.append(AcknowledgementBatch(a, b, tuple(int(t) for t in types)))
        self._acknowledge(member, batches, dur)

    @rule(data=st.data(), dur=st.sampled_from([None, 400]))
    def holder_acknowledges(self, data: st.DataObject, dur: int | None) -> None:
        """A member acknowledges part of what it was given (its lock may have expired meanwhile)."""
        held = [r for r in self.state.in_flight if r.state is R.ACQUIRED]
        if not held:
            return
        r = data.draw(st.sampled_from(held))
        a = data.draw(st.integers(r.first_offset, r.last_offset))
        b = data.draw(st.integers(a, r.last_offset))
        per = data.draw(st.booleans())
        types = tuple(data.draw(st.lists(TYPES, min_size=b - a + 1, max_size=b - a + 1))) if per else (data.draw(TYPES),)
        assert r.member_id is not None
        self._acknowledge(r.member_id, [AcknowledgementBatch(a, b, tuple(int(t) for t in types))], dur)

    def _acknowledge(self, member: str, batches: list[AcknowledgementBatch], dur: int | None) -> None:
        out = acknowledge(self.state, member, batches, now_ms=self.now, config=self.config, lock_duration_ms=dur)
        expected = self.ref.acknowledge(member, batches, self.now, dur)
        event(f"acknowledge: {out.code.name if isinstance(out, Refused) else 'done'}")
        if isinstance(out, Refused):
            assert isinstance(expected[0], ErrorCode), (out, expected)
            assert out.code is expected[0]
            if out.code is ErrorCode.INVALID_RECORD_STATE:
                assert out.message == expected[1]
            return
        assert not isinstance(expected[0], ErrorCode), (out, expected)
        done, released, archived = expected
        assert offsets(out.accepted) == {o for o, what in done.items() if what == "accepted"}  # type: ignore[union-attr]
        assert offsets(out.renewed) == {o for o, what in done.items() if what == "renewed"}  # type: ignore[union-attr]
        assert offsets(out.released) == released and archived_offsets(out.archived) == archived
        self._record_release(out.released, out.archived)
        for o in offsets(out.accepted):
            assert self.holders.pop(o)[0] == member
            assert o not in self.fate, f"offset {o} accepted twice"
            self.fate[o] = "accepted"
        for o in offsets(out.renewed):
            assert self.holders[o][0] == member
            self.holders[o] = (member, self.now + (dur or self.config.record_lock_duration_ms))
        self.state = out.state

    @rule(ms=st.sampled_from([1, 10, 50, 99, 100, 150, 400]))
    def time_passes(self, ms: int) -> None:
        self.now += ms

    @rule()
    def a_lock_runs_out(self) -> None:
        """Time reaches the earliest lock deadline (a member crashed, or is slow), and the timer fires."""
        deadline = next_lock_deadline(self.state)
        if deadline is not None:
            self.now = max(self.now, deadline)
        self.lock_timer()

    @rule()
    def lock_timer(self) -> None:
        deadline = next_lock_deadline(self.state)
        out = expire(self.state, now_ms=self.now, config=self.config)
        released: set[int] = set()
        archived: dict[int, ArchiveReason] = {}
        self.ref.expire(self.now, released, archived)
        self.ref.settle()
        assert offsets(out.released) == released and archived_offsets(out.archived) == archived
        assert out.changed == (deadline is not None and deadline <= self.now)
        self._record_release(out.released, out.archived)
        self.state = out.state

    @rule(member=st.sampled_from(MEMBERS))
    def member_leaves(self, member: str) -> None:
        out = release_member(self.state, member, now_ms=self.now, config=self.config)
        released: set[int] = set()
        archived: dict[int, ArchiveReason] = {}
        self.ref.expire(self.now, released, archived)
        for o, r in self.ref.recs.items():
            if r.state is R.ACQUIRED and r.member == member:
                r.state, r.count, r.member, r.deadline = R.AVAILABLE, r.count - 1, None, None
                released.add(o)
        self.ref.settle()
        assert offsets(out.released) == released and archived_offsets(out.archived) == archived
        self._record_release(out.released, out.archived)
        assert all(m != member for m, _ in self.holders.values())
        self.state = out.state

    @precondition(lambda self: self.state.end_offset > self.log_start)
    @rule(by=st.integers(1, 5))
    def log_truncated(self, by: int) -> None:
        self.log_start = min(self.log_start + by, self.state.end_offset)
        before = self.state
        self.state = advance_log_start(self.state, self.log_start)
        if self.log_start > before.start_offset:
            for o in range(before.start_offset, self.log_start):
                self.ref.recs.pop(o, None)
                self.holders.pop(o, None)
                if o in self.handed_out and o not in self.fate:
                    self.fate[o] = "truncated"
            self.ref.start = self.log_start
            self.ref.end = max(self.ref.end, self.log_start)
            self.ref.settle()

    def teardown(self) -> None:
        self.state.check()

    @invariant()
    def ranges_equal_the_reference(self) -> None:
        self.state.check()
        assert (self.state.start_offset, self.state.end_offset) == (self.ref.start, self.ref.end)
        assert per_offset(self.state) == self.ref.recs

    @invariant()
    def start_offset_moves_forward_past_final_records_only(self) -> None:
        previous = getattr(self, "_previous", None)
        if previous is not None:
            (prev_state,) = previous
            assert self.state.start_offset >= prev_state.start_offset
            for o in range(prev_state.start_offset, self.state.start_offset):
                assert o in self.fate or o < self.log_start, f"the start offset passed {o}, neither done nor truncated"
        self._previous = (self.state,)

    @invariant()
    def nothing_is_lost(self) -> None:
        for o in self.handed_out:
            assert o >= self.state.start_offset or o in self.fate, f"offset {o} was handed out and lost"
        for o, fate in self.fate.items():
            if fate != "truncated":
                r = self.state.record(o)
                assert r is None or r.state.is_final, (o, fate, r)

    @invariant()
    def one_holder_per_offset_and_within_the_limits(self) -> None:
        for r in self.state.in_flight:
            assert r.delivery_count <= self.config.delivery_count_limit
            if r.state is R.ACQUIRED:
                for o in range(r.first_offset, r.last_offset + 1):
                    assert self.holders.get(o) == (r.member_id, r.lock_deadline_ms)
        held = {o for r in self.state.in_flight if r.state is R.ACQUIRED for o in range(r.first_offset, r.last_offset + 1)}
        assert set(self.holders) == held
        assert self.max_delivery <= self.config.delivery_count_limit
        assert self.state.end_offset - self.state.start_offset <= self.config.max_record_locks


ShareDeliveryModel.TestCase.settings = settings(
    max_examples=200, stateful_step_count=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestShareDeliveryModel = ShareDeliveryModel.TestCase
