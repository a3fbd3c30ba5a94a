"""The gateway's entry in the registry of live RocketMQ gateways (``txlog.rocketmq_gateways``,
``app.services.cluster``), and the other live gateways as last read from it.

Each gateway enters its advertised address under a token of its own, with a lease of
``TXLOG_ROCKETMQ_GATEWAY_LEASE_MS``, and renews it and reads the live entries every third of the
lease. QueryRoute routes clients to this gateway and to every other live one; a gateway that
dies (``kill -9``) is dropped once its lease ends, one that stops cleanly at once. A gateway
listening on every address without an advertised host has no address to enter: it routes to the
others but is not entered itself. With the database away the last list read is kept.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Any, Awaitable, Callable, Protocol, TypeVar

from app.services import Broker
from app.services import cluster as registry

T = TypeVar("T")

log = logging.getLogger("txlog.rocketmq.peers")


class Gateway(Protocol):
    broker: Broker

    def blocking(self, fn: Callable[..., T], *args: Any) -> Awaitable[T]: ...


class Peers:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.token = secrets.token_hex(16)
        self.lease_ms = 0  # TXLOG_ROCKETMQ_GATEWAY_LEASE_MS, read at start
        self.address: tuple[str, int] | None = None  # entered in the registry (None: not entered)
        self.others: list[tuple[str, int]] = []  # the other live gateways, as last read
        self._task: asyncio.Task[None] | None = None

    async def start(self, address: tuple[str, int] | None) -> None:
        """Enter ``address`` (if any) and read the live gateways, then keep doing so."""
        self.address = address
        self.lease_ms = self.gateway.broker.settings.rocketmq_gateway_lease_ms
        try:
            await self.beat()
        except Exception as exc:  # the database away at start: the gateway serves, the next beat enters it
            log.warning("RocketMQ gateway registry not reached: %s", exc)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="rocketmq-peers")

    async def beat(self) -> None:
        broker = self.gateway.broker
        if self.address is not None:
            await self.gateway.blocking(registry.register_rocketmq_gateway, broker, self.token, *self.address, self.lease_ms)
        live = await self.gateway.blocking(registry.live_rocketmq_gateways, broker)
        self.others = [(host, port) for token, host, port in live if token != self.token and (host, port) != self.address]

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.lease_ms / 3000)
            try:
                await self.beat()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database away: the last list stands, the next beat retries
                log.warning("RocketMQ gateway registry not renewed: %s", exc)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        if self.address is not None:
            try:
                await self.gateway.blocking(registry.deregister_rocketmq_gateway, self.gateway.broker, self.token)
            except Exception as exc:  # its lease ends by itself
                log.warning("RocketMQ gateway registry entry not removed: %s", exc)
