"""The cluster that the Kafka gateway's processes form: its id and its nodes.

Each gateway process is a broker of the cluster under a node id it holds by a lease in the
database (``txlog.kafka_nodes``), renewed while it runs. Every gateway lists the live nodes from
there and spreads partition leadership and group coordination over them with
``app.domain.cluster``'s rules, so all of them tell a client the same.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any, Mapping

from app.errors import ErrorCode, TxlogError
from app.services import Broker
from app.storage import cluster as cluster_store


def cluster_id(broker: Broker) -> str:
    """The cluster's id, as Kafka's Metadata answers it: random, made once for the database."""
    with broker.db.transaction() as conn:
        found = cluster_store.cluster_id_get(conn)
        if found is None:
            cluster_store.cluster_id_create(conn)
            found = cluster_store.cluster_id_get(conn)
    assert found is not None
    return found


@dataclass(frozen=True)
class NodeRegistration:
    """A node id as one process holds it; ``token`` tells this process from any other."""

    node_id: int
    host: str
    port: int
    token: str
    # Every listener of the process: {name: {"host", "port", "security_protocol"}} (advertised).
    listeners: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, compare=False)
    rack: str | None = None  # Kafka's broker.rack
    read_replica: bool = False  # a read replica: serves Fetch from a hot standby, leads nothing


def _check_node(node_id: int, host: str, port: int, lease_ms: int) -> None:
    if not 0 <= node_id < 2**31:
        raise TxlogError(ErrorCode.INVALID_REQUEST, f"A node id is between 0 and {2**31 - 1}, not {node_id}")
    if not host or "\x00" in host:
        raise TxlogError(ErrorCode.INVALID_REQUEST, "A node's host must be a non-empty name or address")
    if not 1 <= port <= 65535:
        raise TxlogError(ErrorCode.INVALID_REQUEST, f"A node's port is between 1 and 65535, not {port}")
    if lease_ms <= 0:
        raise TxlogError(ErrorCode.INVALID_REQUEST, "A node's lease must be positive")


def _claim(broker: Broker, reg: NodeRegistration, lease_ms: int) -> None:
    with broker.db.transaction() as conn:
        if cluster_store.kafka_node_claim(
            conn, reg.node_id, reg.host, reg.port, reg.token, lease_ms, reg.listeners, reg.rack, reg.read_replica
        ):
            return
        holder = cluster_store.kafka_node_get(conn, reg.node_id)
    where = f" ({holder.host}:{holder.port})" if holder else ""
    raise TxlogError(
        ErrorCode.INVALID_REQUEST,
        f"Node id {reg.node_id} is held by another live gateway process{where}: give this one another node id, "
        "or start it once that process has stopped (its entry lapses when it stops renewing it)",
        reason="node_id_in_use",
    )


def register_node(
    broker: Broker,
    node_id: int,
    host: str,
    port: int,
    lease_ms: int,
    listeners: Mapping[str, Mapping[str, Any]] | None = None,
    rack: str | None = None,
    read_replica: bool = False,
) -> NodeRegistration:
    """Take ``node_id`` for this process, advertised at ``host``:``port`` (and at each of its
    ``listeners``: {name: {"host", "port", "security_protocol"}}), in ``rack`` (None: none), a
    ``read_replica`` or not, for ``lease_ms`` (the database's clock): INVALID_REQUEST (reason
    ``node_id_in_use``) while another process holds it; the id of a process that stopped
    renewing is free once its lease ends. Keep it with ``renew_node`` well within the lease."""
    _check_node(node_id, host, port, lease_ms)
    for endpoint in (listeners or {}).values():
        _check_node(node_id, str(endpoint.get("host", "")), int(endpoint.get("port", 0)), lease_ms)
    reg = NodeRegistration(node_id, host, port, secrets.token_hex(16), dict(listeners or {}), rack or None, read_replica)
    _claim(broker, reg, lease_ms)
    return reg


def renew_node(broker: Broker, registration: NodeRegistration, lease_ms: int) -> None:
    """Extend this process's lease on its node id to ``lease_ms`` from now. If the lease ended
    meanwhile and nobody took the id, it is taken again; if another process took it, the same
    error as ``register_node``'s: this process no longer is that node."""
    _check_node(registration.node_id, registration.host, registration.port, lease_ms)
    _claim(broker, registration, lease_ms)


def deregister_node(broker: Broker, registration: NodeRegistration) -> None:
    """Give the node id up at once (a clean stop); nothing if another process holds it now."""
    with broker.db.transaction() as conn:
        cluster_store.kafka_node_release(conn, registration.node_id, registration.token)


def live_nodes(broker: Broker) -> list[tuple[int, str, int]]:
    """(node id, host, port) of every node whose lease runs, in node id order."""
    with broker.db.read() as conn:
        return [(n.node_id, n.host, n.port) for n in cluster_store.kafka_nodes_live(conn)]


@dataclass(frozen=True)
class LiveNode:
    """A live node as the registry shows it."""

    node_id: int
    host: str
    port: int
    listeners: dict[str, tuple[str, int]]  # listener name -> advertised (host, port)
    rack: str | None = None
    read_replica: bool = False


def live_node_entries(broker: Broker) -> list[LiveNode]:
    """Every node whose lease runs, in node id order, with its advertised listeners, its rack and
    whether it is a read replica. A node registered without listeners (a gateway of an earlier
    version) lists none."""
    with broker.db.read() as conn:
        return [
            LiveNode(
                n.node_id,
                n.host,
                n.port,
                {name: (str(e["host"]), int(e["port"])) for name, e in n.listeners.items()},
                n.rack,
                n.read_replica,
            )
            for n in cluster_store.kafka_nodes_live(conn)
        ]


def live_node_listeners(broker: Broker) -> list[tuple[int, str, int, dict[str, tuple[str, int]]]]:
    """``live_nodes`` with each node's advertised listeners: {listener name: (host, port)}."""
    return [(n.node_id, n.host, n.port, n.listeners) for n in live_node_entries(broker)]


# --- RocketMQ gateways -----------------------------------------------------------------------------


def register_rocketmq_gateway(broker: Broker, token: str, host: str, port: int, lease_ms: int) -> None:
    """Enter (or renew) the RocketMQ gateway process ``token``, advertised at ``host``:``port``, for
    ``lease_ms``; renew well within the lease. Its own registry (not the Kafka nodes'): a RocketMQ
    gateway is routed to by QueryRoute and never listed by Kafka's Metadata."""
    _check_node(0, host, port, lease_ms)
    with broker.db.transaction() as conn:
        cluster_store.rocketmq_gateway_claim(conn, token, host, port, lease_ms)


def deregister_rocketmq_gateway(broker: Broker, token: str) -> None:
    """Leave the registry at once (a clean stop)."""
    with broker.db.transaction() as conn:
        cluster_store.rocketmq_gateway_release(conn, token)


def live_rocketmq_gateways(broker: Broker) -> list[tuple[str, str, int]]:
    """(process token, host, port) of every RocketMQ gateway whose lease runs."""
    with broker.db.transaction() as conn:
        return cluster_store.rocketmq_gateways_live(conn)
