"""Idempotence rules without a database (app.domain.producer_state): check_append, after_append and
after_marker, branch by branch, as Kafka's ProducerAppendInfo / ProducerStateEntry."""

from __future__ import annotations

import pytest
from sqlalchemy import SmallInteger

from app.domain.producer_state import (
    MAX_EPOCH,
    MAX_SEQUENCE,
    NUM_BATCHES_TO_RETAIN,
    Append,
    BatchMetadata,
    Duplicate,
    ProducerStateEntry,
    after_append,
    after_marker,
    check_append,
    increment_sequence,
)
from app.errors import ErrorCode, TxlogError
from app.storage import tables

PID = 4242


def refused(entry, epoch, seq, count=1, pid=PID) -> TxlogError:  # type: ignore[no-untyped-def]
    with pytest.raises(TxlogError) as info:
        check_append(entry, pid, epoch, seq, count)
    return info.value


def appended(entry, epoch, seq, count, first_offset, ts=0, transactional=False):  # type: ignore[no-untyped-def]
    """Run one batch through check + apply, as produce does; returns the new entry."""
    decision = check_append(entry, PID, epoch, seq, count)
    assert isinstance(decision, Append)
    return after_append(entry, PID, epoch, decision, first_offset, first_offset + count - 1, ts, transactional)


def history(batches: int, epoch: int = 0, size: int = 1) -> ProducerStateEntry:
    """``batches`` batches of ``size`` records each from sequence 0, at offsets 100, 100+size, ..."""
    entry = None
    for i in range(batches):
        entry = appended(entry, epoch, i * size, size, 100 + i * size, ts=i)
    assert entry is not None
    return entry


# --- sequence arithmetic ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seq", "inc", "expected"),
    [(0, 1, 1), (5, 0, 5), (MAX_SEQUENCE, 1, 0), (MAX_SEQUENCE - 1, 3, 1), (MAX_SEQUENCE, 0, MAX_SEQUENCE)],
)
def test_increment_sequence_wraps_after_max(seq, inc, expected):
    assert increment_sequence(seq, inc) == expected


# --- first batch -----------------------------------------------------------------------------------


def test_first_batch_of_an_unknown_producer_starts_at_zero():
    assert check_append(None, PID, 0, 0, 3) == Append(0, 2)


@pytest.mark.parametrize("seq", [1, 7, MAX_SEQUENCE])
def test_first_batch_with_another_sequence_is_unknown_producer_id(seq):
    err = refused(None, 0, seq)
    assert err.code is ErrorCode.UNKNOWN_PRODUCER_ID
    assert str(PID) in err.message and str(seq) in err.message


def test_unknown_producer_at_any_epoch_may_start_at_zero():
    assert check_append(None, PID, 17, 0, 1) == Append(0, 0)


@pytest.mark.parametrize("count", [0, -1])
def test_empty_batch_is_invalid_record(count):
    assert refused(None, 0, 0, count).code is ErrorCode.INVALID_RECORD


# --- next batch, duplicates, gaps and rewinds ----------------------------------------------------


def test_next_batch_follows_the_last_sequence():
    entry = history(1, size=3)  # sequences 0..2
    assert check_append(entry, PID, 0, 3, 2) == Append(3, 4)


@pytest.mark.parametrize("seq", [4, 5, 100])
def test_a_gap_is_out_of_order(seq):
    entry = history(1, size=3)
    err = refused(entry, 0, seq)
    assert err.code is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert "expected 3" in err.message


@pytest.mark.parametrize(("seq", "count"), [(0, 1), (1, 2), (2, 1), (0, 2)])
def test_a_rewind_that_is_not_an_exact_batch_is_out_of_order(seq, count):
    entry = history(1, size=3)  # one batch (0, 2)
    assert refused(entry, 0, seq, count).code is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_each_of_the_last_five_batches_is_recognised_as_a_duplicate():
    entry = history(NUM_BATCHES_TO_RETAIN, size=2)
    for i in range(NUM_BATCHES_TO_RETAIN):
        decision = check_append(entry, PID, 0, i * 2, 2)
        assert decision == Duplicate(BatchMetadata(i * 2, i * 2 + 1, 100 + i * 2, 101 + i * 2, i))


