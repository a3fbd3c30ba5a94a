"""Fetch and ListOffsets: the log as ``app.services.fetch`` reads it, in Kafka's record batches.

Fetch (v4 to v12, topics by name):

- Every requested partition is answered, in the order asked, each with its own error
  (UNKNOWN_TOPIC_OR_PARTITION, OFFSET_OUT_OF_RANGE with the high watermark and log start offset):
  a consumer checks that a full fetch names exactly the partitions it asked for.
- A partition's records are one ``fetch_log`` page (data, transaction markers and records of
  aborted transactions alike, so a consumer's position moves past markers), encoded as batches
  whose base offset is the page's first offset: a fetch from the middle of what a producer sent as
  one batch starts exactly there. read_committed pages end at the last stable offset and carry the
  aborted transactions a consumer skips records by; read_uncommitted ones carry none (null).
- Sizes are of the encoded batches (a page is cut where its batches could pass the limit, record
  and batch headers counted at their largest). Each partition gets at most its
  ``partition_max_bytes`` and what is left of the request's ``max_bytes``; the first record of the
  first partition that has any is sent whatever its size, so a consumer always moves on (KIP-74).
  Once what is left of the request's budget bounds the partitions after, a partition whose first
  record cannot fit in it is answered its offsets and no records, its log not read (one statement
  sizes all those first records): a consumer of 1,000 partitions gets a few dozen partitions'
  records a Fetch, and would otherwise pay a page statement for each of the others.
  Records are stored one per row, so that first record is a batch of its own when it alone is
  above the limit, where Kafka would send the whole batch the producer wrote.
- No incremental fetch sessions: ``session_id`` is always 0, which every client takes as "send the
  full list each time"; forgotten topics and the session epoch are ignored.
- Long-poll: when the records come to less than ``min_bytes``, some partition was asked for and
  none failed, the fetch waits, for at most ``max_wait_ms`` (bounded by TXLOG_MAX_FETCH_WAIT_MS,
  and not at all while TXLOG_MAX_LONG_POLLS fetches already wait in this process), on the
  process's append notifications, and reads again after each append to one of its partitions. It
  holds no thread while it waits, and answers at the deadline with what there is (a
  read_committed fetch whose last stable offset does not move included).
- While the database is away or too slow, a partition is answered KAFKA_STORAGE_ERROR
  (``handlers.error_code``), when ``max_wait_ms`` ends rather than at once.

Any gateway reads any partition, its leader in Metadata or not (no NOT_LEADER_OR_FOLLOWER): the
log is one, in PostgreSQL (``api.kafka.cluster``).

Read replicas (KIP-392, fetch from follower): a gateway of the primary answers a partition of a
consumer that sends its rack (Fetch v11+, client.rack) with the read replica of that rack that the
cluster names (``app.domain.cluster.preferred_read_replica``), and no records: the consumer fetches
the partition there, and the fetch is answered at once, as Kafka's leader answers it. A read
replica gateway (TXLOG_REPLICA_DATABASE_URL) reads its hot standby (``fetch.fetch_log_on_replica``)
and names no other replica. Its long poll also reads the standby again every
TXLOG_REPLICA_POLL_INTERVAL_MS: the primary's append notifications (LISTEN does not work on a
standby) come before the standby has replayed the append.

ACLs: each topic needs Read for Fetch, Describe for ListOffsets, else its partitions are
TOPIC_AUTHORIZATION_FAILED (whether it exists or not), as Kafka answers them.

ListOffsets (v1 to v7): per partition the log start (-2), the reader's end (-1: the high watermark,
or from v2 the last stable offset for read_committed), the record with the largest timestamp (-3),
or the first offset whose timestamp is at or after a timestamp >= 0 — offset and timestamp -1
when there is none.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from api.kafka.handlers import RequestContext, access, error_code
from api.kafka.handlers.quotas import fetch_max_bytes, fetch_throttle
from app.domain.acls import Api
from app.domain.log import LEADER_EPOCH, header_count, records_size
from app.domain.records import IsolationLevel
from app.errors import ErrorCode, TxlogError
from app.services import Broker
from app.services import fetch as fetch_service
from app.services.notify import wait_for_records
from app.wire.kafka.messages import ApiKey
from app.wire.kafka.records import encode
from app.wire.kafka.records.batch import HEADER_SIZE

_ISOLATION_LEVELS: dict[int, IsolationLevel] = {0: "read_uncommitted", 1: "read_committed"}
_NO_OFFSET = -1
_NO_LEADER_EPOCH = -1
_NO_READ_REPLICA = -1
_SESSIONLESS = 0
# The most a record adds to its key, value and header bytes once encoded: its length, attributes,
# timestamp delta (a varlong), offset delta, key length, value length and header count, each
# varint at its longest (a control record's key and value, not counted in its size, fit in this
# too); and the two lengths of each header.
_RECORD_OVERHEAD_MAX = 5 + 1 + 10 + 5 + 5 + 5 + 5
_HEADER_OVERHEAD_MAX = 5 + 5
# A budget below this holds no record batch: what is left of a Fetch's max_bytes once it is
# smaller reads no more rows, only the statuses of the partitions still to answer.
_SMALLEST_BATCH = HEADER_SIZE + _RECORD_OVERHEAD_MAX


def _isolation(level: int) -> IsolationLevel:
    try:
        return _ISOLATION_LEVELS[level]
    except KeyError:
        raise TxlogError(ErrorCode.INVALID_REQUEST, f"Unknown isolation level {level}") from None


# -- Fetch ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Wanted:
    topic: str
    partition: int
    offset: int
    max_bytes: int


@dataclass(frozen=True)
class _Read:
    """One reading of every requested partition."""

    partitions: list[dict]  # the answers, in request order
    size: int  # bytes of records in them
    failed: bool  # some partition answered an error
    storage_away: bool = False  # some partition could not be read: the database is away or too slow
    redirected: bool = False  # some partition is answered with a preferred read replica


async def handle_fetch(ctx: RequestContext, request: Any) -> dict:
    isolation = _isolation(request.isolation_level)
    wanted = [
        _Wanted(topic.topic, part.partition, part.fetch_offset, part.partition_max_bytes)
        for topic in request.topics
        for part in topic.partitions
    ]
    refused = access.refused(ctx, Api.FETCH, "topic", (t.topic for t in request.topics))
    settings = ctx.broker.settings
    started = time.monotonic()
    quotas = ctx.quotas is not None and ctx.quotas.enabled
    max_bytes = fetch_max_bytes(ctx, request.max_bytes) if quotas else request.max_bytes
    reading = [0.0]  # seconds spent reading, not waiting for records: the request's handler time
    rack = request.rack_id if ctx.api_version >= 11 else None
    redirect = _redirects(ctx, wanted, refused, rack) if rack and ctx.replica is None else {}

    async def read_once() -> _Read:
        began = time.perf_counter()
        try:
            return await ctx.call(_read, ctx.broker, wanted, max_bytes, isolation, refused, ctx.replica, redirect)
        finally:
            reading[0] += time.perf_counter() - began

    poll_s = settings.replica_poll_interval_ms / 1000
    read = await wait_for_records(
        ctx.notifier if wanted else None,
        [(w.topic, w.partition) for w in wanted if w.topic not in refused],
        request.max_wait_ms,
        settings.max_fetch_wait_ms,
        settings.max_long_polls,
        read_once
        if quotas
        else lambda: ctx.call(_read, ctx.broker, wanted, max_bytes, isolation, refused, ctx.replica, redirect),
        lambda read: read.size >= request.min_bytes or read.failed or read.redirected,
        (lambda read: poll_s) if ctx.replica is not None else None,
    )
    if quotas:
        ctx.throttle_ms = fetch_throttle(ctx, read.size, reading[0])
        if ctx.throttle_ms:  # Kafka's throttled Fetch: no records, the throttle time
            return {"throttle_time_ms": ctx.throttle_ms, "error_code": 0, "session_id": _SESSIONLESS, "responses": []}
    if read.storage_away:
        # Answered when the wait asked for ends, as a long poll that found nothing: clients retry a
        # KAFKA_STORAGE_ERROR at once (aiokafka without any pause), which would spin for as long as
        # the database is away.
        left = min(request.max_wait_ms, settings.max_fetch_wait_ms) / 1000 - (time.monotonic() - started)
        if left > 0:
            await asyncio.sleep(left)
    answers = iter(read.partitions)
    return {
        "throttle_time_ms": 0,
        "error_code": 0,
        "session_id": _SESSIONLESS,
        "responses": [
            {"topic": topic.topic, "partitions": [next(answers) for _ in topic.partitions]} for topic in request.topics
        ],
    }


def _redirects(
    ctx: RequestContext, wanted: Sequence[_Wanted], refused: Mapping[str, TxlogError], rack: str
) -> dict[tuple[str, int], int]:
    """The partitions a consumer in ``rack`` is sent to a read replica for, and that replica."""
    found = {}
    for w in wanted:
        if w.topic not in refused:
            node_id = ctx.cluster.preferred_read_replica(w.topic, w.partition, rack)
            if node_id >= 0:
                found[(w.topic, w.partition)] = node_id
    return found


def _read(
    broker: Broker,
    wanted: Sequence[_Wanted],
    max_bytes: int,
    isolation: IsolationLevel,
    refused: Mapping[str, TxlogError],
    replica: Broker | None = None,
    redirect: Mapping[tuple[str, int], int] | None = None,
) -> _Read:
    """Each partition's page and its record batches, in the gateway's thread pool: the byte budget
    passes from one partition to the next, as a Kafka broker reads them. A topic ``refused`` is
    answered its error, unread; a partition in ``redirect`` its preferred read replica and its
    status, no records (one statement for all of them). ``replica``: the standby a read replica
    gateway reads the log from, a partition at a time; otherwise every partition is read in one
    snapshot (``fetch_service.LogReader``)."""
    if replica is not None:

        def on_replica(w: _Wanted, limit: int) -> fetch_service.LogPage:
            return fetch_service.fetch_log_on_replica(replica, broker, w.topic, w.partition, w.offset, limit, isolation)

        return _read_pages(broker, wanted, max_bytes, refused, redirect, on_replica)
    readable = [(w.topic, w.partition) for w in wanted if w.topic not in refused]
    with fetch_service.LogReader(broker, readable) as reader:
        return _read_pages(
            broker,
            wanted,
            max_bytes,
            refused,
            redirect,
            lambda w, limit: reader.page(w.topic, w.partition, w.offset, limit, isolation),
            lambda left: reader.record_sizes([(w.topic, w.partition, w.offset) for w in left if w.topic not in refused]),
        )


def _read_pages(
    broker: Broker,
    wanted: Sequence[_Wanted],
    max_bytes: int,
    refused: Mapping[str, TxlogError],
    redirect: Mapping[tuple[str, int], int] | None,
    read_page: Callable[[_Wanted, int], fetch_service.LogPage],
    record_sizes: Callable[[Sequence[_Wanted]], Mapping[tuple[str, int, int], int]] | None = None,
) -> _Read:
    """``record_sizes``: the sizes of the records the partitions left start at, asked once the
    request's budget rather than a partition's own bounds what the next may get: a partition whose
    first record cannot fit in what is left is then answered its status, unread. Without it, each
    is read (a read replica's partitions)."""
    answers = []
    left = max_bytes
    first_whole = True  # until a partition has records: its first record goes whatever its size
    heads: Mapping[tuple[str, int, int], int] | None = None  # record_sizes of the partitions left, once asked
    failed = storage_away = False
    statuses = {}
    if redirect:
        try:
            statuses = fetch_service.partition_statuses(broker, list(redirect))
        except TxlogError:
            statuses = {}  # read each partition as usual below, and answer its error there
    for i, w in enumerate(wanted):
        if w.topic in refused:
            answers.append(_partition_error(w.partition, refused[w.topic]))
            failed = True
            continue
        status = statuses.get((w.topic, w.partition))
        if status is not None and redirect is not None:
            answers.append(
                {
                    "partition_index": w.partition,
                    "error_code": 0,
                    "high_watermark": status.high_watermark,
                    "last_stable_offset": status.last_stable_offset,
                    "log_start_offset": status.log_start_offset,
                    "aborted_transactions": None,
                    "preferred_read_replica": redirect[(w.topic, w.partition)],
                    "records": b"",
                }
            )
            continue
        limit = max(0, min(w.max_bytes, left))
        if first_whole:
            limit = max(limit, 1)  # the first record goes whatever its size
        else:
            if heads is None and record_sizes is not None and limit < w.max_bytes:
                try:
                    heads = record_sizes(wanted[i:])
                except TxlogError:
                    heads = {}  # each page read below meets the error and answers it
            if limit < _SMALLEST_BATCH + (heads or {}).get((w.topic, w.partition, w.offset), 0):
                limit = 0  # its first record cannot fit, so _batches_within would keep none: its status alone
        try:
            page = read_page(w, limit)
        except TxlogError as exc:
            answers.append(_partition_error(w.partition, exc))
            failed = True
            storage_away = storage_away or error_code(ApiKey.Fetch, exc) is ErrorCode.KAFKA_STORAGE_ERROR
            continue
        data, last_offset = _batches_within(page.records, limit, first_whole)
        aborted: list | None = page.aborted_transactions
        if aborted is not None:
            aborted = [
                {"producer_id": pid, "first_offset": first}
                for pid, first in aborted
                if last_offset is not None and first <= last_offset
            ]
        answers.append(
            {
                "partition_index": w.partition,
                "error_code": 0,
                "high_watermark": page.high_watermark,
                "last_stable_offset": page.last_stable_offset,
                "log_start_offset": page.log_start_offset,
                "aborted_transactions": aborted,
                "preferred_read_replica": _NO_READ_REPLICA,
                "records": data,
            }
        )
        if data:
            left -= len(data)
            first_whole = False
    return _Read(answers, max_bytes - left, failed, storage_away, bool(statuses))


def _batches_within(rows: Sequence[Any], limit: int, first_whole: bool) -> tuple[bytes, int | None]:
    """The record batches of the longest head of ``rows`` that surely encodes within ``limit`` bytes
    (at least the first row when ``first_whole``), and the offset of its last row (None: no row).
    The page was cut by the bytes of keys, values and headers; batch and record headers come on
    top, counted here at their largest, so that the rows are encoded once, run by run as cut here.
    A run that fits is sized whole; only the run where the limit falls is sized row by row."""
    kept = 0
    size = 0
    runs = []
    for run in encode.batch_runs(rows):
        whole = HEADER_SIZE + _RECORD_OVERHEAD_MAX * len(run) + _HEADER_OVERHEAD_MAX * header_count(run) + records_size(run)
        if size + whole <= limit:
            size += whole
            kept += len(run)
            runs.append(run)
            continue
        size += HEADER_SIZE
        taken = 0
        for row in run:
            size += row.size + _RECORD_OVERHEAD_MAX + _HEADER_OVERHEAD_MAX * len(row.header_keys or ())
            if size > limit and not (kept == 0 and first_whole):
                break
            taken += 1
            kept += 1
        if taken:
            runs.append(run[:taken])
        break
    if not kept:
        return b"", None
    return encode.encode_runs(runs), rows[kept - 1].offset


def _partition_error(partition: int, exc: TxlogError) -> dict:
    return {
        "partition_index": partition,
        "error_code": error_code(ApiKey.Fetch, exc).kafka_code,
        "high_watermark": exc.details.get("high_watermark", _NO_OFFSET),
        "last_stable_offset": _NO_OFFSET,
        "log_start_offset": exc.details.get("log_start_offset", _NO_OFFSET),
        "aborted_transactions": None,
        "preferred_read_replica": _NO_READ_REPLICA,
        "records": b"",
    }


# -- ListOffsets ---------------------------------------------------------------------------------


async def handle_list_offsets(ctx: RequestContext, request: Any) -> dict:
    """Errors are per partition; a partition asked for twice is INVALID_REQUEST, as Kafka answers it."""
    isolation = _isolation(request.isolation_level) if ctx.api_version >= 2 else "read_uncommitted"
    asked = [(topic.name, part.partition_index, part.timestamp) for topic in request.topics for part in topic.partitions]
    times = Counter((t, p) for t, p, _ in asked)
    repeated = {tp for tp, n in times.items() if n > 1}
    refused = access.refused(ctx, Api.DESCRIBE_TOPIC, "topic", (t for t, _, _ in asked))
    once = [a for a in asked if (a[0], a[1]) not in repeated and a[0] not in refused]
    # A read replica answers from its standby's snapshot, as it answers Fetch.
    results = iter(await ctx.call(fetch_service.list_offsets, ctx.replica or ctx.broker, once, isolation) if once else ())
    topics = []
    for topic in request.topics:
        answers = []
        for part in topic.partitions:
            if topic.name in refused:
                answers.append(_listed(part.partition_index, None, refused[topic.name]))
            elif (topic.name, part.partition_index) in repeated:
                error = TxlogError(
                    ErrorCode.INVALID_REQUEST, f"Partition {topic.name}-{part.partition_index} is asked for more than once"
                )
                answers.append(_listed(part.partition_index, None, error))
            else:
                result = next(results)
                answers.append(_listed(part.partition_index, result.offset, result.error))
        topics.append({"name": topic.name, "partitions": answers})
    return {"throttle_time_ms": 0, "topics": topics}


def _listed(partition: int, found: Any, error: TxlogError | None) -> dict:
    if error is not None or found is None:
        code = error_code(ApiKey.ListOffsets, error).kafka_code if error is not None else 0
        return {
            "partition_index": partition,
            "error_code": code,
            "timestamp": _NO_OFFSET,
            "offset": _NO_OFFSET,
            "leader_epoch": _NO_LEADER_EPOCH,
        }
    timestamp = _NO_OFFSET if found.timestamp_ms is None else found.timestamp_ms
    return {
        "partition_index": partition,
        "error_code": 0,
        "timestamp": timestamp,
        "offset": found.offset,
        "leader_epoch": LEADER_EPOCH,
    }
