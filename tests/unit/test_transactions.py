"""The transaction coordinator's state machine as data (app.domain.transactions): every transition
against VALID_PREVIOUS, the events and their fold, epochs, and the checks of a client's producer id
and epoch (including retried EndTxn, transactions V2)."""

from __future__ import annotations

import itertools

import pytest

from app.domain import transactions as txn
from app.domain.producer_state import MAX_EPOCH
from app.domain.transactions import VALID_PREVIOUS, TxnEvent, TxnMetadata, TxnState
from app.errors import ErrorCode, TxlogError

S = TxnState
T0 = 1_700_000_000_000
TID = "orders-writer"
PID = 1000


def error_of(fn, *args, **kwargs) -> TxlogError:  # type: ignore[no-untyped-def]
    with pytest.raises(TxlogError) as info:
        fn(*args, **kwargs)
    return info.value


class History:
    """A transactional id driven through the pure functions, keeping every event (as storage does)."""

    def __init__(self, timeout_ms: int = 60_000, pid: int = PID) -> None:
        self.now = T0
        self.events: list[TxnEvent] = []
        self.meta: TxnMetadata = self.step(txn.created(TID, pid, timeout_ms, self.now))

    def step(self, event: TxnEvent | None) -> TxnMetadata:
        assert event is not None
        self.meta = txn.apply(self.meta if self.events else None, event)
        self.events.append(event)
        return self.meta

    def tick(self, ms: int = 10) -> int:
        self.now += ms
        return self.now

    def add(self, *parts: tuple[str, int], groups: tuple[str, ...] = ()) -> TxnMetadata:
        return self.step(txn.partitions_added(self.meta, parts, self.tick(), groups))

    def prepare(self, result: txn.Result, reason: txn.FenceReason | None = None) -> TxnMetadata:
        return self.step(txn.prepared(self.meta, result, self.tick(), reason))

    def complete(self, new_pid: int | None = None) -> TxnMetadata:
        return self.step(txn.completed(self.meta, self.tick(), new_pid))

    def end(self, result: txn.Result, reason: txn.FenceReason | None = None) -> TxnMetadata:
        self.prepare(result, reason)
        return self.complete()

    def reinit(self, timeout_ms: int | None = None, new_pid: int | None = None) -> TxnMetadata:
        return self.step(txn.reinitialized(self.meta, timeout_ms or self.meta.timeout_ms, self.tick(), new_pid))


# --- the table of transitions ----------------------------------------------------------------------

ALL_FROM: list[TxnState | None] = [None, *S]


@pytest.mark.parametrize(("from_state", "to_state"), list(itertools.product(ALL_FROM, list(S))))
def test_every_pair_is_allowed_exactly_when_the_table_says(from_state, to_state):
    if from_state in VALID_PREVIOUS[to_state]:
        txn.check_transition(from_state, to_state)
    else:
        err = error_of(txn.check_transition, from_state, to_state)
        assert err.code is ErrorCode.INVALID_TXN_STATE
        assert to_state.value in err.message
        assert (from_state.value if from_state else "(none)") in err.message


def test_the_table_as_kafka_draws_it():
    ended = {S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}
    assert VALID_PREVIOUS[S.EMPTY] == {None, *ended}
    assert VALID_PREVIOUS[S.ONGOING] == {S.ONGOING, *ended}
    assert VALID_PREVIOUS[S.PREPARE_COMMIT] == {S.ONGOING, *ended}
    assert VALID_PREVIOUS[S.PREPARE_ABORT] == {S.ONGOING, *ended}
    assert VALID_PREVIOUS[S.COMPLETE_COMMIT] == {S.PREPARE_COMMIT}
    assert VALID_PREVIOUS[S.COMPLETE_ABORT] == {S.PREPARE_ABORT}
    assert VALID_PREVIOUS[S.DEAD] == ended
    assert set(VALID_PREVIOUS) == set(S)


def test_state_properties():
    assert {s for s in S if s.is_open} == {S.ONGOING, S.PREPARE_COMMIT, S.PREPARE_ABORT}
    assert {s for s in S if s.is_prepared} == {S.PREPARE_COMMIT, S.PREPARE_ABORT}
    assert {s for s in S if s.expiration_allowed} == {S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}
    assert [s.value for s in S] == [
        "Empty",
        "Ongoing",
        "PrepareCommit",
        "PrepareAbort",
        "CompleteCommit",
        "CompleteAbort",
        "Dead",
    ]


