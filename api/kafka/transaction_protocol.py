"""Which of Kafka's two transaction protocols a request speaks, and how a transaction's errors are
named to it (KIP-890, KIP-1050).

A Kafka client picks its protocol from ApiVersions: Java clients from 4.0 speak transactions V2
when the cluster finalizes the ``transaction.version`` feature at 2 (and the broker serves Produce
v12 and TxnOffsetCommit v5); every other client, and those against a cluster finalized at 1, speak
the first protocol. The broker, for its part, takes the protocol of each request from its version,
whatever level is finalized (a client finishes a transaction in the protocol it began it with):
Produce from v12, TxnOffsetCommit from v5 and EndTxn from v5 are V2; AddPartitionsToTxn and
AddOffsetsToTxn are the first protocol's (V2 clients send neither).

What differs: a V2 batch or TxnOffsetCommit adds its partition or group to the transaction
(starting one if none is open) where the first protocol's must find it added already; a V2 EndTxn
ends the transaction with a new epoch for the next one, answered to the client, where the first
protocol's keeps the producer's epoch. The rules themselves are the services' (``transaction_version``
1 or 2, ``require_added``); this module only reads them off the wire.
"""

from __future__ import annotations

from app.domain import transactions as txn
from app.errors import ErrorCode, TxlogError
from app.wire.kafka.messages import ApiKey

FEATURE = "transaction.version"
# The feature levels this gateway serves (Kafka 4.x's): 0 and 1 are the first protocol, 2 is V2.
SUPPORTED_LEVELS = (0, 2)
V1, V2 = txn.V1, txn.V2

# The first request version of transactions V2, by API.
_FIRST_V2 = {ApiKey.Produce: 12, ApiKey.TxnOffsetCommit: 5, ApiKey.EndTxn: 5}

# The first version whose client knows TRANSACTION_ABORTABLE (KIP-890's verification, KIP-1050):
# a batch or offset commit for a partition or group that is not in the open transaction is
# answered so from here, and INVALID_TXN_STATE below, as Kafka's ``TransactionSupportedOperation``.
_ABORTABLE_SINCE = {ApiKey.Produce: 11, ApiKey.TxnOffsetCommit: 4}


def transaction_version(api_key: int, version: int) -> int:
    """The protocol a request of ``api_key`` at ``version`` speaks: V2 or V1."""
    first = _FIRST_V2.get(ApiKey(api_key))
    return V2 if first is not None and version >= first else V1


def adds_to_transaction(api_key: int, version: int) -> bool:
    """Whether a transactional Produce or TxnOffsetCommit of this version adds its partition or
    group to the transaction itself (V2); else it must be in the transaction already."""
    return transaction_version(api_key, version) == V2


def not_in_transaction_code(api_key: int, version: int, exc: TxlogError) -> ErrorCode:
    """The error of a batch or offset commit refused because its partition or group is not in the
    open transaction (``exc.details['not_added']``): TRANSACTION_ABORTABLE to a client that knows
    it, INVALID_TXN_STATE to older ones; any other error as it is."""
    if not exc.details.get("not_added"):
        return exc.code
    since = _ABORTABLE_SINCE.get(ApiKey(api_key))
    return ErrorCode.TRANSACTION_ABORTABLE if since is not None and version >= since else ErrorCode.INVALID_TXN_STATE


def finalized_features(level: int) -> list[dict]:
    """ApiVersions' FinalizedFeatures: ``transaction.version`` at ``level`` (a level of 0 is not
    listed, as Kafka lists no feature finalized at 0)."""
    return [{"name": FEATURE, "max_version_level": level, "min_version_level": level}] if level > 0 else []


def supported_features() -> list[dict]:
    """ApiVersions' SupportedFeatures: the levels of ``transaction.version`` this gateway serves."""
    return [{"name": FEATURE, "min_version": SUPPORTED_LEVELS[0], "max_version": SUPPORTED_LEVELS[1]}]
