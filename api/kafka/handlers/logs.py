"""A partition's log as the admin APIs see it: DeleteRecords, DescribeLogDirs and
OffsetForLeaderEpoch, over ``app.services.retention`` and ``app.services.fetch``.

DeleteRecords (v0 to v2): each partition's log start moves to the offset asked
(``retention.delete_records``, the HTTP API's service), and is answered with its low watermark
(the log start offset after the request), or an error with low watermark -1. Offset -1 asks for
the log end; the log start never passes the last stable offset, so that no open transaction loses
records: -1 stops there, and an offset past it is OFFSET_OUT_OF_RANGE (Kafka's bound is the high
watermark; with no transaction open the two are the same). A partition that does not exist is
UNKNOWN_TOPIC_OR_PARTITION. There is one replica to wait for, the log itself, so the answer comes
as soon as the database has committed: ``timeout_ms`` bounds nothing more.

DescribeLogDirs (v0 to v4): one log directory, ``LOG_DIR``, holding the replicas this gateway
leads in Metadata (each partition has one replica, its leader, ``api.kafka.cluster``), so that a
tool asking every broker counts every partition once. Each partition's size is the bytes of its
log from the log start to the high watermark, as retention.bytes counts it
(``retention.log_sizes``); its offset lag is 0 (the log end is the high watermark) and it is
never a future log. Null topics ask for every partition; a topic or partition that does not exist
is left out, as Kafka leaves out a replica it does not host. The volume's total and usable bytes
(v4) are unknown, -1: the log lives in PostgreSQL, whose disk the gateway cannot see. While the
database cannot be read the directory is answered KAFKA_STORAGE_ERROR, without topics (a log
directory offline).

OffsetForLeaderEpoch (v0 to v4): the whole log was written at one leader epoch (the one Metadata
names), so each partition answers by ``log.epoch_end_offset``: the leader's epoch ends at the log
end offset, an epoch above it (or -1) has no end (-1, -1: no error), one below it ends at the log
start. A current leader epoch older than the leader's is FENCED_LEADER_EPOCH, a newer one
UNKNOWN_LEADER_EPOCH. librdkafka validates a consumer's position with it (v2, KIP-320) once it is
advertised: a committed offset at or below the log end is kept as it is. Any gateway answers any
partition, as it serves its fetches; ``replica_id`` (v3+) is not used.

ACLs, as Kafka: DeleteRecords needs Delete on each topic, OffsetForLeaderEpoch ClusterAction on the
cluster or Describe on each topic (else that topic's partitions are TOPIC_AUTHORIZATION_FAILED);
DescribeLogDirs needs Describe on the cluster (else CLUSTER_AUTHORIZATION_FAILED, no directory).
"""

from __future__ import annotations

from typing import Any, Sequence

from api.kafka.handlers import RequestContext, access, error_code
from app.domain.acls import Api
from app.domain.log import NO_EPOCH, NO_EPOCH_OFFSET, EpochEndOffset
from app.errors import ErrorCode, TxlogError
from app.services import Broker, retention
from app.services import fetch as fetch_service
from app.wire.kafka.messages import ApiKey

# The one log directory every gateway names: the records are in PostgreSQL, not under a path.
LOG_DIR = "/txlog"
_NO_LOW_WATERMARK = -1  # Kafka's DeleteRecordsResponse.INVALID_LOW_WATERMARK
_UNKNOWN_BYTES = -1  # DescribeLogDirs v4's total and usable bytes, not known


# -- DeleteRecords -------------------------------------------------------------------------------


async def handle_delete_records(ctx: RequestContext, request: Any) -> dict:
    asked = [(topic.name, part.partition_index, part.offset) for topic in request.topics for part in topic.partitions]
    refused = access.refused(ctx, Api.DELETE_RECORDS, "topic", (t for t, _, _ in asked))
    allowed = [a for a in asked if a[0] not in refused]
    done = iter(await ctx.call(_delete_each, ctx.broker, allowed) if allowed else ())
    answers = iter(
        [
            {"partition_index": p, "low_watermark": _NO_LOW_WATERMARK, "error_code": refused[t].code.kafka_code}
            if t in refused
            else next(done)
            for t, p, _ in asked
        ]
    )
    return {
        "throttle_time_ms": 0,
        "topics": [{"name": topic.name, "partitions": [next(answers) for _ in topic.partitions]} for topic in request.topics],
    }