@pytest.mark.parametrize(
    "result, prepared, complete", [("commit", S.PREPARE_COMMIT, S.COMPLETE_COMMIT), ("abort", S.PREPARE_ABORT, S.COMPLETE_ABORT)]
)
def test_a_result_names_its_prepare_and_complete_states_and_back(result, prepared, complete):
    assert txn.prepare_state(result) is prepared and txn.complete_state(result) is complete
    assert txn.prepared_result(prepared) == result


# --- created / reinitialized -------------------------------------------------------------------------


def test_created_is_empty_at_epoch_zero():
    h = History(timeout_ms=5000)
    assert h.meta == TxnMetadata(
        transactional_id=TID,
        producer_id=PID,
        producer_epoch=0,
        state=S.EMPTY,
        timeout_ms=5000,
        version=1,
        updated_at_ms=T0,
        epoch_changed_at_ms=T0,
    )
    assert h.events[0].from_state is None and h.events[0].version == 1


def test_reinitialized_raises_the_epoch_and_fences_with_newer_epoch():
    h = History()
    meta = h.reinit(timeout_ms=9000)
    assert (meta.state, meta.producer_id, meta.producer_epoch, meta.timeout_ms) == (S.EMPTY, PID, 1, 9000)
    assert meta.fence_reason == "newer_epoch"
    assert meta.epoch_changed_at_ms == h.now
    assert (meta.last_producer_id, meta.last_producer_epoch, meta.last_result) == (None, None, None)


def test_reinitialized_after_a_completed_transaction_forgets_the_last_transaction():
    h = History()
    h.add(("t", 0))
    h.end("commit")
    assert h.meta.last_result == "commit"
    meta = h.reinit()
    assert (meta.producer_epoch, meta.last_result, meta.last_producer_epoch, meta.partitions) == (2, None, None, ())
    assert not txn.is_retry_of_last_end(meta, PID, 0)


def test_reinitialized_after_ending_the_open_transaction_keeps_the_epoch_that_ending_moved_to():
    h = History()
    h.add(("t", 0))
    h.end("abort", reason="newer_epoch")  # the fencing abort moved the epoch from 0 to 1
    meta = h.step(txn.reinitialized(h.meta, h.meta.timeout_ms, h.tick(), ended_open=True))
    assert (meta.state, meta.producer_id, meta.producer_epoch) == (S.EMPTY, PID, 1)
    assert (meta.last_producer_epoch, meta.last_result, meta.partitions) == (None, None, ())
    assert not txn.is_retry_of_last_end(meta, PID, 0)


def test_reinitialized_is_refused_while_a_transaction_is_open():
    h = History()
    h.add(("t", 0))
    assert error_of(txn.reinitialized, h.meta, 1000, h.tick()).code is ErrorCode.INVALID_TXN_STATE
    h.prepare("commit")
    assert error_of(txn.reinitialized, h.meta, 1000, h.tick()).code is ErrorCode.INVALID_TXN_STATE


# --- partitions_added ------------------------------------------------------------------------------------


def test_partitions_added_starts_the_transaction_and_accumulates():
    h = History()
    meta = h.add(("b", 1), ("a", 0))
    assert (meta.state, meta.partitions, meta.started_at_ms) == (S.ONGOING, (("a", 0), ("b", 1)), h.now)
    started = h.now
    meta = h.add(("a", 0), ("c", 2), groups=("g",))
    assert meta.partitions == (("a", 0), ("b", 1), ("c", 2))
    assert meta.groups == ("g",)
    assert meta.started_at_ms == started
    assert h.events[-1].partitions_added == (("c", 2),)
    assert h.events[-1].groups_added == ("g",)


def test_partitions_added_with_nothing_new_is_no_event():
    h = History()
    h.add(("a", 0), groups=("g",))
    assert txn.partitions_added(h.meta, [("a", 0)], h.tick(), ["g"]) is None


def test_partitions_added_after_an_ended_transaction_starts_afresh():
    h = History()
    h.add(("a", 0), groups=("g",))
    h.end("commit")
    assert h.meta.partitions == (("a", 0),)  # the ended transaction stays visible
    meta = h.add(("a", 0))
    assert (meta.state, meta.partitions, meta.groups, meta.started_at_ms) == (S.ONGOING, (("a", 0),), (), h.now)
    assert h.events[-1].partitions_added == (("a", 0),)


