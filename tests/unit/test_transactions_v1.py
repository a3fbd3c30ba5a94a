"""The coordinator's rules for Kafka clients before transactions V2 (app.domain.transactions):
InitProducerId naming the producer's id and epoch (KIP-360), partitions and groups that must have
joined the open transaction (KIP-890 part 1), and an epoch kept across transactions."""

from __future__ import annotations

import dataclasses

import pytest

from app.domain import transactions as txn
from app.domain.producer_state import MAX_EPOCH
from app.domain.transactions import TxnState
from app.errors import ErrorCode
from tests.unit.test_transactions import PID, History, error_of

S = TxnState


def reinit_naming(h: History, pid: int, epoch: int, new_pid: int | None = None):  # type: ignore[no-untyped-def]
    """What the service does for an init naming (pid, epoch): check, then raise the epoch."""
    assert txn.check_init_producer(h.meta, pid, epoch) is False
    return h.step(txn.reinitialized(h.meta, h.meta.timeout_ms, h.tick(), new_pid, previous=(pid, epoch)))


# --- KIP-360 -------------------------------------------------------------------------------------------


def test_an_init_naming_the_current_epoch_raises_it_and_remembers_what_it_was_asked():
    h = History()
    meta = reinit_naming(h, PID, 0)
    assert (meta.producer_id, meta.producer_epoch, meta.state) == (PID, 1, S.EMPTY)
    assert (meta.last_producer_id, meta.last_producer_epoch, meta.last_result) == (PID, 0, None)
    assert txn.check_init_producer(meta, PID, 0) is True  # its retry: answer the current epoch
    assert txn.check_init_producer(meta, PID, 1) is False  # the next recovery raises again
    assert not txn.is_retry_of_last_end(meta, PID, 0)  # an init is no ended transaction


def test_the_retry_is_recognised_only_until_the_producer_goes_on():
    h = History()
    reinit_naming(h, PID, 0)
    h.add(("t", 0))
    err = error_of(txn.check_init_producer, h.meta, PID, 0)
    assert (err.code, err.details["reason"]) == (ErrorCode.PRODUCER_FENCED, "newer_epoch")


def test_an_init_without_the_producers_id_forgets_the_last_one():
    h = History()
    reinit_naming(h, PID, 0)
    h.reinit()  # a new producer instance
    assert (h.meta.last_producer_id, h.meta.last_producer_epoch) == (None, None)
    assert error_of(txn.check_init_producer, h.meta, PID, 0).code is ErrorCode.PRODUCER_FENCED
    assert error_of(txn.check_init_producer, h.meta, PID, 1).code is ErrorCode.PRODUCER_FENCED


@pytest.mark.parametrize("pid, epoch", [(PID, 3), (PID + 1, 0), (PID + 1, 1)])
def test_any_other_id_or_epoch_is_fenced(pid, epoch):
    h = History()
    h.reinit()
    err = error_of(txn.check_init_producer, h.meta, pid, epoch)
    assert err.code is ErrorCode.PRODUCER_FENCED
    if pid != PID:
        assert f"Producer id {pid} is fenced" in err.message


def test_an_init_after_a_kept_epoch_transaction_raises_it():
    h = History()
    h.add(("t", 0))
    h.step(txn.prepared(h.meta, "commit", h.tick(), transaction_version=1))
    h.complete()
    assert (h.meta.producer_epoch, h.meta.last_result) == (0, "commit")
    assert txn.check_init_producer(h.meta, PID, 0) is False
    assert reinit_naming(h, PID, 0).producer_epoch == 1


def test_a_retry_across_a_new_producer_id_is_recognised():
    h = History()
    h.step(txn.reinitialized(h.meta, h.meta.timeout_ms, h.tick(), None))
    h.meta = dataclasses.replace(h.meta, producer_epoch=MAX_EPOCH)  # the epoch runs out
    meta = h.step(txn.reinitialized(h.meta, h.meta.timeout_ms, h.tick(), 2000, previous=(PID, MAX_EPOCH)))
    assert (meta.producer_id, meta.producer_epoch) == (2000, 0)
    assert txn.check_init_producer(meta, PID, MAX_EPOCH) is True
    assert txn.check_init_producer(meta, 2000, 0) is False


