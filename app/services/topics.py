from __future__ import annotations

from app.domain.records import validate_partition_count, validate_topic_name
from app.errors import ErrorCode, TxlogError
from app.services import Broker
from app.storage import queries as q
from app.storage.queries import PartitionStatus


def create_topic(broker: Broker, name: str, partitions: int, config: dict | None = None) -> tuple[str, int]:
    validate_topic_name(name)
    validate_partition_count(partitions)
    with broker.db.transaction() as conn:
        if not q.topic_insert(conn, name, partitions, config or {}):
            raise TxlogError(ErrorCode.TOPIC_ALREADY_EXISTS, f"Topic {name!r} already exists")
    return name, partitions


def list_topics(broker: Broker) -> list[tuple[str, int]]:
    with broker.db.read() as conn:
        return q.topic_list(conn)


def describe_topic(broker: Broker, name: str) -> list[PartitionStatus]:
    with broker.db.read() as conn:
        statuses = q.partition_status_all(conn, name)
    if not statuses:
        raise TxlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"Topic {name!r} does not exist")
    return statuses


def partition_count(broker: Broker, name: str) -> int:
    with broker.db.read() as conn:
        n = q.topic_partitions(conn, name)
    if n is None:
        raise TxlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"Topic {name!r} does not exist")
    return n