@pytest.mark.parametrize("result", ["commit", "abort"])
def test_partitions_added_while_prepared_is_concurrent_transactions(result):
    h = History()
    h.add(("a", 0))
    h.prepare(result)
    err = error_of(txn.partitions_added, h.meta, [("b", 0)], h.tick())
    assert err.code is ErrorCode.CONCURRENT_TRANSACTIONS
    assert err.code.retriable
    assert error_of(txn.partitions_added, h.meta, [("a", 0)], h.tick()).code is ErrorCode.CONCURRENT_TRANSACTIONS


def test_partitions_added_to_a_dead_id_is_invalid():
    h = History()
    h.step(txn.expired(h.meta, h.tick()))
    assert error_of(txn.partitions_added, h.meta, [("a", 0)], h.tick()).code is ErrorCode.INVALID_TXN_STATE


# --- prepared / completed -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("result", "prepared", "complete"),
    [("commit", S.PREPARE_COMMIT, S.COMPLETE_COMMIT), ("abort", S.PREPARE_ABORT, S.COMPLETE_ABORT)],
)
def test_end_prepares_then_completes_with_the_next_epoch(result, prepared, complete):
    h = History()
    h.add(("a", 0), ("b", 0), groups=("g",))
    meta = h.prepare(result)
    assert (meta.state, meta.producer_epoch, meta.fence_reason) == (prepared, 0, None)
    assert meta.partitions == (("a", 0), ("b", 0)) and meta.groups == ("g",)
    meta = h.complete()
    assert meta.state is complete
    assert (meta.producer_id, meta.producer_epoch) == (PID, 1)
    assert (meta.last_producer_id, meta.last_producer_epoch, meta.last_result) == (PID, 0, result)
    assert meta.partitions == (("a", 0), ("b", 0))
    assert h.events[-1].result == result


def test_prepared_records_why_the_server_ended_it():
    h = History()
    h.add(("a", 0))
    meta = h.end("abort", reason="timed_out")
    assert meta.fence_reason == "timed_out"
    assert h.events[-2].reason == "timed_out" and h.events[-1].reason == "timed_out"


def test_a_producers_own_end_clears_an_older_fence_reason():
    h = History()
    h.reinit()
    assert h.meta.fence_reason == "newer_epoch"
    h.add(("a", 0))
    assert h.meta.fence_reason == "newer_epoch"
    assert h.end("commit").fence_reason is None


@pytest.mark.parametrize("state_after", ["empty", "commit", "abort"])
@pytest.mark.parametrize("result", ["commit", "abort"])
def test_an_empty_transaction_may_end_and_has_no_partitions(state_after, result):
    """Transactions V2: EndTxn with nothing in the transaction. The previous transaction's partitions
    and groups are not this one's: no marker may be written there."""
    h = History()
    if state_after != "empty":
        h.add(("a", 0), groups=("g",))
        h.end(state_after)  # type: ignore[arg-type]
    epoch = h.meta.producer_epoch
    meta = h.prepare(result)
    assert meta.state is (S.PREPARE_COMMIT if result == "commit" else S.PREPARE_ABORT)
    assert (meta.partitions, meta.groups) == ((), ())
    meta = h.complete()
    assert (meta.partitions, meta.groups) == ((), ())
    assert (meta.producer_epoch, meta.last_producer_epoch, meta.last_result) == (epoch + 1, epoch, result)


def test_completed_from_a_non_prepared_state_is_invalid():
    h = History()
    assert error_of(txn.completed, h.meta, h.tick()).code is ErrorCode.INVALID_TXN_STATE
    h.add(("a", 0))
    assert error_of(txn.completed, h.meta, h.tick()).code is ErrorCode.INVALID_TXN_STATE


@pytest.mark.parametrize("result", ["commit", "abort"])
def test_prepared_twice_is_invalid(result):
    h = History()
    h.add(("a", 0))
    h.prepare(result)
    for again in ("commit", "abort"):
        assert error_of(txn.prepared, h.meta, again, h.tick()).code is ErrorCode.INVALID_TXN_STATE


# --- epochs ------------------------------------------------------------------------------------------


def test_epoch_exhaustion_needs_a_new_producer_id():
    assert not txn.needs_new_producer_id(MAX_EPOCH - 1)
    assert txn.needs_new_producer_id(MAX_EPOCH)
    assert txn.bumped(PID, MAX_EPOCH - 1, None) == (PID, MAX_EPOCH)
    assert txn.bumped(PID, MAX_EPOCH, 2000) == (2000, 0)
    assert txn.bumped(PID, 3, 2000) == (PID, 4)  # an offered id is ignored while the epoch lasts
    with pytest.raises(ValueError):
        txn.bumped(PID, MAX_EPOCH, None)


