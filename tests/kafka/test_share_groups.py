"""Share groups (KIP-932) through confluent-kafka's ShareConsumer and over raw frames: records shared
out among the members of a share group, each delivered to one member at a time, redelivered when
its holder goes away; reject and the delivery-count limit archive; read_committed share groups
never deliver an aborted record; a gateway killed mid-fetch costs the consumer nothing."""

from __future__ import annotations

import time
import uuid
from typing import Any

from confluent_kafka import Producer, ShareConsumer

from app.services import Broker
from app.services import share as share_service
from app.wire.kafka.protocol import ApiKey
from tests.kafka.conftest import GatewayProcess, RawConnection


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _produce(bootstrap: str, topic: str, values: list[bytes], partitions: int | None = None) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for i, value in enumerate(values):
        producer.produce(topic, value, partition=i % partitions if partitions else -1)
    assert producer.flush(30) == 0


def _consumer(bootstrap: str, group: str, **extra: Any) -> ShareConsumer:
    return ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, **extra})


def _drain(consumers: list[ShareConsumer], want: int, timeout: float = 30) -> dict[int, list[bytes]]:
    """Polls each consumer in turn, accepting what it gets, until ``want`` records came."""
    got: dict[int, list[bytes]] = {i: [] for i in range(len(consumers))}
    deadline = time.monotonic() + timeout
    while sum(len(v) for v in got.values()) < want and time.monotonic() < deadline:
        for i, c in enumerate(consumers):
            for m in c.poll(0.2) or []:
                if m.error() is None:
                    got[i].append(m.value())
    return got


def _set_configs(store: Broker, group: str, **configs: str) -> None:
    share_service.alter_group_configs(store, group, configs)


def test_members_share_the_topic_disjointly(gateway: GatewayProcess, raw: RawConnection, store: Broker) -> None:
    topic, group = _name("share-topic"), _name("share-group")
    raw.request(ApiKey.CreateTopics, 7, {"topics": [{"name": topic, "num_partitions": 2, "replication_factor": 1}]})
    _set_configs(store, group, **{"share.auto.offset.reset": "earliest"})
    values = [f"v{i}".encode() for i in range(40)]
    _produce(gateway.bootstrap, topic, values, partitions=2)
    consumers = [_consumer(gateway.bootstrap, group) for _ in range(3)]
    try:
        for c in consumers:
            c.subscribe([topic])
        got = _drain(consumers, len(values))
    finally:
        for c in consumers:
            c.close()
    every = [v for vs in got.values() for v in vs]
    assert sorted(every) == sorted(values)
    assert len(every) == len(set(every))
