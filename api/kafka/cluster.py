"""The cluster as one gateway process sees it: the node registry's live nodes, kept in memory.

Each gateway process is a broker under a node id it holds by a lease in the node registry
(``txlog.kafka_nodes``, ``app.services.cluster``):

- taken when the process starts; while another live process holds the id, it is refused
  (``NodeIdInUse``) once a lease has passed (the lease of a process that died lapses by then, so
  a restart after a crash takes its id back);
- renewed every third of TXLOG_KAFKA_NODE_LEASE_MS, so one late renewal does not lose it;
- given up when the process stops cleanly; a process that dies without giving it up drops out once
  its lease ends.

On the same beat the gateway reads the live nodes. Metadata and FindCoordinator answer from that
copy, so no request reads the registry. Every gateway applies ``app.domain.cluster``'s rules to
the same list, so all of them name the same partition leaders and group coordinators. A change
(a node starting, stopping or dying) reaches every gateway within a third of the lease after the
registry shows it. Until then two gateways can disagree: a group request sent to the wrong one is
answered NOT_COORDINATOR and the client asks FindCoordinator again. When a node joins, it takes its
groups at once, and the gateway that had one of them gives it up at its next read: for at most a
third of the lease both can have members of that group, each with its own generation.

What leading a partition or coordinating a group means here:

- **Partitions.** Leadership only spreads the clients' connections over the processes. Every
  record lives once, in PostgreSQL, and any gateway appends to and reads any partition under the
  partition's row lock. So a Produce or Fetch for a partition this gateway does not lead is served,
  where a Kafka broker would answer NOT_LEADER_OR_FOLLOWER. Clients send to the leader Metadata
  names anyway, and one that still holds the previous leader while the nodes change keeps working.
- **Transactions.** Any gateway coordinates any transactional id, because the transaction state
  lives in PostgreSQL under row locks: FindCoordinator names the gateway that was asked.
- **Consumer groups.** A group's members, generation and timers live in the memory of one gateway,
  its coordinator (``owns``). The others answer NOT_COORDINATOR. When the nodes change, the
  listeners registered with ``on_change`` run; the group coordinator then unloads the groups that
  moved, and their members find the new coordinator and join again.

- **Read replicas** (KIP-392). A gateway on a hot standby (TXLOG_REPLICA_DATABASE_URL) registers
  as a read replica, with its rack (TXLOG_KAFKA_RACK). The rules run over the other nodes only: a
  read replica leads no partition and coordinates no group; it follows every partition (Metadata's
  replicas), and a leader sends a consumer of its rack there (``preferred_read_replica``).

If another process takes this node id (this process could not renew its lease in time, and its
lease ended), this process is no longer that node: ``on_lost`` is called and the gateway stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Protocol

from api.kafka.handlers import Node
from app.domain import cluster as rules
from app.errors import ErrorCode, TxlogError
from app.services import Broker
from app.services import cluster as registry

CLUSTER_ID = "txlog"


class Cluster(Protocol):
    """Which nodes clients see, which one leads a partition and which one coordinates a group.
    Every node must answer the same for the same live nodes."""

    cluster_id: str

    def list_nodes(self) -> list[Node]: ...

    def leader_of(self, topic: str, partition: int) -> Node: ...

    def coordinator_of(self, key: str) -> Node: ...

    def listeners_of(self, node_id: int) -> list[tuple[str, str, int]]:
        """Where a node is advertised: (listener name, host, port), by name (Kafka's
        advertised.listeners)."""
        ...

    def read_replicas(self) -> list[int]:
        """The live read replicas: they follow every partition and lead none."""
        ...

    def preferred_read_replica(self, topic: str, partition: int, client_rack: str | None) -> int:
        """The read replica a consumer in ``client_rack`` fetches the partition from, or -1."""
        ...


class SingleNode:
    """A cluster of one node: this gateway leads every partition and coordinates every group."""

    def __init__(self, node: Node, cluster_id: str = CLUSTER_ID) -> None:
        self.node = node
        self.cluster_id = cluster_id

    def list_nodes(self) -> list[Node]:
        return [self.node]

    def leader_of(self, topic: str, partition: int) -> Node:
        return self.node

    def coordinator_of(self, key: str) -> Node:
        return self.node

    def listeners_of(self, node_id: int) -> list[tuple[str, str, int]]:
        return [("PLAINTEXT", self.node.host, self.node.port)] if node_id == self.node.node_id else []

    def read_replicas(self) -> list[int]:
        return []

    def preferred_read_replica(self, topic: str, partition: int, client_rack: str | None) -> int:
        return -1


log = logging.getLogger("txlog.kafka.cluster")


class NodeIdInUse(Exception):
    """Another live gateway process holds this node id."""


Endpoints = dict[str, tuple[str, int]]  # listener name -> advertised (host, port)


@dataclass(frozen=True)
class _View:
    """The live nodes at one moment, by node id, where each listens, by listener name, and which
    of them are read replicas."""

    nodes: tuple[Node, ...]
    endpoints: tuple[tuple[int, tuple[tuple[str, str, int], ...]], ...] = ()
    replicas: frozenset[int] = frozenset()

    @property
    def ids(self) -> tuple[int, ...]:
        """The nodes that lead partitions and coordinate groups: every live node but the read
        replicas (the replicas alone, while no other node is known, so a question is answered)."""
        leading = tuple(n.node_id for n in self.nodes if n.node_id not in self.replicas)
        return leading or tuple(n.node_id for n in self.nodes)

    def preferred_read_replica(self, topic: str, partition: int, client_rack: str | None) -> int:
        """The read replica a consumer in ``client_rack`` fetches the partition from, or -1
        (``app.domain.cluster.preferred_read_replica``)."""
        if not self.replicas or not client_rack:
            return -1
        leader = rules.leader_of(topic, partition, self.ids)
        racks = {n.node_id: n.rack for n in self.nodes}
        return rules.preferred_read_replica(topic, partition, client_rack, leader, racks, self.replicas)

    def by_id(self, node_id: int) -> Node:
        return next(n for n in self.nodes if n.node_id == node_id)

    def on_listener(self, listener: str) -> dict[int, Node]:
        """The nodes that have ``listener``, as a client of that listener reaches them."""
        racks = {n.node_id: n.rack for n in self.nodes}
        return {
            node_id: Node(node_id, host, port, racks.get(node_id))
            for node_id, listeners in self.endpoints
            for name, host, port in listeners
            if name == listener
        }


def _view(
    rows: Iterable[registry.LiveNode], own: Node, own_listeners: Endpoints, kept: _View | None = None, own_replica: bool = False
) -> _View:
    """The registry's live nodes, with this one in any case (it is alive: it is answering), and
    the nodes of ``kept`` the registry no longer lists."""
    nodes = {n.node_id: n for n in kept.nodes} if kept else {}
    endpoints: dict[int, Endpoints] = {i: {name: (h, p) for name, h, p in e} for i, e in kept.endpoints} if kept else {}
    replicas = set(kept.replicas) if kept else set()
    for row in rows:
        nodes[row.node_id] = Node(row.node_id, row.host, row.port, row.rack)
        endpoints[row.node_id] = dict(row.listeners)
        if row.read_replica:
            replicas.add(row.node_id)
        else:
            replicas.discard(row.node_id)
    nodes[own.node_id] = own
    endpoints[own.node_id] = dict(own_listeners)
    if own_replica:
        replicas.add(own.node_id)
    else:
        replicas.discard(own.node_id)
    return _View(
        tuple(nodes[i] for i in sorted(nodes)),
        tuple((i, tuple(sorted((name, h, p) for name, (h, p) in endpoints.get(i, {}).items()))) for i in sorted(nodes)),
        frozenset(replicas),
    )


class ListenerView:
    """The cluster as the clients of one listener see it (a ``Cluster``), as Kafka answers
    Metadata, FindCoordinator and DescribeCluster with the endpoints of the listener the client
    connected to: each node at its address on that listener, a node without that listener left
    out. Leaders and coordinators are the cluster's, whatever the listener: a partition led by a
    node without this listener names a leader that is not among the brokers (clients take it as
    unavailable and ask again), a group coordinated by one is COORDINATOR_NOT_AVAILABLE."""

    def __init__(self, cluster: RegistryCluster, listener: str) -> None:
        self.cluster = cluster
        self.listener = listener

    @property
    def cluster_id(self) -> str:
        return self.cluster.cluster_id

    def _nodes(self) -> tuple[_View, dict[int, Node]]:
        view = self.cluster._view
        return view, view.on_listener(self.listener)

    def list_nodes(self) -> list[Node]:
        _, nodes = self._nodes()
        return [nodes[i] for i in sorted(nodes)]

    def leader_of(self, topic: str, partition: int) -> Node:
        view, nodes = self._nodes()
        node_id = rules.leader_of(topic, partition, view.ids)
        return nodes.get(node_id) or view.by_id(node_id)

    def coordinator_of(self, key: str) -> Node:
        view, nodes = self._nodes()
        node_id = rules.coordinator_of(key, view.ids)
        if node_id not in nodes:
            raise TxlogError(
                ErrorCode.COORDINATOR_NOT_AVAILABLE,
                f"The coordinator of {key!r}, node {node_id}, has no listener {self.listener}",
            )
        return nodes[node_id]

    def listeners_of(self, node_id: int) -> list[tuple[str, str, int]]:
        return self.cluster.listeners_of(node_id)

    def read_replicas(self) -> list[int]:
        return self.cluster.read_replicas()

    def preferred_read_replica(self, topic: str, partition: int, client_rack: str | None) -> int:
        node_id = self.cluster.preferred_read_replica(topic, partition, client_rack)
        # a replica without this listener cannot be reached by this client: it stays with the leader
        return node_id if node_id in self._nodes()[1] else -1


class RegistryCluster:
    """A ``Cluster`` over the node registry: this process's node, registered and renewed,
    and the live nodes read on the same beat. ``start`` before serving, ``stop`` at a clean stop."""

    def __init__(
        self,
        broker: Broker,
        node: Node,
        *,
        on_lost: Callable[[], None] | None = None,
        listeners: dict[str, tuple[str, int, str]] | None = None,
        read_replica: bool = False,
    ) -> None:
        self.broker = broker
        self.node = node  # set the bound port before ``start`` when listening on port 0 (its rack: broker.rack)
        # A read replica (TXLOG_REPLICA_DATABASE_URL): registered as one, it leads no partition
        # and coordinates no group; clients in its rack are sent to it for their fetches.
        self.read_replica = read_replica
        # This process's listeners, advertised: {name: (host, port, security protocol)} (the bound
        # ports set before ``start``); recorded in the registry for the other gateways.
        self.listeners = dict(listeners or {})
        self.lease_ms = broker.settings.kafka_node_lease_ms
        self.cluster_id = ""
        self.lost: str | None = None  # why this process no longer holds its node id
        self._on_lost = on_lost
        self._view = _view((), node, self._own_endpoints(), own_replica=read_replica)
        self._listeners: list[Callable[[list[Node]], Any]] = []
        self._registration: registry.NodeRegistration | None = None
        self._task: asyncio.Task | None = None
        self._away = False  # the last beat could not reach the database
        self._keep_until = 0.0  # until then, nodes the registry drops stay in the view (see ``beat``)

    # -- the Cluster protocol (from memory) --------------------------------------------------------

    def list_nodes(self) -> list[Node]:
        return list(self._view.nodes)

    def leader_of(self, topic: str, partition: int) -> Node:
        view = self._view
        return view.by_id(rules.leader_of(topic, partition, view.ids))

    def coordinator_of(self, key: str) -> Node:
        view = self._view
        return view.by_id(rules.coordinator_of(key, view.ids))

    def owns(self, group_id: str) -> bool:
        """Whether this gateway coordinates the group (the group coordinator's ``owns``)."""
        return rules.coordinator_of(group_id, self._view.ids) == self.node.node_id

    def listeners_of(self, node_id: int) -> list[tuple[str, str, int]]:
        return next((list(e) for i, e in self._view.endpoints if i == node_id), [])

    def read_replicas(self) -> list[int]:
        """The live read replicas, in node id order: they follow every partition."""
        return sorted(self._view.replicas)

    def preferred_read_replica(self, topic: str, partition: int, client_rack: str | None) -> int:
        """The read replica a consumer in ``client_rack`` fetches the partition from, or -1: its
        leader. A read replica names none: a consumer it serves stays with it."""
        if self.read_replica:
            return -1
        return self._view.preferred_read_replica(topic, partition, client_rack)

    def for_listener(self, name: str) -> ListenerView:
        """The cluster as the clients of listener ``name`` see it."""
        return ListenerView(self, name)

    def _own_endpoints(self) -> Endpoints:
        return {name: (host, port) for name, (host, port, _) in self.listeners.items()}

    def on_change(self, listener: Callable[[list[Node]], Any]) -> None:
        """Call ``listener(nodes)`` on the event loop each time the live nodes change."""
        self._listeners.append(listener)

    # -- lifecycle ---------------------------------------------------------------------------------

    @property
    def interval_s(self) -> float:
        """How often the lease is renewed and the live nodes read: a third of the lease."""
        return self.lease_ms / 3000

    async def start(self) -> None:
        """Take this node's id, read the cluster id and the live nodes, and renew and read again
        every ``interval_s``.

        While another process holds the id, try again every ``interval_s`` for a lease and a
        third: the lease of a process that died (a restart after ``kill -9``) lapses meanwhile and
        the id is taken; a live holder keeps renewing, and ``NodeIdInUse`` is raised."""
        node = self.node
        loop = asyncio.get_running_loop()
        patience = self.lease_ms / 1000 + self.interval_s
        deadline = loop.time() + patience
        warned = False
        while True:
            try:
                self._registration = await asyncio.to_thread(
                    registry.register_node,
                    self.broker,
                    node.node_id,
                    node.host,
                    node.port,
                    self.lease_ms,
                    {name: {"host": h, "port": p, "security_protocol": sp} for name, (h, p, sp) in self.listeners.items()},
                    node.rack,
                    self.read_replica,
                )
                break
            except TxlogError as exc:
                if exc.details.get("reason") != "node_id_in_use":
                    raise
                if loop.time() >= deadline:
                    raise NodeIdInUse(exc.message) from None
                if not warned:
                    log.warning(
                        "node id %d is held by another process; trying again for %.1f s, in case it died", node.node_id, patience
                    )
                    warned = True
            await asyncio.sleep(self.interval_s)
        self.cluster_id = await asyncio.to_thread(registry.cluster_id, self.broker)
        self._update(await asyncio.to_thread(registry.live_node_entries, self.broker))
        self._task = asyncio.create_task(self._beating(), name=f"txlog-kafka-node-{node.node_id}-lease")

    async def stop(self) -> None:
        """Stop renewing and give the node id up (the others drop this node at their next read)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        registration, self._registration = self._registration, None
        if registration is not None and self.lost is None:
            try:
                await asyncio.to_thread(registry.deregister_node, self.broker, registration)
            except Exception:
                log.warning("could not give node id %d up; it lapses with its lease", registration.node_id, exc_info=True)

    async def beat(self) -> None:
        """Renew this node's lease and read the live nodes once (``NodeIdInUse`` if another
        process holds the id now).

        After beats that could not reach the database, the nodes this process knew stay in its
        view for one more lease even if the registry shows their lease lapsed: while the database
        was away (restarted, failed over, cut off) no gateway could renew, and the others renew at
        their next beat. Without it, the first gateway back would drop the others for a moment,
        moving partition leaders and group coordinators, and clients would forget brokers that
        never went away. A node that does not renew within that lease drops out as usual."""
        assert self._registration is not None, "start first"
        loop = asyncio.get_running_loop()
        try:
            rows = await asyncio.to_thread(self._renew_and_read, self._registration)
        except NodeIdInUse:
            raise
        except Exception:
            self._away = True
            raise
        if self._away:
            self._away = False
            self._keep_until = loop.time() + self.lease_ms / 1000
        kept = self._view if loop.time() < self._keep_until else None
        self._update(rows, kept)

    def _renew_and_read(self, registration: registry.NodeRegistration) -> list[registry.LiveNode]:
        try:
            registry.renew_node(self.broker, registration, self.lease_ms)
        except TxlogError as exc:
            if exc.details.get("reason") == "node_id_in_use":
                raise NodeIdInUse(exc.message) from None
            raise
        return registry.live_node_entries(self.broker)

    async def _beating(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.beat()
            except NodeIdInUse as exc:
                self.lost = exc.args[0]
                log.error("this gateway is no longer node %d: %s", self.node.node_id, self.lost)
                if self._on_lost is not None:
                    self._on_lost()
                return
            except TxlogError as exc:  # the database is away: keep the last view and try again
                log.warning("could not renew node %d's lease: %s", self.node.node_id, exc)
            except Exception:
                log.warning("could not renew node %d's lease", self.node.node_id, exc_info=True)

    def _update(self, rows: list[registry.LiveNode], kept: _View | None = None) -> None:
        view = _view(rows, self.node, self._own_endpoints(), kept, self.read_replica)
        if view == self._view:
            return
        moved = view.nodes != self._view.nodes or view.replicas != self._view.replicas
        self._view = view
        if not moved:
            return  # only where some node listens changed: leaders and coordinators stay
        log.info("cluster nodes: %s", ", ".join(f"{n.node_id} ({n.host}:{n.port})" for n in view.nodes))
        for listener in self._listeners:
            try:
                listener(list(view.nodes))
            except Exception:
                log.exception("a listener of the cluster's nodes failed")