def test_completing_at_the_last_epoch_moves_to_a_new_producer_id():
    h = History()
    h.meta = TxnMetadata(**{**h.meta.__dict__, "producer_epoch": MAX_EPOCH})
    h.add(("a", 0))
    h.prepare("commit")
    with pytest.raises(ValueError):
        txn.completed(h.meta, h.tick())
    meta = h.complete(new_pid=2000)
    assert (meta.producer_id, meta.producer_epoch) == (2000, 0)
    assert (meta.last_producer_id, meta.last_producer_epoch) == (PID, MAX_EPOCH)
    assert meta.epoch_changed_at_ms == h.now
    # the old producer id is still recognised for its retry, and fenced otherwise
    txn.check_end_retry(meta, "commit")
    assert txn.is_retry_of_last_end(meta, PID, MAX_EPOCH)
    txn.check_producer(meta, 2000, 0)
    assert error_of(txn.check_producer, meta, PID, MAX_EPOCH).code is ErrorCode.PRODUCER_FENCED


def test_reinitialized_at_the_last_epoch_moves_to_a_new_producer_id():
    h = History()
    h.meta = TxnMetadata(**{**h.meta.__dict__, "producer_epoch": MAX_EPOCH})
    meta = h.reinit(new_pid=3000)
    assert (meta.producer_id, meta.producer_epoch, meta.state) == (3000, 0, S.EMPTY)


# --- expired -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("ended_by", ["empty", "commit", "abort"])
def test_expired_from_an_ended_state_is_dead(ended_by):
    h = History()
    if ended_by != "empty":
        h.add(("a", 0))
        h.end(ended_by)  # type: ignore[arg-type]
    meta = h.step(txn.expired(h.meta, h.tick()))
    assert (meta.state, meta.fence_reason) == (S.DEAD, "expired")


@pytest.mark.parametrize("result", [None, "commit", "abort"])
def test_expired_while_open_is_invalid(result):
    h = History()
    h.add(("a", 0))
    if result:
        h.prepare(result)
    assert error_of(txn.expired, h.meta, h.tick()).code is ErrorCode.INVALID_TXN_STATE


def test_timeouts_and_deadlines():
    h = History(timeout_ms=1000)
    assert not txn.is_timed_out(h.meta, T0 + 10**9)
    assert txn.deadline_ms(h.meta) is None
    h.add(("a", 0))
    start = h.meta.started_at_ms
    assert txn.deadline_ms(h.meta) == start + 1000
    assert not txn.is_timed_out(h.meta, start + 1000)
    assert txn.is_timed_out(h.meta, start + 1001)
    h.add(("b", 0))  # adding partitions does not restart the clock
    assert txn.deadline_ms(h.meta) == start + 1000
    h.prepare("commit")
    assert not txn.is_timed_out(h.meta, start + 10**6)
    assert txn.deadline_ms(h.meta) is None


# --- apply / replay ------------------------------------------------------------------------------------


def rich_history() -> History:
    h = History(timeout_ms=2000)
    h.add(("a", 0))
    h.add(("b", 1), groups=("g1",))
    h.end("commit")
    h.add(("a", 0))
    h.end("abort")
    h.prepare("commit")  # an empty transaction
    h.complete()
    h.reinit(timeout_ms=3000)
    h.add(("c", 0))
    h.end("abort", reason="timed_out")
    h.add(("a", 1))
    h.end("abort", reason="aborted_by_operator")
    h.step(txn.expired(h.meta, h.tick()))
    return h


def test_replay_of_the_events_is_the_current_state():
    h = rich_history()
    assert txn.replay(h.events) == h.meta
    assert [e.version for e in h.events] == list(range(1, len(h.events) + 1))
    for i in range(1, len(h.events) + 1):
        prefix = txn.replay(h.events[:i])
        assert prefix is not None and prefix.version == i


def test_replay_of_nothing_is_none():
    assert txn.replay([]) is None


def test_each_event_records_its_from_state():
    h = rich_history()
    states: list[TxnState | None] = [None] + [e.to_state for e in h.events[:-1]]
    assert [e.from_state for e in h.events] == states


def test_apply_refuses_a_version_gap_or_repeat():
    h = History()
    event = txn.partitions_added(h.meta, [("a", 0)], h.tick())
    assert event is not None
    with pytest.raises(ValueError):
        txn.apply(h.meta, TxnEvent(**{**event.__dict__, "version": 3}))
    with pytest.raises(ValueError):
        txn.apply(h.meta, TxnEvent(**{**event.__dict__, "version": 1}))


