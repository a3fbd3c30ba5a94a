"""Kafka consumer groups as the admin pages show them: each group's coordinator, state, protocol and
members with the partitions assigned to them, beside the group's committed offsets and its lag
against the last stable offset.

Membership lives only in the memory of the gateway process coordinating each group. This service
asks every live gateway (``txlog.kafka_nodes``) over Kafka's protocol, as Kafka's AdminClient does
— ListGroups, then DescribeGroups — all of them at once, each conversation bounded by
``timeout_s``: a gateway that is gone or frozen is reported unreachable, with why, and never holds
the page longer than that. Committed offsets and partition positions are then read in one
snapshot of the database, as ``app.services.inspect.groups`` reads them for the groups page.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

from app.domain.cluster import coordinator_of
from app.domain.consumer_protocol import (
    CONSUMER_PROTOCOL_TYPE,
    ConsumerProtocolError,
    TopicPartitions,
    decode_assignment,
    decode_subscription,
)
from app.domain.log import PartitionStatus
from app.errors import ErrorCode, TxlogError
from app.services import Broker
from app.services import groups as groups_service
from app.services.cluster import live_nodes
from app.storage import admin_reads
from app.storage import log as log_store
from app.wire.kafka.admin_client import (
    DescribedGroup,
    DescribedMember,
    GatewayUnreachable,
    delete_groups_at,
    describe_all_groups,
    describe_some_groups,
)

ADMIN_TIMEOUT_S = 2.0  # one gateway's whole conversation: connecting, ApiVersions, ListGroups, DescribeGroups
MAX_PARALLEL = 16  # gateways asked at once (beyond that, a frozen one can cost another timeout)
_NOT_HERE = (ErrorCode.NOT_COORDINATOR.name, ErrorCode.GROUP_ID_NOT_FOUND.name)


@dataclass(frozen=True)
class GatewayStatus:
    """One live node of the registry and how its gateway answered."""

    node_id: int
    host: str
    port: int
    error: str | None  # why it did not answer; None when it did
    groups: int  # groups it said it coordinates
    elapsed_ms: int

    @property
    def reachable(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class KafkaMember:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    subscription: tuple[str, ...] | None  # the topics it subscribed to, when its metadata reads as a consumer's
    assignment: TopicPartitions | None  # its partitions, when the group is Stable and the assignment reads
    assignment_error: str | None  # why an assignment given did not read
    assignment_bytes: int

    @property
    def partition_count(self) -> int:
        return sum(len(ps) for _, ps in self.assignment or ())


@dataclass(frozen=True)
class KafkaGroupPartition:
    """A partition the group has an offset for or a member is assigned, as kafka-consumer-groups.sh
    --describe shows it. Positions are None for a partition that does not exist."""

    topic: str
    partition: int
    member_id: str | None
    client_id: str | None
    client_host: str | None
    committed_offset: int | None
    committed_at_ms: int | None
    log_start_offset: int | None
    last_stable_offset: int | None
    high_watermark: int | None

    @property
    def lag(self) -> int | None:
        """What a read_committed consumer of the group still has to read (None: nothing committed,
        or no such partition)."""
        if self.committed_offset is None or self.last_stable_offset is None:
            return None
        return max(self.last_stable_offset - self.committed_offset, 0)


@dataclass(frozen=True)
class KafkaGroup:
    group_id: str
    coordinator: int  # the node id of the gateway that described it
    error: str | None  # Kafka's error name when that gateway could not describe it
    state: str
    protocol_type: str
    protocol: str
    members: tuple[KafkaMember, ...]
    partitions: tuple[KafkaGroupPartition, ...]

    @property
    def lag(self) -> int:
        return sum(p.lag or 0 for p in self.partitions)

    def member_lag(self, member_id: str) -> int:
        return sum(p.lag or 0 for p in self.partitions if p.member_id == member_id)


@dataclass(frozen=True)
class KafkaGroups:
    gateways: list[GatewayStatus]
    groups: list[KafkaGroup]

    @property
    def unreachable(self) -> list[GatewayStatus]:
        return [g for g in self.gateways if not g.reachable]


def _member(m: DescribedMember, protocol_type: str) -> KafkaMember:
    subscription = assignment = error = None
    if protocol_type == CONSUMER_PROTOCOL_TYPE:
        if m.metadata:
            try:
                subscription = decode_subscription(m.metadata).topics
            except ConsumerProtocolError:
                pass  # the subscription column stays empty; the assignment is what matters
        if m.assignment:
            try:
                assignment = decode_assignment(m.assignment).partitions
            except ConsumerProtocolError as exc:
                error = str(exc)
    elif m.assignment:
        error = f"protocol type {protocol_type!r}: not a consumer's assignment"
    return KafkaMember(
        m.member_id, m.group_instance_id, m.client_id, m.client_host, subscription, assignment, error, len(m.assignment)
    )


def _ask(node: tuple[int, str, int], group_id: str | None, timeout_s: float) -> tuple[GatewayStatus, list[DescribedGroup]]:
    node_id, host, port = node
    started = time.monotonic()
    try:
        if group_id is None:
            described = describe_all_groups(host, port, timeout_s)
        else:
            described = describe_some_groups(host, port, [group_id], timeout_s)
        error = None
    except GatewayUnreachable as exc:
        described, error = [], exc.reason
    elapsed = int((time.monotonic() - started) * 1000)
    # A gateway not coordinating a group says so (NOT_COORDINATOR), does not know it
    # (GROUP_ID_NOT_FOUND), or describes it Dead and empty (before DescribeGroups v6): it is not
    # one of that gateway's groups — asked by name, or gone since ListGroups.
    described = [d for d in described if d.error not in _NOT_HERE and not (d.state == "Dead" and not d.members)]
    return GatewayStatus(node_id, host, port, error, len(described), elapsed), described


def describe_kafka_groups(
    broker: Broker,
    group_id: str | None = None,
    timeout_s: float = ADMIN_TIMEOUT_S,
    nodes: Callable[[Broker], list[tuple[int, str, int]]] = live_nodes,
) -> KafkaGroups:
    """Every consumer group the live gateways coordinate (or only ``group_id``), with members,
    assignments, committed offsets and lag; and each gateway's answer. Groups sorted by id, then
    coordinator; a group two gateways both describe (while it moves) appears once for each."""
    registered = nodes(broker)
    answers: list[tuple[GatewayStatus, list[DescribedGroup]]] = []
    if registered:
        with ThreadPoolExecutor(max_workers=min(len(registered), MAX_PARALLEL), thread_name_prefix="txlog-kafka-admin") as pool:
            answers = list(pool.map(lambda n: _ask(n, group_id, timeout_s), registered))
    found = sorted(
        ((status.node_id, d) for status, d_list in answers for d in d_list), key=lambda pair: (pair[1].group_id, pair[0])
    )
    members = {
        (node_id, d.group_id): sorted((_member(m, d.protocol_type) for m in d.members), key=lambda m: (m.client_id, m.member_id))
        for node_id, d in found
    }
    assigned = sorted({(topic, p) for ms in members.values() for m in ms for topic, ps in m.assignment or () for p in ps})
    with broker.db.read() as conn:
        committed = {gid: admin_reads.group_offsets_with_status(conn, gid) for gid in {d.group_id for _, d in found}}
        statuses = log_store.partition_statuses(conn, assigned)
    groups = []
    for node_id, d in found:
        ms = members[(node_id, d.group_id)]
        groups.append(
            KafkaGroup(
                d.group_id,
                node_id,
                d.error,
                d.state,
                d.protocol_type,
                d.protocol,
                tuple(ms),
                _partitions(ms, committed[d.group_id], statuses),
            )
        )
    return KafkaGroups([status for status, _ in answers], groups)


def _partitions(
    members: list[KafkaMember], committed: list[dict], statuses: dict[tuple[str, int], PartitionStatus]
) -> tuple[KafkaGroupPartition, ...]:
    owner = {(topic, p): m for m in members for topic, ps in m.assignment or () for p in ps}
    rows = {(c["topic"], c["partition"]): c for c in committed}
    out = []
    for tp in sorted(set(owner) | set(rows)):
        m, c, s = owner.get(tp), rows.get(tp), statuses.get(tp)
        out.append(
            KafkaGroupPartition(
                tp[0],
                tp[1],
                m.member_id if m else None,
                m.client_id if m else None,
                m.client_host if m else None,
                c["offset"] if c else None,
                c["committed_at_ms"] if c else None,
                c["log_start_offset"] if c else s.log_start_offset if s else None,
                c["last_stable_offset"] if c else s.last_stable_offset if s else None,
                c["high_watermark"] if c else s.high_watermark if s else None,
            )
        )
    return tuple(out)


def delete_group(broker: Broker, group_id: str, timeout_s: float = ADMIN_TIMEOUT_S) -> None:
    """DeleteGroups as Kafka's AdminClient sends it: to the group's coordinator, the live gateway
    the cluster's rule names (``app.domain.cluster``), which alone knows whether the group has
    members; it deletes the group with its offsets, committed and pending. With no live gateway
    no group has members, and the offsets are deleted here. Raises the coordinator's refusal
    (NON_EMPTY_GROUP, GROUP_ID_NOT_FOUND, ...), or COORDINATOR_NOT_AVAILABLE when it does not
    answer within ``timeout_s``."""
    nodes = {node_id: (host, port) for node_id, host, port in live_nodes(broker)}
    if not nodes:
        if not groups_service.delete_offsets(broker, group_id):
            raise TxlogError(ErrorCode.GROUP_ID_NOT_FOUND, f"Group {group_id!r} has neither members nor offsets")
        return
    node_id = coordinator_of(group_id, sorted(nodes))
    host, port = nodes[node_id]
    try:
        refused = delete_groups_at(host, port, [group_id], timeout_s).get(group_id, ErrorCode.UNKNOWN_SERVER_ERROR.name)
    except GatewayUnreachable as exc:
        raise TxlogError(
            ErrorCode.COORDINATOR_NOT_AVAILABLE, f"Group {group_id!r}'s coordinator, node {node_id} ({host}:{port}): {exc.reason}"
        ) from None
    if refused is not None:
        code = ErrorCode.__members__.get(refused, ErrorCode.UNKNOWN_SERVER_ERROR)
        raise TxlogError(code, f"Group {group_id!r}'s coordinator, node {node_id}, answered {refused}")
