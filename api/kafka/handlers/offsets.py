"""OffsetCommit, OffsetFetch and OffsetDelete: a consumer group's committed offsets, over
``app.services.groups``, fenced by the group coordinator (``ctx.groups``).

OffsetCommit (v2 to v9):

- The coordinator decides first whether the commit may happen at all
  (``GroupCoordinator.check_offset_commit``): a member of the current generation, or a "simple"
  consumer (generation -1, no member id: assign() and commit) while the group has no members.
  Otherwise every partition gets the same error (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID,
  FENCED_INSTANCE_ID, REBALANCE_IN_PROGRESS, NOT_COORDINATOR) and nothing is written. A group the
  coordinator does not know (it lost its groups when it restarted, or the group is new) refuses a
  real generation with ILLEGAL_GENERATION in every version, also from v9, where Kafka answers
  GROUP_ID_NOT_FOUND: Kafka keeps groups across restarts and txlog does not, and
  ILLEGAL_GENERATION is what makes every client rejoin.
- Errors are per partition, as in Kafka: a partition that does not exist is
  UNKNOWN_TOPIC_OR_PARTITION, a negative offset INVALID_REQUEST, and
  the other partitions of the request are committed. v9's ``generation_id_or_member_epoch`` is the
  generation of a classic group, the member epoch of a consumer group of the next-generation
  protocol (KIP-848), whose checks are ``offset_commit_refusal``'s.
- Metadata is stored as sent (null as "", as Kafka: ``offset_metadata``), the leader
  epoch (v6+) as committed; v2–4's retention time is not kept.

OffsetFetch (v1 to v9):

- Each partition asked for is answered in the order asked: its committed offset and metadata, or
  offset -1 and metadata "" when the group has none (an unknown topic or partition included,
  without an error, as Kafka answers). Null topics (v2+) ask for every partition the group has an
  offset for. Each offset comes with the leader epoch it was committed with (-1: none).
- ``require_stable`` (v7+; librdkafka and kafka-python set it for read_committed consumers): a
  partition for which an open transaction holds an offset answers UNSTABLE_OFFSET_COMMIT, and the
  client asks again until the transaction ends.
- A group-level error (NOT_COORDINATOR, INVALID_GROUP_ID) is the top-level error code from v2, the
  group's error code from v8 (several groups in one request), and each partition's in v1 (and in
  v2-3 when it is retriable: ``_with_error``).

OffsetDelete (v0): see ``handle_offset_delete``.

ACLs, as Kafka: OffsetCommit needs Read on the group (else every partition is
GROUP_AUTHORIZATION_FAILED) and on each topic (else its partitions are TOPIC_AUTHORIZATION_FAILED,
the others committed); OffsetFetch needs Describe on each group (its group error
GROUP_AUTHORIZATION_FAILED), and answers only topics the principal may describe: those asked for
are TOPIC_AUTHORIZATION_FAILED (offset -1), and a fetch of every offset leaves the others out;
OffsetDelete needs Delete on the group (the request's error) and Read on each topic (per partition).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterable, Sequence

from sqlalchemy.engine import Connection

from api.kafka.handlers import RequestContext, access, error_code
from api.kafka.handlers.share_groups import _classic_group_here
from app.domain.acls import Api
from app.domain.groups.offsets import GroupOffset
from app.errors import ErrorCode, TxlogError
from app.services import consumer_groups
from app.services import groups as groups_service
from app.services.groups import FetchedOffset
from app.wire.kafka.messages import ApiKey

NO_OFFSET = -1
NO_LEADER_EPOCH = -1
NO_METADATA = ""

TopicPartition = tuple[str, int]


def offset_metadata(value: str | None) -> str:
    """Committed metadata as Kafka keeps it: null is "" (its OffsetAndMetadata.NO_METADATA), any
    other string exactly as sent, a NUL included (confluent-kafka's Python binding sends its C
    string's terminator with every metadata it commits, and gets it back, from Kafka too)."""
    return NO_METADATA if value is None else value


def committed_offsets(topics: Iterable[Any], leader_epochs: bool) -> list[GroupOffset]:
    """The offsets an OffsetCommit or TxnOffsetCommit request's topics carry, in request order; the
    leader epochs only from the version that has them (``leader_epochs``), else none."""
    return [
        GroupOffset(
            t.name,
            p.partition_index,
            p.committed_offset,
            offset_metadata(p.committed_metadata),
            p.committed_leader_epoch if leader_epochs else NO_LEADER_EPOCH,
        )
        for t in topics
        for p in t.partitions
    ]


def _by_topic(entries: Iterable[tuple[str, dict]]) -> list[dict]:
    """(topic, partition answer) pairs as the responses' topic array, topics in first-seen order."""
    topics: dict[str, list[dict]] = {}
    for topic, partition in entries:
        topics.setdefault(topic, []).append(partition)
    return [{"name": name, "partitions": partitions} for name, partitions in topics.items()]


# -- OffsetCommit -----------------------------------------------------------------------------------


async def handle_offset_commit(ctx: RequestContext, request: Any) -> dict:
    access.check(ctx, Api.OFFSET_COMMIT, group=request.group_id)
    refused = access.refused(ctx, Api.OFFSET_COMMIT, "topic", (t.name for t in request.topics))
    offsets = committed_offsets(request.topics, leader_epochs=ctx.api_version >= 6)
    allowed = [o for o in offsets if o.topic not in refused]
    codes = await _commit(ctx, request, allowed) if allowed else {}
    codes.update({(o.topic, o.partition): refused[o.topic].code.kafka_code for o in offsets if o.topic in refused})
    return {
        "throttle_time_ms": 0,
        "topics": _by_topic(
            (o.topic, {"partition_index": o.partition, "error_code": codes[(o.topic, o.partition)]}) for o in offsets
        ),
    }


async def offset_commit_refusal(
    ctx: RequestContext,
    group_id: str,
    generation_id_or_member_epoch: int,
    member_id: str,
    group_instance_id: str | None,
    partitions: Sequence[tuple[str, int]],
    transactional: bool,
) -> tuple[ErrorCode | None, Callable[[Connection], None] | None]:
    """Why an OffsetCommit (``transactional``: a TxnOffsetCommit) may not commit (None if it may),
    and the check to run again where its offsets are written (None: none). NOT_COORDINATOR at
    another gateway; in a consumer group of the next-generation protocol (KIP-848) with members,
    its member-epoch checks (``consumer_groups.check_offset_commit``: UNKNOWN_MEMBER_ID,
    STALE_MEMBER_EPOCH, UNSUPPORTED_VERSION below v9), made again in the database transaction of
    the write under the group row's lock (``consumer_groups.offset_commit_fence``), so a member
    fenced after the first check commits nothing; otherwise the classic coordinator's
    (``GroupCoordinator.check_offset_commit``). A group with classic members here is classic
    without asking the database."""
    not_here = ctx.groups.check_offset_fetch(group_id)
    if not_here is not None:
        return not_here, None
    if not _classic_group_here(ctx, group_id):
        check = (group_id, member_id, generation_id_or_member_epoch, partitions, transactional, ctx.api_version)
        consumer, refusal = await ctx.call(consumer_groups.check_offset_commit, ctx.broker, *check)
        if consumer:
            return refusal, functools.partial(consumer_groups.offset_commit_fence, ctx.broker, *check)
    refusal = ctx.groups.check_offset_commit(
        group_id, generation_id_or_member_epoch, member_id, group_instance_id, transactional=transactional
    )
    return refusal, None


async def _commit(ctx: RequestContext, request: Any, offsets: Sequence[GroupOffset]) -> dict[TopicPartition, int]:
    """Each partition's error code (0: committed)."""
    if not request.group_id:
        return {(o.topic, o.partition): ErrorCode.INVALID_GROUP_ID.kafka_code for o in offsets}
    fenced, fence = await offset_commit_refusal(
        ctx,
        request.group_id,
        request.generation_id_or_member_epoch,
        request.member_id,
        request.group_instance_id if ctx.api_version >= 7 else None,
        [(o.topic, o.partition) for o in offsets],
        transactional=False,
    )
    if fenced is not None:
        return {(o.topic, o.partition): fenced.kafka_code for o in offsets}
    codes: dict[TopicPartition, int] = {}
    remaining = list(offsets)
    while remaining:
        try:
            await ctx.call(groups_service.offset_commit, ctx.broker, request.group_id, remaining, fence)
        except TxlogError as exc:
            # The service commits all or nothing and names the partitions it refused; the others
            # are committed on the next round, as Kafka commits a request partition by partition.
            asked = {(o.topic, o.partition) for o in remaining}
            named: Iterable[tuple[str, int]] = exc.details.get("partitions", ())  # type: ignore[assignment]  # details hold plain values
            refused = {(str(t), int(p)) for t, p in named} & asked
            if not refused:
                codes.update({tp: error_code(ApiKey.OffsetCommit, exc).kafka_code for tp in asked})
                return codes
            codes.update({tp: error_code(ApiKey.OffsetCommit, exc).kafka_code for tp in refused})
            remaining = [o for o in remaining if (o.topic, o.partition) not in refused]
            continue
        codes.update({(o.topic, o.partition): 0 for o in remaining})
        break
    return codes


# -- OffsetFetch ------------------------------------------------------------------------------------


async def handle_offset_fetch(ctx: RequestContext, request: Any) -> dict:
    v = ctx.api_version
    require_stable = v >= 7 and bool(request.require_stable)
    if v >= 8:
        answers = []
        for g in request.groups:
            asked = _asked(g.topics)
            member = (g.member_id, g.member_epoch) if v >= 9 else None
            error, topics = await _fetch(ctx, g.group_id, asked, require_stable, member)
            answers.append({"group_id": g.group_id, "error_code": _code(error), "topics": _with_error(v, topics, asked, error)})
        return {"throttle_time_ms": 0, "groups": answers}
    asked = _asked(request.topics)
    error, topics = await _fetch(ctx, request.group_id, asked, require_stable)
    return {"throttle_time_ms": 0, "error_code": _code(error), "topics": _with_error(v, topics, asked, error)}


def _with_error(version: int, topics: list[dict], asked: list[TopicPartition] | None, error: ErrorCode | None) -> list[dict]:
    """A group's error on every partition asked for too: in v0-1, which have no other place for
    it, and in v2-3 when it is retriable (the coordinator cannot read the offsets now), where Kafka
    answers no partition. aiokafka, whose newest OffsetFetch is v3, reads only the partitions'
    codes, and takes a partition left out for one without a committed offset (it resets its
    position). Not from v4: librdkafka (v7+) takes a partition's error as final when it does not
    retry the request (its assignment changed meanwhile), and never fetches that partition again."""
    if error is None or (version >= 2 and not error.retriable) or version >= 4:
        return topics
    return _by_topic((t, _partition(FetchedOffset(t, p, None, NO_METADATA), error)) for t, p in asked or ())


def _asked(topics: Any) -> list[TopicPartition] | None:
    """The partitions asked for, in order; None: every partition the group has an offset for."""
    if topics is None:
        return None
    return [(t.name, p) for t in topics for p in t.partition_indexes]


async def _fetch(
    ctx: RequestContext,
    group_id: str,
    asked_all: list[TopicPartition] | None,
    require_stable: bool,
    member: tuple[str | None, int] | None = None,
) -> tuple[ErrorCode | None, list[dict]]:
    """One group's answer: its error, or its topics. ``member``: v9's member id and epoch."""
    if access.refusal(ctx, Api.OFFSET_FETCH, group=group_id) is not None:
        return ErrorCode.GROUP_AUTHORIZATION_FAILED, []
    if not group_id:
        return ErrorCode.INVALID_GROUP_ID, []
    not_fetched = ctx.groups.check_offset_fetch(group_id)
    if not_fetched is not None:
        return not_fetched, []
    if member is not None and (member[0] or member[1] >= 0):
        # v9 names the member: in a consumer group of the next-generation protocol, only a member
        # with its current epoch may read the group's offsets (STALE_MEMBER_EPOCH, UNKNOWN_MEMBER_ID)
        stale = await ctx.call(consumer_groups.check_offset_fetch, ctx.broker, group_id, member[0], member[1])
        if stale is not None:
            return stale, []
    asked = asked_all
    hidden = {t for t, _ in asked or () if not access.shows(ctx, Api.OFFSET_FETCH, t)} if ctx.authorizer is not None else set()
    if asked is not None and hidden:
        asked = [(t, p) for t, p in asked if t not in hidden]
    try:
        fetched = (
            await ctx.call(groups_service.offset_fetch_partitions, ctx.broker, group_id, asked, require_stable)
            if asked != []
            else []
        )
    except TxlogError as exc:
        return error_code(ApiKey.OffsetFetch, exc), []
    if asked is None and ctx.authorizer is not None:
        fetched = [f for f in fetched if access.shows(ctx, Api.OFFSET_FETCH, f.topic)]
    answered = [(f.topic, _partition(f, f.error.code if f.error else None)) for f in fetched]
    answered += [
        (t, _partition(FetchedOffset(t, p, None, NO_METADATA), ErrorCode.TOPIC_AUTHORIZATION_FAILED))
        for t, p in (asked_all or ())
        if t in hidden
    ]
    return None, _by_topic(answered)


def _partition(f: FetchedOffset, error: ErrorCode | None) -> dict:
    return {
        "partition_index": f.partition,
        "committed_offset": NO_OFFSET if f.offset is None else f.offset,
        "committed_leader_epoch": f.leader_epoch if f.offset is not None else NO_LEADER_EPOCH,
        "metadata": f.metadata if f.offset is not None else NO_METADATA,
        "error_code": _code(error),
    }


def _code(error: ErrorCode | None) -> int:
    return 0 if error is None else error.kafka_code


# -- OffsetDelete -----------------------------------------------------------------------------------


async def handle_offset_delete(ctx: RequestContext, request: Any) -> dict:
    """The group's offsets of the partitions asked for go, committed and pending in transactions,
    at the group's coordinator, except those of a topic the group's members subscribe to
    (GROUP_SUBSCRIBED_TO_TOPIC), as Kafka decides (``coordinator.offset_delete``); a partition that
    does not exist is UNKNOWN_TOPIC_OR_PARTITION."""
    access.check(ctx, Api.OFFSET_DELETE, group=request.group_id)
    refused = access.refused(ctx, Api.OFFSET_DELETE, "topic", (t.name for t in request.topics))
    asked = [(t.name, p.partition_index) for t in request.topics for p in t.partitions if t.name not in refused]
    group_id = request.group_id
    error: ErrorCode | None = ErrorCode.INVALID_GROUP_ID if not group_id else None
    missing: set[TopicPartition] = set()
    kept: frozenset[str] = frozenset()
    try:
        if error is None:
            with_offsets = bool(await ctx.call(groups_service.list_groups, ctx.broker, [group_id]))
            error, kept = ctx.groups.offset_delete(group_id, {t for t, _ in asked}, with_offsets)
        if error is None:
            deletable = [(t, p) for t, p in asked if t not in kept]
            missing = await ctx.call(groups_service.delete_partition_offsets, ctx.broker, group_id, deletable)
    except TxlogError as exc:
        error = error_code(ApiKey.OffsetDelete, exc)
    if error is not None:
        return {"throttle_time_ms": 0, "error_code": error.kafka_code, "topics": []}

    def code(topic: str, partition: int) -> int:
        if topic in refused:
            return ErrorCode.TOPIC_AUTHORIZATION_FAILED.kafka_code
        if topic in kept:
            return ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC.kafka_code
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.kafka_code if (topic, partition) in missing else 0

    return {
        "throttle_time_ms": 0,
        "error_code": 0,
        "topics": _by_topic(
            (t.name, {"partition_index": p.partition_index, "error_code": code(t.name, p.partition_index)})
            for t in request.topics
            for p in t.partitions
        ),
    }
