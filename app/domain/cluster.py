"""Which gateway process answers for what, when several act as the brokers of one cluster.

Every record lives once, in PostgreSQL, so any gateway can serve any partition; the rules below
only spread the work. Each gateway computes them from the same list of live node ids (the node
registry, ``txlog.kafka_nodes``), so all of them give a client the same answer. A node joining or
leaving moves some partitions and groups to another node; clients follow through Metadata and
FindCoordinator, as they do when a Kafka broker goes away. No I/O here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from app.domain.partitioner import murmur2, to_positive
from app.errors import ErrorCode, TxlogError


def _ordered(node_ids: Iterable[int]) -> list[int]:
    nodes = sorted(set(node_ids))
    if not nodes:
        raise TxlogError(ErrorCode.COORDINATOR_NOT_AVAILABLE, "No live gateway node")
    return nodes


def _hash(text: str) -> int:
    """A stable, non-negative hash of a name: Kafka's murmur2 of its UTF-8 bytes."""
    return to_positive(murmur2(text.encode("utf-8", errors="surrogatepass")))


def leader_of(topic: str, partition: int, node_ids: Iterable[int]) -> int:
    """The node leading a topic partition: the topic's hash plus the partition number, modulo the
    number of live nodes, indexes the node ids in order. A topic's partitions go round the nodes
    in turn, starting at a node that depends on the topic."""
    nodes = _ordered(node_ids)
    return nodes[(_hash(topic) + partition) % len(nodes)]


def coordinator_of(key: str, node_ids: Iterable[int]) -> int:
    """The node coordinating a consumer group (or a transactional id): the key's hash modulo the
    number of live nodes indexes the node ids in order."""
    nodes = _ordered(node_ids)
    return nodes[_hash(key) % len(nodes)]


@dataclass(frozen=True)
class KafkaNode:
    node_id: int
    host: str
    port: int
    expires_at_ms: int
    # Every listener of the node: {listener name: {"host", "port", "security_protocol"}}.
    listeners: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, compare=False)
    rack: str | None = None  # Kafka's broker.rack
    read_replica: bool = False  # serves Fetch from a hot standby, leads nothing (``preferred_read_replica``)


def preferred_read_replica(
    topic: str, partition: int, client_rack: str | None, leader: int, racks: Mapping[int, str | None], replicas: Iterable[int]
) -> int:
    """The node a consumer in ``client_rack`` is told to fetch a partition from (Kafka's
    RackAwareReplicaSelector, KIP-392), or -1: fetch from the leader. ``racks``: each live node's
    rack; ``replicas``: the live read replicas, which follow every partition. A client without a
    rack, or in the leader's rack, stays with the leader, and so does one in a rack without a
    replica; otherwise a replica of its rack, the partitions spread over them as leadership is
    (``leader_of``'s rule), so every gateway names the same one."""
    if not client_rack or racks.get(leader) == client_rack:
        return -1
    in_rack = [node for node in sorted(set(replicas)) if node != leader and racks.get(node) == client_rack]
    return leader_of(topic, partition, in_rack) if in_rack else -1