def _delete_each(broker: Broker, asked: Sequence[tuple[str, int, int]]) -> list[dict]:
    """Each partition's deletion, its own database transaction (one that fails leaves the others
    done), in the gateway's thread pool."""
    answers = []
    for topic, partition, offset in asked:
        try:
            result = retention.delete_records(broker, topic, partition, offset)
        except TxlogError as exc:
            code = error_code(ApiKey.DeleteRecords, exc).kafka_code
            answers.append({"partition_index": partition, "low_watermark": _NO_LOW_WATERMARK, "error_code": code})
        else:
            answers.append({"partition_index": partition, "low_watermark": result.log_start_offset, "error_code": 0})
    return answers


# -- DescribeLogDirs -----------------------------------------------------------------------------


async def handle_describe_log_dirs(ctx: RequestContext, request: Any) -> dict:
    refused = access.refusal(ctx, Api.DESCRIBE_LOG_DIRS)
    if refused is not None:
        return {"throttle_time_ms": 0, "error_code": refused.code.kafka_code, "results": []}
    wanted: dict[str, set[int]] | None = None
    if request.topics is not None:
        wanted = {}
        for topic in request.topics:
            wanted.setdefault(topic.topic, set()).update(topic.partitions)
    try:
        sizes = await ctx.call(retention.log_sizes, ctx.broker, None if wanted is None else sorted(wanted))
    except TxlogError as exc:
        code = error_code(ApiKey.DescribeLogDirs, exc).kafka_code
        return {"throttle_time_ms": 0, "error_code": 0, "results": [_log_dir(code, [])]}
    own = ctx.node.node_id
    topics: dict[str, list[dict]] = {}
    for s in sizes:
        if wanted is not None and s.partition not in wanted[s.topic]:
            continue
        if ctx.cluster.leader_of(s.topic, s.partition).node_id != own:
            continue
        topics.setdefault(s.topic, []).append(
            {"partition_index": s.partition, "partition_size": s.size_bytes, "offset_lag": 0, "is_future_key": False}
        )
    return {
        "throttle_time_ms": 0,
        "error_code": 0,
        "results": [_log_dir(0, [{"name": name, "partitions": parts} for name, parts in topics.items()])],
    }


def _log_dir(code: int, topics: list[dict]) -> dict:
    return {
        "error_code": code,
        "log_dir": LOG_DIR,
        "topics": topics,
        "total_bytes": _UNKNOWN_BYTES,
        "usable_bytes": _UNKNOWN_BYTES,
    }


# -- OffsetForLeaderEpoch ------------------------------------------------------------------------


async def handle_offset_for_leader_epoch(ctx: RequestContext, request: Any) -> dict:
    fenced = ctx.api_version >= 2  # current_leader_epoch from v2
    asked = [
        (topic.topic, part.partition, part.current_leader_epoch if fenced else NO_EPOCH, part.leader_epoch)
        for topic in request.topics
        for part in topic.partitions
    ]
    refused = access.refused(ctx, Api.OFFSET_FOR_LEADER_EPOCH, "topic", (a[0] for a in asked))
    allowed = [a for a in asked if a[0] not in refused]
    try:
        results = await ctx.call(fetch_service.epoch_end_offsets, ctx.broker, allowed) if allowed else []
        found = iter([_epoch_end(r.partition, r.end, r.error) for r in results])
    except TxlogError as exc:
        found = iter([_epoch_end(partition, None, exc) for _, partition, _, _ in allowed])
    answers = iter([_epoch_end(a[1], None, refused[a[0]]) if a[0] in refused else next(found) for a in asked])
    return {
        "throttle_time_ms": 0,
        "topics": [{"topic": topic.topic, "partitions": [next(answers) for _ in topic.partitions]} for topic in request.topics],
    }


def _epoch_end(partition: int, end: EpochEndOffset | None, error: TxlogError | None) -> dict:
    """A partition's answer: its epoch's end, or its error with Kafka's undefined epoch and offset."""
    if end is None:
        code = (
            error_code(ApiKey.OffsetForLeaderEpoch, error).kafka_code
            if error is not None
            else ErrorCode.UNKNOWN_SERVER_ERROR.kafka_code
        )
        return {"error_code": code, "partition": partition, "leader_epoch": NO_EPOCH, "end_offset": NO_EPOCH_OFFSET}
    return {"error_code": 0, "partition": partition, "leader_epoch": end.leader_epoch, "end_offset": end.end_offset}
