"""What every handler receives, and how it calls a service.

A handler is ``async def handle(ctx: RequestContext, request) -> dict | None``:

- ``request`` is the decoded request; its fields are attributes named as in Kafka's JSON schemas,
  in snake_case (``request.topics[0].partition_data[0].records``).
- It returns the response body as plain data: a dict of snake_case field names whose nested
  structs are dicts and lists of dicts. ``app.wire.kafka.structs`` builds the versioned response
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
from app.wire.kafka.messages import ApiKey

T = TypeVar("T")


# What a Kafka broker answers, API by API, when it cannot reach its storage in time: the database
# away (``DatabaseUnavailable``) or too slow (REQUEST_TIMED_OUT: a lock wait or statement past its
# limit, no pooled connection free). Each is retriable and retried quietly by librdkafka,
# kafka-python and aiokafka, where COORDINATOR_NOT_AVAILABLE or REQUEST_TIMED_OUT everywhere would
# not be (librdkafka hands a Fetch's to the application and aborts a transaction on an EndTxn's
# REQUEST_TIMED_OUT; aiokafka's transactional producer fails on it and resets a group's position
# on an OffsetFetch error it does not see per partition):
# - a partition's log: KAFKA_STORAGE_ERROR, Kafka's answer for a log directory offline (clients
#   refresh their metadata, which keeps the brokers and leaders, ``bootstrap.handle_metadata``).
#   A Produce that timed out stays REQUEST_TIMED_OUT: its batch may have been appended, and the
#   client's retry with the same sequence is answered as a duplicate;
# - reads of a group or transaction coordinator's state: COORDINATOR_LOAD_IN_PROGRESS, a coordinator loading;
# - writes to a group or transaction coordinator: COORDINATOR_NOT_AVAILABLE, as Kafka maps its own
#   storage timeouts there;
# - a topic to create, grow or delete, topic configs, SCRAM credentials and client quotas:
#   REQUEST_TIMED_OUT, a controller that did not answer in time; so are the ACLs to describe,
#   create or delete (their checks are answered from the authorizer's snapshot, kept while the
#   database is away).
# ApiVersions, FindCoordinator and the classic group membership answer from memory, and Metadata
# and DescribeTopicPartitions from what they read before (``bootstrap.handle_metadata``).
_STORAGE_AWAY = {
    ApiKey.Produce: ErrorCode.KAFKA_STORAGE_ERROR,
    ApiKey.Fetch: ErrorCode.KAFKA_STORAGE_ERROR,
    ApiKey.ListOffsets: ErrorCode.KAFKA_STORAGE_ERROR,
    ApiKey.DeleteRecords: ErrorCode.KAFKA_STORAGE_ERROR,
    ApiKey.DescribeLogDirs: ErrorCode.KAFKA_STORAGE_ERROR,
    ApiKey.OffsetForLeaderEpoch: ErrorCode.KAFKA_STORAGE_ERROR,
    ApiKey.OffsetFetch: ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ApiKey.DescribeGroups: ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ApiKey.ListGroups: ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ApiKey.OffsetCommit: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ApiKey.DeleteGroups: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ApiKey.OffsetDelete: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ApiKey.InitProducerId: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ApiKey.AddPartitionsToTxn: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ApiKey.AddOffsetsToTxn: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ApiKey.TxnOffsetCommit: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ApiKey.EndTxn: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ApiKey.CreateTopics: ErrorCode.REQUEST_TIMED_OUT,
    ApiKey.CreatePartitions: ErrorCode.REQUEST_TIMED_OUT,
    ApiKey.DeleteTopics: ErrorCode.REQUEST_TIMED_OUT,
    ApiKey.DescribeConfigs: ErrorCode.REQUEST_TIMED_OUT,
    ApiKey.AlterConfigs: ErrorCode.REQUEST_TIMED_OUT,
    ApiKey.IncrementalAlterConfigs: ErrorCode.REQUEST_TIMED_OUT,
    ApiKey.ListTransactions: ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ApiKey.DescribeTransactions: ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ApiKey.DescribeProducers: ErrorCode.KAFKA_STORAGE_ERROR,
    ApiKey.WriteTxnMarkers: ErrorCode.KAFKA_STORAGE_ERROR,
    ApiKey.DescribeUserScramCredentials: ErrorCode.REQUEST_TIMED_OUT,
    ApiKey.AlterUserScramCredentials: ErrorCode.REQUEST_TIMED_OUT,
    ApiKey.DescribeClientQuotas: ErrorCode.REQUEST_TIMED_OUT,
    ApiKey.AlterClientQuotas: ErrorCode.REQUEST_TIMED_OUT,
    ApiKey.DescribeAcls: ErrorCode.REQUEST_TIMED_OUT,
    ApiKey.CreateAcls: ErrorCode.REQUEST_TIMED_OUT,
    ApiKey.DeleteAcls: ErrorCode.REQUEST_TIMED_OUT,
    # Share groups: the membership is a group coordinator's write, its description a read; the
    # share partitions' delivery state is their log's.
    ApiKey.ShareGroupHeartbeat: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ApiKey.ShareGroupDescribe: ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ApiKey.ShareFetch: ErrorCode.KAFKA_STORAGE_ERROR,
    ApiKey.ShareAcknowledge: ErrorCode.KAFKA_STORAGE_ERROR,
    ApiKey.DescribeShareGroupOffsets: ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ApiKey.AlterShareGroupOffsets: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ApiKey.DeleteShareGroupOffsets: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    # KIP-848 consumer groups, likewise: a heartbeat writes, a description reads.
    ApiKey.ConsumerGroupHeartbeat: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ApiKey.ConsumerGroupDescribe: ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
}


def error_code(api_key: int, exc: TxlogError) -> ErrorCode:
    """The error ``exc`` is answered with in a response of ``api_key`` (see ``_STORAGE_AWAY``)."""
    timed_out = exc.code is ErrorCode.REQUEST_TIMED_OUT
    if not (timed_out or isinstance(exc, DatabaseUnavailable)) or (timed_out and api_key == ApiKey.Produce):
        return exc.code
    return _STORAGE_AWAY.get(api_key, exc.code)


@dataclass(frozen=True)
class Node:
    """A broker as clients see it: one gateway process."""

    node_id: int
    host: str
    port: int
    rack: str | None = None  # Kafka's broker.rack


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
    # Who is asking: the principal the connection authenticated as (SASL or a client certificate),
    # and the authorizer that decides what it may do (``app.services.security.Authorizer``). Both
    # None when the gateway authenticates no one (TXLOG_AUTH=none): every request is allowed.
    principal: str | None = None
    authorizer: Any = None
    session: Any = None  # the connection's authentication (``handlers.sasl.Session``)
    # Client quotas (``app.services.quotas.QuotaManager``; None: none enforced), and the throttle
    # time a handler answered with: the connection is muted that long after the answer (KIP-219).
    quotas: Any = None
    throttle_ms: int = 0
    # A read replica gateway's standby (a ``Broker`` over TXLOG_REPLICA_DATABASE_URL): Fetch and
    # ListOffsets read there. None: this gateway reads the primary, as every other request does.
    replica: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, functools.partial(fn, *args, **kwargs))