def test_apply_refuses_an_invalid_transition():
    h = History()
    bad = TxnEvent(TID, 2, S.EMPTY, S.COMPLETE_COMMIT, PID, 0, 1000, h.tick())
    assert error_of(txn.apply, h.meta, bad).code is ErrorCode.INVALID_TXN_STATE
    first = TxnEvent(TID, 1, None, S.ONGOING, PID, 0, 1000, h.tick())
    assert error_of(txn.apply, None, first).code is ErrorCode.INVALID_TXN_STATE


def test_epoch_changed_at_moves_only_with_the_epoch():
    h = History()
    h.tick(100)
    h.add(("a", 0))
    assert h.meta.epoch_changed_at_ms == T0
    h.prepare("commit")
    assert h.meta.epoch_changed_at_ms == T0
    h.complete()
    assert h.meta.epoch_changed_at_ms == h.now


# --- check_producer ------------------------------------------------------------------------------------


def test_check_producer_accepts_the_current_id_and_epoch():
    h = History()
    txn.check_producer(h.meta, PID, 0)
    h.add(("a", 0))
    txn.check_producer(h.meta, PID, 0)


def test_check_producer_refuses_another_producer_id():
    h = History()
    err = error_of(txn.check_producer, h.meta, PID + 1, 0)
    assert err.code is ErrorCode.INVALID_PRODUCER_ID_MAPPING
    assert TID in err.message


def test_check_producer_refuses_a_future_epoch():
    h = History()
    err = error_of(txn.check_producer, h.meta, PID, 1)
    assert err.code is ErrorCode.INVALID_PRODUCER_EPOCH


def test_check_producer_fences_an_old_epoch_after_reinit():
    h = History()
    h.reinit()
    err = error_of(txn.check_producer, h.meta, PID, 0)
    assert err.code is ErrorCode.PRODUCER_FENCED
    assert err.details["reason"] == "newer_epoch"
    assert err.details["current_epoch"] == 1
    assert "current epoch is 1" in err.message and "changed 2023-11-14T22:13:20.010+00:00" in err.message


@pytest.mark.parametrize("reason", ["timed_out", "aborted_by_operator", "newer_epoch"])
def test_check_producer_names_why_the_previous_epoch_was_superseded(reason):
    h = History()
    h.add(("a", 0))
    h.end("abort", reason=reason)
    err = error_of(txn.check_producer, h.meta, PID, 0)
    assert (err.code, err.details["reason"]) == (ErrorCode.PRODUCER_FENCED, reason)
    # the next transaction starts: the superseded epoch still learns why
    h.add(("a", 0))
    assert error_of(txn.check_producer, h.meta, PID, 0).details["reason"] == reason


def test_an_older_epoch_than_the_last_one_is_fenced_as_newer_epoch():
    h = History()
    h.add(("a", 0))
    h.end("commit")
    h.add(("a", 0))
    h.end("abort", reason="timed_out")
    err = error_of(txn.check_producer, h.meta, PID, 0)
    assert err.details["reason"] == "newer_epoch"
    assert error_of(txn.check_producer, h.meta, PID, 1).details["reason"] == "timed_out"


def test_check_producer_on_a_dead_id_is_fenced_as_expired():
    h = History()
    h.step(txn.expired(h.meta, h.tick()))
    for epoch in (0, 1, 5):
        err = error_of(txn.check_producer, h.meta, PID, epoch)
        assert (err.code, err.details["reason"]) == (ErrorCode.PRODUCER_FENCED, "expired")


# --- retried EndTxn -----------------------------------------------------------------------------------


@pytest.mark.parametrize("result", ["commit", "abort"])
def test_a_repeated_end_is_a_retry_with_the_same_outcome(result):
    h = History()
    h.add(("a", 0))
    h.end(result)
    assert txn.is_retry_of_last_end(h.meta, PID, 0)
    assert not txn.is_retry_of_last_end(h.meta, PID, 1)
    assert not txn.is_retry_of_last_end(h.meta, PID + 1, 0)
    txn.check_end_retry(h.meta, result)


@pytest.mark.parametrize(("taken", "asked"), [("commit", "abort"), ("abort", "commit")])
def test_a_contradicting_end_is_invalid_txn_state(taken, asked):
    h = History()
    h.add(("a", 0))
    h.end(taken)
    err = error_of(txn.check_end_retry, h.meta, asked)
    assert err.code is ErrorCode.INVALID_TXN_STATE
    assert taken in err.message


