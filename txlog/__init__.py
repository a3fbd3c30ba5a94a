"""txlog's Python client: confluent-kafka's shapes over txlog's HTTP API."""

from txlog.consumer import Consumer, ConsumerGroupMetadata
from txlog.errors import KafkaError, KafkaException
from txlog.message import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    OFFSET_STORED,
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    TIMESTAMP_NOT_AVAILABLE,
    Message,
    TopicPartition,
)
from txlog.producer import Producer
from txlog.rocketmq import TransactionProducer
from txlog.share_consumer import ShareConsumer, ShareMessage

__all__ = [
    "Consumer",
    "ConsumerGroupMetadata",
    "KafkaError",
    "KafkaException",
    "Message",
    "OFFSET_BEGINNING",
    "OFFSET_END",
    "OFFSET_INVALID",
    "OFFSET_STORED",
    "Producer",
    "ShareConsumer",
    "ShareMessage",
    "TIMESTAMP_CREATE_TIME",
    "TIMESTAMP_LOG_APPEND_TIME",
    "TIMESTAMP_NOT_AVAILABLE",
    "TopicPartition",
    "TransactionProducer",
]
