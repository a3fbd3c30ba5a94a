"""The clients this gateway knows, as a RocketMQ proxy keeps them: by client id (the
``x-mq-client-id`` every call carries), with their type, the settings they sent over Telemetry
and their Telemetry streams to this gateway.

A Telemetry stream is the one way the gateway speaks first: commands are pushed onto a
client's stream (``push``) — the answer to its Settings now, RecoverOrphanedTransactionCommand
(the check-back of a half message) to a live producer next. A client that neither calls nor
keeps a stream open for ``EXPIRY_S`` (RocketMQ's proxy expires idle channels after two
minutes; clients heartbeat every ten seconds) is forgotten.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from app.wire.rocketmq.protocol import ClientType

EXPIRY_S = 120.0
# Telemetry commands waiting to leave for one stream; beyond it a push is refused (a client that
# stopped reading its stream is not worth the memory).
STREAM_BACKLOG = 1_000


@dataclass
class Client:
    client_id: str
    client_type: int = ClientType.CLIENT_TYPE_UNSPECIFIED
    settings: Any = None  # the Settings it last sent
    groups: set[str] = field(default_factory=set)  # consumer groups named in its heartbeats
    streams: list[asyncio.Queue[Any]] = field(default_factory=list)
    principal: str | None = None  # who signed its Telemetry stream (TXLOG_AUTH=token)
    streamed: bool = False  # it opened a Telemetry stream here
    seen: float = field(default_factory=time.monotonic)

    @property
    def topics(self) -> set[str]:
        """The topics it publishes, as its Settings name them."""
        if self.settings is None or not self.settings.HasField("publishing"):
            return set()
        return {resource.name for resource in self.settings.publishing.topics}


class Clients:
    """The registry; used on the event loop only."""

    def __init__(self) -> None:
        self._by_id: dict[str, Client] = {}
        self._streams: set[asyncio.Queue[Any]] = set()  # every stream open, forgotten clients' too

    def __len__(self) -> int:
        return len(self._by_id)

    def get(self, client_id: str) -> Client | None:
        return self._by_id.get(client_id)

    def seen(self, client_id: str, client_type: int | None = None, group: str | None = None) -> Client:
        """A call from ``client_id``: known from now on, its type and group noted."""
        self._expire()
        client = self._by_id.get(client_id)
        if client is None:
            client = self._by_id[client_id] = Client(client_id)
        client.seen = time.monotonic()
        if client_type:
            client.client_type = client_type
        if group:
            client.groups.add(group)
        return client

    def settings(self, client_id: str, settings: Any) -> Client:
        client = self.seen(client_id, settings.client_type if settings.HasField("client_type") else None)
        client.settings = settings
        return client

    def open_stream(self, client_id: str) -> asyncio.Queue[Any]:
        stream: asyncio.Queue[Any] = asyncio.Queue(STREAM_BACKLOG)
        client = self.seen(client_id)
        client.streams.append(stream)
        client.streamed = True
        self._streams.add(stream)
        return stream

    def close_stream(self, client_id: str, stream: asyncio.Queue[Any]) -> None:
        self._streams.discard(stream)
        client = self._by_id.get(client_id)
        if client is not None and stream in client.streams:
            client.streams.remove(stream)

    def push(self, client_id: str, command: Any) -> bool:
        """Send ``command`` (a TelemetryCommand) down the client's newest stream; False when it
        has none open here, or that stream's backlog is full."""
        client = self._by_id.get(client_id)
        if client is None or not client.streams:
            return False
        try:
            client.streams[-1].put_nowait(command)
        except asyncio.QueueFull:
            return False
        return True

    def terminated(self, client_id: str) -> None:
        """NotifyClientTermination: forgotten. Its streams are left for it to cancel, as a proxy
        leaves them (the Python client reads a stream the server ends as an error)."""
        self._by_id.pop(client_id, None)

    def online(self, client_id: str) -> bool:
        """Whether a client still counts as connected here, as a proxy tells a live channel: known
        (neither terminated nor idle for ``EXPIRY_S``) and, once it opened a Telemetry stream here,
        holding one still (a client killed ends its stream with its connection)."""
        self._expire()
        client = self._by_id.get(client_id)
        return client is not None and (bool(client.streams) or not client.streamed)

    def close(self) -> None:
        """The gateway stops: every client forgotten, every stream ended."""
        self._by_id = {}
        for stream in list(self._streams):
            try:
                stream.put_nowait(None)
            except asyncio.QueueFull:
                pass

    def publishers_of(self, topic: str) -> list[Client]:
        """Live producers that publish ``topic`` and hold a stream here, newest call first."""
        found = [c for c in self._by_id.values() if c.client_type == ClientType.PRODUCER and c.streams and topic in c.topics]
        return sorted(found, key=lambda c: c.seen, reverse=True)

    def published_topics(self) -> set[str]:
        """The topics live producers with a stream here publish: the producer groups whose
        check-backs this gateway can send (RocketMQ's proxy names a producer group by its topic)."""
        topics: set[str] = set()
        for c in self._by_id.values():
            if c.client_type == ClientType.PRODUCER and c.streams:
                topics |= c.topics
        return topics

    def _expire(self) -> None:
        deadline = time.monotonic() - EXPIRY_S
        for client_id in [c.client_id for c in self._by_id.values() if c.seen < deadline and not c.streams]:
            del self._by_id[client_id]
