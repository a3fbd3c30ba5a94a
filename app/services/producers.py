"""Kafka's DescribeProducers (kafka-transactions.sh describe-producers, KIP-664): what each
partition remembers of the producers that wrote to it."""

from __future__ import annotations

from typing import Sequence

from app.domain.log import unknown_partition
from app.domain.producer_state import ProducerStateEntry
from app.errors import TxlogError
from app.services import Broker
from app.storage import producers as producers_store
from app.storage import topics as topics_store

TopicPartition = tuple[str, int]


def describe_producers(
    broker: Broker, partitions: Sequence[TopicPartition]
) -> dict[TopicPartition, list[ProducerStateEntry] | TxlogError]:
    """Each partition's active producers — every producer id whose state it keeps (expired ones
    go with the sweeper, never while a transaction of theirs is open) with its epoch, last
    sequence and timestamp and the first offset of its open transaction there — or
    UNKNOWN_TOPIC_OR_PARTITION for a partition that does not exist. One read: a primary-key prefix
    of the producer state per partition, whatever the log's length."""
    wanted = list(dict.fromkeys(partitions))
    answers: dict[TopicPartition, list[ProducerStateEntry] | TxlogError] = {}
    with broker.db.read() as conn:
        # No partition has a number beyond an int32 or a topic name with a NUL (nor could one be asked of PostgreSQL).
        in_range = [(t, p) for t, p in wanted if 0 <= p < 2**31 and "\x00" not in t]
        missing = set(topics_store.partitions_missing(conn, in_range)) | {tp for tp in wanted if tp not in in_range}
        for topic, partition in wanted:
            if (topic, partition) in missing:
                answers[(topic, partition)] = unknown_partition(topic, partition)
            else:
                answers[(topic, partition)] = producers_store.partition_producers(conn, topic, partition)
    return answers
