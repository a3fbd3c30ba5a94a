from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Callable, Sequence

from sqlalchemy.engine import Connection

from app.domain import topic_configs
from app.domain.log import PartitionStatus, TopicMetadata
from app.domain.records import validate_partition_count, validate_topic_name
from app.domain.transactions import TxnState
from app.errors import ErrorCode, TxlogError
from app.services import Broker, coordinator, retention
from app.storage import log as log_store
from app.storage import retention as retention_store
from app.storage import topics as topics_store
from app.storage import transactions as transactions_store


def create_topic(
    broker: Broker, name: str, partitions: int, config: dict | None = None, validate_only: bool = False
) -> tuple[str, int]:
    """Create a topic (CreateTopics): its name, partition count and config checked, then written;
    TOPIC_ALREADY_EXISTS if there is one of that name. ``validate_only`` (Kafka's): checked the same
    way, existence included, and nothing written."""
    validate_topic_name(name)
    validate_partition_count(partitions, broker.settings.max_partitions_per_topic)
    config = kept_config(config or {})
    if validate_only:
        with broker.db.read() as conn:
            exists = topics_store.topic_partitions(conn, name) is not None
    else:
        with broker.db.transaction() as conn:
            exists = not topics_store.topic_insert(conn, name, partitions, config)
    if exists:
        raise TxlogError(ErrorCode.TOPIC_ALREADY_EXISTS, f"Topic {name!r} already exists")
    return name, partitions


def create_partitions(broker: Broker, name: str, total: int, validate_only: bool = False, assignments: int | None = None) -> int:
    """Kafka's CreatePartitions: grow topic ``name`` to ``total`` partitions (new ones empty, at
    offset 0), or with ``validate_only`` check that it could be. A topic never shrinks:
    INVALID_PARTITIONS for a count at or below the current one; UNKNOWN_TOPIC_OR_PARTITION for no
    such topic. ``assignments``: how many partition assignments the request named, which must be
    one per new partition (INVALID_REPLICA_ASSIGNMENT). Answers the count before."""
    validate_partition_count(total, broker.settings.max_partitions_per_topic)
    with broker.db.transaction() as conn:
        current = topics_store.topic_partitions(conn, name, for_update=not validate_only)
        if current is None:
            raise TxlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"Topic {name!r} does not exist")
        if total < current:
            raise TxlogError(
                ErrorCode.INVALID_PARTITIONS,
                f"Topic currently has {current} partitions, which is higher than the requested {total}.",
            )
        if total == current:
            raise TxlogError(ErrorCode.INVALID_PARTITIONS, f"Topic already has {current} partitions.")
        if assignments is not None and assignments != total - current:
            raise TxlogError(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"Increasing the number of partitions by {total - current} but {assignments} assignments provided.",
            )
        if not validate_only:
            topics_store.partitions_add(conn, name, current, total)
    return current


def kept_config(config: dict) -> dict:
    """A topic's config as it is kept: checked against Kafka's table of topic configs
    (``topic_configs``), the keys given as null left out."""
    return topic_configs.kept(config)


def list_topics(broker: Broker) -> list[tuple[str, int]]:
    with broker.db.read() as conn:
        return topics_store.topic_list(conn)


def topics_metadata(
    broker: Broker, names: Sequence[str] | None = None, topic_ids: Sequence[uuid.UUID] | None = None
) -> list[TopicMetadata]:
    """Kafka's Metadata of topics: name, partition count and topic id (a random UUID fixed at
    creation), in name order — every topic, or those named in ``names`` or identified in
    ``topic_ids`` that exist (the absent ones are the caller's UNKNOWN_TOPIC_OR_PARTITION or
    UNKNOWN_TOPIC_ID)."""
    with broker.db.read() as conn:
        return topics_store.topics_metadata(conn, names, topic_ids)


def describe_topic(broker: Broker, name: str) -> list[PartitionStatus]:
    with broker.db.read() as conn:
        statuses = log_store.partition_status_all(conn, name)
    if not statuses:
        raise TxlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"Topic {name!r} does not exist")
    return statuses


def partition_count(broker: Broker, name: str) -> int:
    """The topic's partition count: one key lookup, one statement in autocommit (its own
    snapshot; no BEGIN or COMMIT round trips: every HTTP share acquisition of a topic asks)."""
    with broker.db.autocommit() as conn:
        n = topics_store.topic_partitions(conn, name)
    if n is None:
        raise TxlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"Topic {name!r} does not exist")
    return n


def topic_config(broker: Broker, name: str) -> dict:
    with broker.db.read() as conn:
        config = topics_store.topic_config_get(conn, name)
    if config is None:
        raise TxlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"Topic {name!r} does not exist")
    return config


def alter_topic_config(broker: Broker, name: str, changes: dict) -> dict:
    """Kafka's IncrementalAlterConfigs on a topic, as HTTP gives it: set the keys given, remove
    those given as null. Retention changes take effect at the sweeper's next round."""
    return _alter(broker, name, lambda current: topic_configs.altered(current, changes))