def test_the_sixth_oldest_batch_is_forgotten_and_so_out_of_order():
    entry = history(NUM_BATCHES_TO_RETAIN + 1)
    assert len(entry.batches) == NUM_BATCHES_TO_RETAIN
    assert [b.first_seq for b in entry.batches] == [1, 2, 3, 4, 5]
    err = refused(entry, 0, 0)
    assert err.code is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert "expected 6" in err.message
    assert isinstance(check_append(entry, PID, 0, 1, 1), Duplicate)


def test_a_duplicate_must_match_first_and_last_sequence():
    entry = history(1, size=3)  # (0, 2)
    assert isinstance(check_append(entry, PID, 0, 0, 3), Duplicate)
    assert refused(entry, 0, 0, 4).code is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_same_epoch_without_batches_expects_sequence_zero():
    entry = ProducerStateEntry(PID, 3)
    assert check_append(entry, PID, 3, 0, 1) == Append(0, 0)
    assert refused(entry, 3, 1).code is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


# --- epochs --------------------------------------------------------------------------------------


@pytest.mark.parametrize("seq", [0, 1, 3])
def test_a_lower_epoch_is_fenced_whatever_the_sequence(seq):
    entry = history(1, epoch=5, size=3)
    err = refused(entry, 4, seq)
    assert err.code is ErrorCode.PRODUCER_FENCED
    assert err.details["reason"] == "newer_epoch"
    assert err.details["current_epoch"] == 5
    assert "epoch 4" in err.message and "current epoch is 5" in err.message


def test_a_lower_epoch_is_fenced_even_for_a_would_be_duplicate():
    entry = history(1, epoch=5)
    assert refused(entry, 0, 0).code is ErrorCode.PRODUCER_FENCED


def test_a_higher_epoch_must_start_at_zero():
    entry = history(3, epoch=2)
    assert check_append(entry, PID, 3, 0, 4) == Append(0, 3)
    err = refused(entry, 3, 3)
    assert err.code is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert "expected 0" in err.message


def test_a_higher_epoch_never_matches_the_old_epochs_batches():
    entry = history(1, epoch=2, size=2)  # (0, 1) at epoch 2
    assert check_append(entry, PID, 3, 0, 2) == Append(0, 1)


def test_a_new_epoch_clears_the_remembered_batches():
    entry = history(4, epoch=0)
    entry = appended(entry, 1, 0, 2, 500, ts=99)
    assert entry.producer_epoch == 1
    assert entry.batches == (BatchMetadata(0, 1, 500, 501, 99),)
    assert check_append(entry, PID, 1, 2, 1) == Append(2, 2)
    assert refused(entry, 0, 4).code is ErrorCode.PRODUCER_FENCED


# --- sequence wrap -----------------------------------------------------------------------------------


def test_a_batch_may_straddle_the_wrap():
    entry = ProducerStateEntry(PID, 0, (BatchMetadata(MAX_SEQUENCE - 5, MAX_SEQUENCE - 2, 10, 13, 0),))
    assert check_append(entry, PID, 0, MAX_SEQUENCE - 1, 4) == Append(MAX_SEQUENCE - 1, 1)


def test_after_the_max_sequence_the_next_batch_is_zero():
    entry = ProducerStateEntry(PID, 0, (BatchMetadata(MAX_SEQUENCE - 1, MAX_SEQUENCE, 10, 11, 0),))
    assert check_append(entry, PID, 0, 0, 2) == Append(0, 1)
    assert refused(entry, 0, MAX_SEQUENCE).code is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    err = refused(entry, 0, 1)
    assert err.code is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert "expected 0" in err.message


def test_a_wrapped_batch_is_recognised_as_a_duplicate():
    entry = ProducerStateEntry(PID, 0, (BatchMetadata(MAX_SEQUENCE - 5, MAX_SEQUENCE - 2, 10, 13, 0),))
    entry = appended(entry, 0, MAX_SEQUENCE - 1, 4, 14, ts=5)
    assert entry.batches[-1] == BatchMetadata(MAX_SEQUENCE - 1, 1, 14, 17, 5)
    assert check_append(entry, PID, 0, MAX_SEQUENCE - 1, 4) == Duplicate(entry.batches[-1])
    assert check_append(entry, PID, 0, 2, 1) == Append(2, 2)


