"""Open transactions per principal, through the services (the principal is the authenticated
requester a way in passes), against a real database."""

from __future__ import annotations

from typing import Iterator

import pytest

from app.domain.records import NewRecord
from app.errors import ErrorCode, TxlogError
from app.services import Broker, produce, topics, transactions
from tests.conftest import make_broker


@pytest.fixture
def b(db_url: str) -> Iterator[Broker]:
    broker = make_broker(db_url, max_open_transactions_per_principal=2, max_partitions_per_transaction=2)
    topics.create_topic(broker, "t", 3)
    yield broker
    broker.db.dispose()


def send(b: Broker, tid: str, principal: str | None, partition: int = 0) -> None:
    ids = transactions.describe(b, tid)
    req = produce.ProduceRequest([NewRecord(b"k", b"v")], ids.producer_id, ids.producer_epoch, 0, tid, principal=principal)
    produce.produce(b, "t", partition, req)


def refused(fn, *args, **kwargs) -> TxlogError:  # type: ignore[no-untyped-def]
    with pytest.raises(TxlogError) as info:
        fn(*args, **kwargs)
    return info.value


def test_a_principal_opens_at_most_its_limit_and_may_start_again_once_one_ends(b: Broker) -> None:
    for tid in ("a1", "a2", "a3", "b1", "n1", "n2", "n3"):
        transactions.init_producer_id(b, tid)
    send(b, "a1", "alice")
    send(b, "a2", "alice", 1)
    send(b, "a2", "alice", 2)  # a partition joining an open transaction starts nothing

    err = refused(send, b, "a3", "alice")
    assert err.code is ErrorCode.THROTTLING_QUOTA_EXCEEDED and err.code.retriable
    assert "'alice' has 2 open transactions" in err.message
    assert transactions.describe(b, "a3").state.value == "Empty"  # nothing of the refused start stayed
    # The same through AddPartitionsToTxn and AddOffsetsToTxn.
    a3 = transactions.describe(b, "a3")
    for call in (
        lambda: transactions.add_partitions_to_txn(b, "a3", a3.producer_id, a3.producer_epoch, [("t", 0)], principal="alice"),
        lambda: transactions.txn_offset_commit(b, "a3", a3.producer_id, a3.producer_epoch, "g", [], principal="alice"),
    ):
        assert refused(call).code is ErrorCode.THROTTLING_QUOTA_EXCEEDED

    send(b, "b1", "bob")  # another principal has its own count
    for tid in ("n1", "n2", "n3"):  # without authentication there is no principal and no such limit
        send(b, tid, None)

    a1 = transactions.describe(b, "a1")
    transactions.end_txn(b, "a1", a1.producer_id, a1.producer_epoch, "commit")
    send(b, "a3", "alice")
    assert transactions.describe(b, "a3").state.value == "Ongoing"


def test_partitions_per_transaction_are_counted_as_they_join(b: Broker) -> None:
    transactions.init_producer_id(b, "p")
    send(b, "p", None, 0)
    send(b, "p", None, 1)
    err = refused(send, b, "p", None, 2)
    assert err.code is ErrorCode.POLICY_VIOLATION
    assert "at most 2 partitions: it has 2, and 1 more" in err.message
    meta = transactions.describe(b, "p")
    assert meta.partitions == (("t", 0), ("t", 1))  # the refused partition did not join
    send(b, "p", None, 1)  # partitions already in it take more batches
    transactions.end_txn(b, "p", meta.producer_id, meta.producer_epoch, "abort")
    send(b, "p", None, 2)  # the next transaction counts from zero
