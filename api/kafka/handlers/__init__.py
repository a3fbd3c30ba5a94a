"""What every handler receives, and how it calls a service.

A handler is ``async def handle(ctx: RequestContext, request) -> dict | None``:

- ``request`` is the decoded request; its fields are attributes named as in Kafka's JSON schemas,
  in snake_case (``request.topics[0].partition_data[0].records``).
- It returns the response body as plain data: a dict of snake_case field names whose nested
  structs are dicts and lists of dicts. ``app.wire.kafka.protocol`` builds the versioned response
  from it, so fields a version does not have are dropped and absent ones take the schema's defaults.
- ``None`` means no response (Produce with acks=0).
- An exception becomes an error response for the whole request, coded from ``TxlogError.code``
  (UNKNOWN_SERVER_ERROR for anything else): every request is answered.

Services are synchronous (SQLAlchemy, psycopg): ``await ctx.call(service, *args)`` runs one in
the gateway's thread pool, never on the event loop. The operations defined as steps (a produce,
AddPartitionsToTxn, EndTxn: ``app.services.executor``) run through ``ctx.loop_executor``, which
awaits their statements on the loop's own connections and their blocking steps in the pool.
"""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

from app.errors import DatabaseUnavailable, ErrorCode, TxlogError
from app.services import Broker

T = TypeVar("T")


def partition_code(exc: TxlogError) -> ErrorCode:
    """A partition's failure as a broker names it in Produce, Fetch and ListOffsets: the database
    away is KAFKA_STORAGE_ERROR, Kafka's answer for a partition whose log directory is offline.
    Clients take it as retriable and ask Metadata again, which answers the partition
    LEADER_NOT_AVAILABLE until the database is back (``bootstrap.handle_metadata``); the
    coordinators' APIs keep COORDINATOR_NOT_AVAILABLE, Kafka's answer for a coordinator that
    cannot serve."""
    return ErrorCode.KAFKA_STORAGE_ERROR if isinstance(exc, DatabaseUnavailable) else exc.code


@dataclass(frozen=True)
class Node:
    """A broker as clients see it: one gateway process."""

    node_id: int
    host: str
    port: int


@dataclass
class RequestContext:
    broker: Broker
    node: Node  # the gateway answering
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    client_host: str
    executor: Executor | None = None
    # Process-wide parts, set by the server: the cluster view (live nodes, partition leaders, group
    # coordinators), the consumer-group coordinator and the appends' notifier that wakes
    # long-polling fetches (``app.services.notify.AppendNotifier``; None: fetches do not wait).
    cluster: Any = None
    groups: Any = None
    notifier: Any = None
    # Where operations defined as steps run (``app.services.executor.LoopExecutor``).
    loop_executor: Any = None
    # The topics Metadata last read (``bootstrap.KnownTopics``): its answer while they cannot be read.
    known_topics: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, functools.partial(fn, *args, **kwargs))
