"""Which transaction protocol a Kafka request speaks, and how a partition or group missing from
the transaction is named to it (``api.kafka.transaction_protocol``)."""

from __future__ import annotations

import pytest

from api.kafka import transaction_protocol as tp
from app.errors import ErrorCode, TxlogError
from app.wire.kafka.messages import ApiKey


@pytest.mark.parametrize(
    ("api", "version", "expected"),
    [
        (ApiKey.Produce, 3, 1),
        (ApiKey.Produce, 11, 1),
        (ApiKey.Produce, 12, 2),
        (ApiKey.EndTxn, 4, 1),
        (ApiKey.EndTxn, 5, 2),
        (ApiKey.TxnOffsetCommit, 4, 1),
        (ApiKey.TxnOffsetCommit, 5, 2),
        (ApiKey.AddPartitionsToTxn, 3, 1),
        (ApiKey.AddOffsetsToTxn, 4, 1),
        (ApiKey.InitProducerId, 5, 1),
    ],
)
def test_the_protocol_is_the_request_versions(api: int, version: int, expected: int) -> None:
    assert tp.transaction_version(api, version) == expected
    assert tp.adds_to_transaction(api, version) is (expected == 2)


def test_a_partition_or_group_not_added_is_transaction_abortable_from_the_versions_that_know_it() -> None:
    not_added = TxlogError(ErrorCode.INVALID_TXN_STATE, "not in the transaction", not_added=True)
    assert tp.not_in_transaction_code(ApiKey.Produce, 10, not_added) is ErrorCode.INVALID_TXN_STATE
    assert tp.not_in_transaction_code(ApiKey.Produce, 11, not_added) is ErrorCode.TRANSACTION_ABORTABLE
    assert tp.not_in_transaction_code(ApiKey.TxnOffsetCommit, 3, not_added) is ErrorCode.INVALID_TXN_STATE
    assert tp.not_in_transaction_code(ApiKey.TxnOffsetCommit, 4, not_added) is ErrorCode.TRANSACTION_ABORTABLE
    other = TxlogError(ErrorCode.INVALID_TXN_STATE, "another state error")
    assert tp.not_in_transaction_code(ApiKey.Produce, 12, other) is ErrorCode.INVALID_TXN_STATE


def test_the_features_answered_by_apiversions() -> None:
    assert tp.supported_features() == [{"name": "transaction.version", "min_version": 0, "max_version": 2}]
    assert tp.finalized_features(2) == [{"name": "transaction.version", "max_version_level": 2, "min_version_level": 2}]
    assert tp.finalized_features(1) == [{"name": "transaction.version", "max_version_level": 1, "min_version_level": 1}]
    assert tp.finalized_features(0) == []
