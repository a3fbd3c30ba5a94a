from __future__ import annotations

import uuid
from typing import Sequence

from app.domain.log import PartitionStatus, TopicMetadata
from app.domain.records import validate_partition_count, validate_topic_name
from app.domain.retention import altered_config, validate_topic_config
from app.errors import ErrorCode, TxlogError
from app.services import Broker
from app.storage import log as log_store
from app.storage import topics as topics_store


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
                ErrorCode.INVALID_PARTITIONS, f"Topic currently has {current} partitions, which is higher than the requested {total}."
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
    """A topic's config as it is kept: checked, the keys given as null left out."""
    return {k: v for k, v in validate_topic_config(config).items() if v is not None}


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
    with broker.db.read() as conn:
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
    """Kafka's IncrementalAlterConfigs on a topic: set the keys given, remove those given as null.
    Retention changes take effect at the sweeper's next round."""
    with broker.db.transaction() as conn:
        current = topics_store.topic_config_get(conn, name, for_update=True)
        if current is None:
            raise TxlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"Topic {name!r} does not exist")
        config = altered_config(current, changes)
        topics_store.topic_config_set(conn, name, config)
    return config