def incremental_alter_topic_config(
    broker: Broker, name: str, ops: list[tuple[str, topic_configs.Operation, str | None]], validate_only: bool = False
) -> dict:
    """IncrementalAlterConfigs as the wire gives it: SET, DELETE, APPEND and SUBTRACT in turn."""
    return _alter(broker, name, lambda current: topic_configs.incremental(current, ops), validate_only)


def replace_topic_config(broker: Broker, name: str, config: dict, validate_only: bool = False) -> dict:
    """AlterConfigs (the older, whole-set one): the topic's config becomes exactly ``config``;
    every key not given returns to its default."""
    return _alter(broker, name, lambda _current: topic_configs.kept(config), validate_only)


def _alter(broker: Broker, name: str, change: Callable[[dict], dict], validate_only: bool = False) -> dict:
    with broker.db.transaction() as conn:
        current = topics_store.topic_config_get(conn, name, for_update=not validate_only)
        if current is None:
            raise TxlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"Topic {name!r} does not exist")
        config = change(current)
        if not validate_only:
            topics_store.topic_config_set(conn, name, config)
    return config


def describe_topic_config(broker: Broker, name: str) -> list[topic_configs.DescribedConfig]:
    """DescribeConfigs of a topic: every topic config with its value and where it comes from."""
    return described_config(broker, topic_config(broker, name))


def described_config(broker: Broker, config: dict) -> list[topic_configs.DescribedConfig]:
    """A topic config as DescribeConfigs answers it, beside this server's settings: those given
    to it (STATIC_BROKER_CONFIG) and its defaults."""
    settings = broker.settings
    values = {name: getattr(settings, field) for name, field in TOPIC_DEFAULT_SETTINGS.items()}
    given = {name: values[name] for name, field in TOPIC_DEFAULT_SETTINGS.items() if field in settings.model_fields_set}
    return topic_configs.describe(config, given, values)


# The broker configs that give topic configs their defaults, by Kafka's name: the settings that are them.
TOPIC_DEFAULT_SETTINGS = {
    "log.retention.ms": "log_retention_ms",
    "log.retention.bytes": "log_retention_bytes",
    "message.max.bytes": "max_request_bytes",
}


@dataclass(frozen=True)
class DeletedTopic:
    name: str
    topic_id: uuid.UUID
    aborted_transactions: tuple[str, ...]  # transactional ids whose open transaction wrote to it
    records_pending: bool  # records still being deleted (the name cannot be created again until they are)


def delete_topic(broker: Broker, name: str, timeout_ms: int = 30_000) -> DeletedTopic:
    """Kafka's DeleteTopics. Every open transaction with a partition of the topic is aborted through
    the coordinator, on all its partitions, and its producer fenced (as an operator's abort:
    ``aborted_by_operator``; a prepared one completes as decided); then, in one database
    transaction under the topic's append locks, the topic and its partitions go, with its committed
    and pending group offsets and producer states.
    From then on it is unknown to every way in. Its records are deleted after, a batch per
    database transaction, here for up to ``timeout_ms`` and by the sweeper for what is left; until
    they are gone, creating the name again is TOPIC_ALREADY_EXISTS ("marked for deletion").
    Transactions are ended one per database transaction, as EndTxn takes its locks (transaction,
    then partitions); the topic goes in one with its partitions locked, once none is open on it.
    A transaction that adds a partition of the topic after that still ends: its marker there is
    skipped, as for any partition gone."""
    deadline = time.monotonic() + timeout_ms / 1000
    aborted: list[str] = []
    while True:
        with broker.db.read() as conn:
            open_ids = topics_store.open_transactions_on(conn, name)
        for tid in open_ids:
            with broker.db.transaction() as conn:
                if _end_open(conn, broker, tid):
                    aborted.append(tid)
        with broker.db.transaction() as conn:
            topic_id = topics_store.topic_lock_for_delete(conn, name)
            if topic_id is None:
                raise TxlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"Topic {name!r} does not exist")
            joined = topics_store.open_transactions_on(conn, name)
            if not joined:
                topics_store.topic_delete(conn, name)
                break
        # A transaction joined the topic meanwhile: its row is locked before any partition (the lock
        # order), so it is ended as the others were, and the topic's locks taken again.
        if time.monotonic() >= deadline:
            raise TxlogError(
                ErrorCode.CONCURRENT_TRANSACTIONS, f"Transactions keep joining topic {name!r}: {', '.join(joined)}; try again"
            )
    retention.trim(broker, retention.RetentionReport(), deadline, deleted_topic=name)
    with broker.db.read() as conn:
        pending = bool(retention_store.deleted_partitions_to_trim(conn, name, limit=1))
    return DeletedTopic(name, topic_id, tuple(sorted(set(aborted))), pending)


def _end_open(conn: Connection, broker: Broker, transactional_id: str) -> bool:
    meta = transactions_store.txn_get(conn, transactional_id, for_update=True)
    if meta is None or not meta.state.is_open:
        return False
    ongoing = meta.state is TxnState.ONGOING  # a prepared one completes as it was decided
    coordinator.finish_open(conn, broker, meta, "aborted_by_operator")
    return ongoing