# --- after_append ---------------------------------------------------------------------------------


def test_after_append_of_a_new_producer():
    entry = appended(None, 7, 0, 3, 40, ts=123)
    assert entry == ProducerStateEntry(PID, 7, (BatchMetadata(0, 2, 40, 42, 123),), None, 123)


def test_after_append_keeps_only_the_last_five_batches_in_order():
    entry = history(8)
    assert [b.first_seq for b in entry.batches] == [3, 4, 5, 6, 7]
    assert [b.first_offset for b in entry.batches] == [103, 104, 105, 106, 107]
    assert entry.last_seq == 7
    assert entry.last_timestamp_ms == 7


def test_after_append_of_a_transactional_batch_remembers_the_first_offset_of_the_transaction():
    entry = appended(None, 0, 0, 2, 10, transactional=True)
    assert entry.txn_first_offset == 10
    entry = appended(entry, 0, 2, 3, 20, transactional=True)
    assert entry.txn_first_offset == 10  # the transaction's first offset, not the batch's


def test_after_append_of_a_plain_idempotent_batch_opens_no_transaction():
    entry = appended(None, 0, 0, 2, 10, transactional=False)
    assert entry.txn_first_offset is None


def test_after_append_at_a_new_epoch_starts_the_new_transaction_there():
    entry = appended(None, 0, 0, 1, 10, transactional=True)
    entry = after_marker(entry, PID, 0, 1)
    entry = appended(entry, 1, 0, 1, 30, transactional=True)
    assert (entry.producer_epoch, entry.txn_first_offset, len(entry.batches)) == (1, 30, 1)


def test_last_seq_of_an_entry_without_batches_is_none():
    assert ProducerStateEntry(PID, 0).last_seq is None


# --- after_marker -----------------------------------------------------------------------------------


def test_a_marker_closes_the_open_transaction_and_keeps_the_batches_of_its_epoch():
    entry = appended(None, 3, 0, 2, 10, transactional=True)
    closed = after_marker(entry, PID, 3, 55)
    assert closed.txn_first_offset is None
    assert closed.producer_epoch == 3
    assert closed.batches == entry.batches
    assert closed.last_timestamp_ms == 55
    assert isinstance(check_append(closed, PID, 3, 0, 2), Duplicate)


def test_a_marker_at_a_higher_epoch_raises_the_epoch_and_forgets_the_old_batches():
    entry = history(2, epoch=3)
    closed = after_marker(entry, PID, 4, 55)
    assert closed.producer_epoch == 4
    assert closed.batches == ()
    # the old epoch's batches are no duplicates at the new epoch: seq 0 is a new batch
    assert check_append(closed, PID, 4, 0, 1) == Append(0, 0)
    assert refused(closed, 3, 2).code is ErrorCode.PRODUCER_FENCED


def test_a_marker_never_lowers_the_epoch():
    entry = history(1, epoch=6)
    closed = after_marker(entry, PID, 5, 1)
    assert closed.producer_epoch == 6
    assert closed.batches == entry.batches


def test_a_marker_without_state_creates_an_entry_without_batches():
    entry = after_marker(None, PID, 2, 9)
    assert entry == ProducerStateEntry(PID, 2, (), None, 9)
    assert check_append(entry, PID, 2, 0, 1) == Append(0, 0)


def test_batch_metadata_round_trips_through_json():
    b = BatchMetadata(1, 2, 3, 4, 5)
    assert BatchMetadata.from_json(b.to_json()) == b


def test_max_epoch_is_kafkas_short_max_value_and_fits_every_epoch_column():
    assert MAX_EPOCH == 2**15 - 1  # Short.MAX_VALUE; the largest smallint
    epochs = [c for t in tables.metadata.tables.values() for c in t.columns if c.name.endswith("producer_epoch")]
    assert epochs and all(isinstance(c.type, SmallInteger) for c in epochs)