def test_the_retry_is_recognised_while_the_next_transaction_is_open():
    h = History()
    h.add(("a", 0))
    h.end("commit")
    h.add(("b", 0))
    assert h.meta.state is S.ONGOING
    assert txn.is_retry_of_last_end(h.meta, PID, 0)
    txn.check_end_retry(h.meta, "commit")
    assert error_of(txn.check_end_retry, h.meta, "abort").code is ErrorCode.INVALID_TXN_STATE


@pytest.mark.parametrize("reason", ["timed_out", "aborted_by_operator", "newer_epoch"])
@pytest.mark.parametrize("asked", ["commit", "abort"])
def test_an_end_of_a_transaction_the_server_ended_is_fenced_with_the_reason(reason, asked):
    h = History()
    h.add(("a", 0))
    h.end("abort", reason=reason)
    assert txn.is_retry_of_last_end(h.meta, PID, 0)
    err = error_of(txn.check_end_retry, h.meta, asked)
    assert (err.code, err.details["reason"]) == (ErrorCode.PRODUCER_FENCED, reason)
    assert err.details["current_epoch"] == 1


def test_a_dead_ids_last_end_is_fenced_as_expired():
    h = History()
    h.add(("a", 0))
    h.end("commit")
    h.step(txn.expired(h.meta, h.tick()))
    assert txn.is_retry_of_last_end(h.meta, PID, 0)
    err = error_of(txn.check_end_retry, h.meta, "commit")
    assert err.details["reason"] == "expired"


# --- fenced_error ------------------------------------------------------------------------------------


def test_fenced_error_carries_the_reason_the_epoch_and_when():
    h = History()
    h.reinit()
    err = txn.fenced_error(h.meta, 0, "aborted_by_operator")
    assert err.code is ErrorCode.PRODUCER_FENCED
    assert err.details == {"reason": "aborted_by_operator", "current_epoch": 1}
    assert "Producer epoch 0 is fenced" in err.message
    assert "reason: aborted_by_operator" in err.message
    assert err.to_dict()["retriable"] is False


def test_fenced_error_names_the_producers_own_end_for_the_epoch_it_ended_and_newer_epoch_before():
    h = History()
    h.add(("a", 0))
    h.end("commit")
    assert txn.fenced_error(h.meta, 0).details["reason"] == "transaction_ended"
    h.add(("a", 0))
    h.end("abort")
    assert txn.fenced_error(h.meta, 1).details["reason"] == "transaction_ended"
    assert txn.fenced_error(h.meta, 0).details["reason"] == "newer_epoch"
    h.reinit()
    assert txn.fenced_error(h.meta, 2).details["reason"] == "newer_epoch"


# --- a batch of a transactional id's producer id, wherever it is appended ------------------------


def test_only_the_current_producer_id_and_epoch_of_a_transactional_id_write_batches():
    h = History()
    txn.check_batch_producer(TID, h.meta, None, PID, 0)
    h.add(("a", 0))
    h.end("commit")  # the epoch moves on to 1
    txn.check_batch_producer(TID, h.meta, None, PID, 1)
    err = error_of(txn.check_batch_producer, TID, h.meta, None, PID, 0)
    assert (err.code, err.details["reason"]) == (ErrorCode.PRODUCER_FENCED, "transaction_ended")
    assert error_of(txn.check_batch_producer, TID, h.meta, None, PID, 2).code is ErrorCode.INVALID_PRODUCER_EPOCH
    h.add(("a", 0))
    h.prepare("abort", "timed_out")
    h.complete()
    assert error_of(txn.check_batch_producer, TID, h.meta, None, PID, 1).details["reason"] == "timed_out"


def test_a_retired_or_expired_producer_id_is_fenced_at_every_epoch():
    h = History()
    err = error_of(txn.check_batch_producer, TID, h.meta, "newer_epoch", PID, 0)
    assert err.code is ErrorCode.PRODUCER_FENCED and f"now uses producer id {PID}" in err.message
    assert error_of(txn.check_batch_producer, TID, None, None, PID, 5).details["reason"] == "expired"
    h.step(txn.expired(h.meta, h.tick()))
    assert error_of(txn.check_batch_producer, TID, h.meta, None, PID, 0).details["reason"] == "expired"
    assert error_of(txn.check_batch_producer, TID, h.meta, None, PID + 1, 0).details["reason"] == "expired"