# --- partitions and groups added before use ---------------------------------------------------------------


def test_a_partition_must_be_in_the_open_transaction():
    h = History()
    err = error_of(txn.check_partition_added, h.meta, "t", 0)
    assert err.code is ErrorCode.INVALID_TXN_STATE
    assert err.message.startswith("Partition was not added to the transaction: t-0")
    h.add(("t", 0))
    txn.check_partition_added(h.meta, "t", 0)
    assert error_of(txn.check_partition_added, h.meta, "t", 1).code is ErrorCode.INVALID_TXN_STATE
    h.step(txn.prepared(h.meta, "commit", h.tick(), transaction_version=1))
    assert error_of(txn.check_partition_added, h.meta, "t", 0).code is ErrorCode.CONCURRENT_TRANSACTIONS
    h.complete()
    # the ended transaction's partitions are remembered, but it is no longer open
    assert h.meta.partitions == (("t", 0),)
    assert error_of(txn.check_partition_added, h.meta, "t", 0).code is ErrorCode.INVALID_TXN_STATE


def test_a_group_must_be_in_the_open_transaction():
    h = History()
    assert error_of(txn.check_group_added, h.meta, "g").message.startswith("Group was not added to the transaction")
    h.add(groups=("g",))
    txn.check_group_added(h.meta, "g")
    assert error_of(txn.check_group_added, h.meta, "h").code is ErrorCode.INVALID_TXN_STATE
    h.end("abort")
    assert error_of(txn.check_group_added, h.meta, "g").code is ErrorCode.INVALID_TXN_STATE


# --- the version a transaction runs in -----------------------------------------------------------------


def test_the_version_is_the_adding_requests_from_the_transactions_start():
    h = History()
    h.step(txn.partitions_added(h.meta, [("t", 0)], h.tick(), transaction_version=txn.V1))
    assert (h.meta.state, h.meta.transaction_version, h.events[-1].transaction_version) == (S.ONGOING, 1, 1)
    h.step(txn.prepared(h.meta, "commit", h.tick(), transaction_version=txn.V1))
    meta = h.complete()
    assert (meta.transaction_version, meta.producer_epoch) == (1, 0)  # V1 keeps the epoch
    # the next transaction starts in V2: recorded at its start, not left at the last one's V1
    h.step(txn.partitions_added(h.meta, [("t", 1)], h.tick(), groups=["g"], transaction_version=txn.V2))
    assert (h.meta.transaction_version, h.events[-1].transaction_version) == (2, 2)


def test_a_request_of_the_other_protocol_joins_and_the_latest_that_adds_sets_the_version():
    h = History()
    h.step(txn.partitions_added(h.meta, [("t", 0)], h.tick(), transaction_version=txn.V2))
    # in already: nothing changes, whatever the version
    assert txn.partitions_added(h.meta, [("t", 0)], h.tick(), transaction_version=txn.V1) is None
    h.step(txn.partitions_added(h.meta, [("t", 1)], h.tick(), transaction_version=txn.V1))
    assert (h.meta.partitions, h.meta.transaction_version) == ((("t", 0), ("t", 1)), 1)
    h.step(txn.partitions_added(h.meta, [], h.tick(), groups=["g"], transaction_version=txn.V2))
    assert h.meta.transaction_version == 2
    # the EndTxn's own version decides how the transaction ends
    h.step(txn.prepared(h.meta, "abort", h.tick(), transaction_version=txn.V1))
    assert (h.complete().transaction_version, h.meta.producer_epoch) == (1, 0)


def test_an_unknown_transaction_version_is_an_invalid_request():
    h = History()
    assert error_of(txn.partitions_added, h.meta, [("t", 0)], h.tick(), (), 3).code is ErrorCode.INVALID_REQUEST
