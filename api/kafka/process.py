"""The Kafka gateway as a process (``txlog kafka``): its node id taken in the registry, its listeners
bound, served until SIGTERM or SIGINT on uvloop; and the parsing of ``HOST:PORT`` that the CLI's
listener options share."""

from __future__ import annotations

import asyncio
import signal
import sys
from concurrent.futures import ThreadPoolExecutor

from api.kafka.cluster import NodeIdInUse, RegistryCluster
from api.kafka.handlers import Node
from api.kafka.server import Gateway, ListenError, advertised_host, log
from app import memory
from app.domain.listeners import Listener
from app.services import Broker
from app.services.group_coordinator import GroupCoordinator

__all__ = ["ListenError", "NodeIdInUse", "advertised_host", "parse_listen", "run", "serve"]


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9092`` for IPv6) as a host and a port."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"expected HOST:PORT, not {listen!r}")
    return host.strip("[]"), int(port)


async def serve(broker: Broker, listeners: list[Listener], advertised: dict[str, tuple[str, int]], node_id: int) -> None:
    """Run a gateway on ``listeners`` until SIGTERM or SIGINT."""
    settings = broker.settings
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    with ThreadPoolExecutor(max_workers=settings.db_pool_size, thread_name_prefix="txlog-kafka") as executor:
        first = listeners[0]
        host, port = advertised[first.name]
        node = Node(node_id, host, port, settings.kafka_rack or None)
        endpoints = {lst.name: (*advertised[lst.name], lst.security_protocol) for lst in listeners}
        cluster = RegistryCluster(
            broker, node, on_lost=stop.set, listeners=endpoints, read_replica=bool(settings.replica_database_url)
        )
        groups = GroupCoordinator.from_settings(settings, owns=cluster.owns)
        gateway = Gateway(broker, node, cluster=cluster, executor=executor, groups=groups)
        # the nodes changed: the groups that moved to another gateway are unloaded
        cluster.on_change(lambda nodes: groups.resign())
        bound = await _start_node(gateway, cluster, listeners, advertised)
        memory.settle()
        for listener in listeners:
            shown = gateway.listeners[listener.name].node
            print(
                f"txlog kafka gateway listener {listener.name} ({listener.security_protocol}) on "
                f"{listener.host or '*'}:{bound[listener.name]} ({shown.host}:{shown.port} for clients)",
                file=sys.stderr,
                flush=True,
            )
        role = f", a read replica in rack {node.rack}" if gateway.replica is not None else ""
        print(f"txlog kafka gateway as node {node_id}{role}, serving {len(gateway.routes)} API keys", file=sys.stderr, flush=True)
        await stop.wait()
        log.info("stopping")
        await cluster.stop()
        await gateway.stop()
    if cluster.lost is not None:
        raise NodeIdInUse(f"stopped, no longer node {node_id}: {cluster.lost}")


async def _start_node(
    gateway: Gateway, cluster: RegistryCluster, listeners: list[Listener], advertised: dict[str, tuple[str, int]]
) -> dict[str, int]:
    """Take the node id and listen; the bound ports. A node id held by another live process stops
    the start before the ports are bound (after, when a listener's port is 0: the registry must
    show the bound one)."""
    ephemeral = any(advertised[listener.name][1] == 0 for listener in listeners)
    if not ephemeral:
        await cluster.start()
    try:
        bound = await gateway.start_listeners(listeners, advertised)
    except ListenError:
        await cluster.stop()
        raise
    if ephemeral:
        cluster.listeners = {
            name: (listening.node.host, listening.node.port, listening.listener.security_protocol)
            for name, listening in gateway.listeners.items()
        }
        first = gateway.listeners[listeners[0].name].node
        gateway.node = cluster.node = first
        try:
            await cluster.start()
        except BaseException:
            await gateway.stop()
            raise
    return bound


def run(broker: Broker, listeners: list[Listener], advertised: dict[str, tuple[str, int]], node_id: int) -> None:
    """``serve`` on uvloop when it is installed."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop comes with uvicorn[standard]
        asyncio.run(serve(broker, listeners, advertised, node_id))
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(serve(broker, listeners, advertised, node_id))
