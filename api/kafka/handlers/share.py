"""Share groups' delivery (KIP-932) on the wire: ShareFetch v1 and ShareAcknowledge v1, to the
services (``app.services.share`` for the delivery, ``share_locks`` for what a closed session gives
back, ``share_groups`` for who is a member). Every rule is theirs; here are the wire's shapes, topic
ids, and the share sessions. The membership's APIs (ShareGroupHeartbeat, ShareGroupDescribe) are
``api.kafka.handlers.share_groups``', the admin APIs and a group's configs ``share_admin``'s.

Membership and delivery state live in PostgreSQL, so any gateway answers any share group and any
share partition: FindCoordinator's answer for the group (key type 0) is simply where the client
sends its heartbeats, and a gateway that goes away costs its share sessions only.

Share sessions are Kafka's ShareSessionCache, kept per gateway process as Kafka keeps them per
broker: keyed by (group, member), a session holds the share partitions the member fetches from this
gateway. Epoch 0 opens one (anew: a session the member had is dropped), each later request sends the
epoch the previous answer moved to (1, 2, …, wrapping to 1), -1 closes it; an epoch out of turn is
INVALID_SHARE_SESSION_EPOCH, a session not held SHARE_SESSION_NOT_FOUND. Closing a session gives
back what the member still holds acquired on its partitions, as Kafka does. At most
``MAX_SHARE_SESSIONS`` are held (Kafka's group.share.max.share.sessions): a member that died without
closing its session leaves it behind until room is needed and it has been idle past any session
timeout.

A ShareFetch or ShareAcknowledge is served only to a member of the share group (else
SHARE_SESSION_NOT_FOUND: a share session ends with its member). A ShareFetch first takes its
piggy-backed acknowledgements, then acquires (MaxRecords over the request, MaxBytes split evenly
over its partitions, AcquiredRecords cut at BatchSize), long-polled: until it has acquired MinBytes
it waits (at most MaxWaitMs) for an append to its partitions, records given back there, or the
earliest lock deadline held on them, through ``share.acquire_waiting``; an idle consumer waits, it
does not spin.

ACLs, as Kafka: ShareFetch and ShareAcknowledge Read on the group, and Read on each topic, answered
per partition.
"""

from __future__ import annotations

import functools
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterable

from api.kafka.handlers import RequestContext, access
from app.domain import share_groups as sg
from app.domain.acls import Api
from app.domain.share_partition import AcknowledgementBatch
from app.errors import ErrorCode, TxlogError
from app.services import share, share_configs, share_groups, share_locks, topics
from app.wire.kafka.records import encode

INITIAL_EPOCH = 0
FINAL_EPOCH = -1
_INT32_MAX = 2**31 - 1


def _next_epoch(epoch: int) -> int:
    return 1 if epoch >= _INT32_MAX else epoch + 1


# Kafka's group.share.max.share.sessions: past it, sessions idle longer than the longest share
# session timeout are evicted to make room, else the new one is SHARE_SESSION_LIMIT_REACHED.
MAX_SHARE_SESSIONS = 2000
_IDLE_EVICTABLE_S = sg.MAX_SESSION_TIMEOUT_MS / 1000


@dataclass
class ShareSession:
    epoch: int  # the epoch the member's next request must send
    partitions: dict[uuid.UUID, set[int]] = field(default_factory=dict)  # topic id -> partitions, in the order added
    used: float = field(default_factory=time.monotonic)

    def topic_partitions(self) -> list[tuple[uuid.UUID, int]]:
        """The session's share partitions as (topic id, partition), each topic's in order."""
        return [(t, p) for t, ps in self.partitions.items() for p in sorted(ps)]


class ShareSessionCache:
    """The share sessions of one gateway (Kafka's ShareSessionCache), by (node, group, member)."""

    def __init__(self, limit: int = MAX_SHARE_SESSIONS) -> None:
        self._sessions: dict[tuple[int, str, str], ShareSession] = {}
        self._lock = threading.Lock()
        self.limit = limit

    def open(self, node_id: int, group_id: str, member_id: str) -> ShareSession:
        """A new session for the member (its previous one, if any, dropped)."""
        key = (node_id, group_id, member_id)
        with self._lock:
            self._sessions.pop(key, None)
            if len(self._sessions) >= self.limit:
                idle_since = time.monotonic() - _IDLE_EVICTABLE_S
                for stale in [k for k, s in self._sessions.items() if s.used < idle_since]:
                    del self._sessions[stale]
            if len(self._sessions) >= self.limit:
                raise TxlogError(
                    ErrorCode.SHARE_SESSION_LIMIT_REACHED,
                    "The limit of share sessions has been reached. Cannot create a new share session.",
                )
            session = self._sessions[key] = ShareSession(_next_epoch(INITIAL_EPOCH))
            return session

    def use(self, node_id: int, group_id: str, member_id: str, epoch: int) -> ShareSession:
        """The session for a request of ``epoch`` > 0, moved on to its next epoch."""
        with self._lock:
            session = self._sessions.get((node_id, group_id, member_id))
            if session is None:
                raise TxlogError(ErrorCode.SHARE_SESSION_NOT_FOUND, f"Share session for member {member_id} was not found.")
            if session.epoch != epoch:
                raise TxlogError(
                    ErrorCode.INVALID_SHARE_SESSION_EPOCH,
                    f"The share session epoch {epoch} is not the expected epoch {session.epoch}.",
                )
            session.epoch = _next_epoch(epoch)
            session.used = time.monotonic()
            return session

    def drop(self, node_id: int, group_id: str, member_id: str) -> None:
        """The member's session, if any, gone (its member is no longer in the group)."""
        with self._lock:
            self._sessions.pop((node_id, group_id, member_id), None)

    def close(self, node_id: int, group_id: str, member_id: str) -> ShareSession:
        with self._lock:
            session = self._sessions.pop((node_id, group_id, member_id), None)
        if session is None:
            raise TxlogError(ErrorCode.SHARE_SESSION_NOT_FOUND, f"Share session for member {member_id} was not found.")
        return session


SESSIONS = ShareSessionCache()


async def _check_member(ctx: RequestContext, group_id: str, member_id: str) -> None:
    """Refuse a ShareFetch or ShareAcknowledge of a member not in the share group (never joined,
    left, fenced, or its session expired) as Kafka refuses a request whose share session is not
    held: SHARE_SESSION_NOT_FOUND, at the top, nothing served. Kafka's share sessions end with
    their member; membership is in PostgreSQL here, so the session is held only while the member
    is in the group, and the gateway's session of such a member goes. The client opens a new
    session (epoch 0) once it has joined again."""
    if await ctx.loop_executor.run(functools.partial(share_groups.is_member_steps, group_id, member_id)):
        return
    SESSIONS.drop(ctx.node.node_id, group_id, member_id)
    raise TxlogError(
        ErrorCode.SHARE_SESSION_NOT_FOUND,
        f"Share session for member {member_id} was not found: it is not a member of share group {group_id}.",
    )


async def _give_back(
    ctx: RequestContext, group_id: str, member_id: str, in_session: list[tuple[uuid.UUID, int]], names: dict[uuid.UUID, str]
) -> None:
    """A closed share session gives back what the member still holds acquired on its partitions,
    as Kafka does, by name (``names`` read anew)."""
    held = [(names[t], p) for t, p in in_session if t in names]
    if held:
        await ctx.call(share_locks.release_member, ctx.broker, group_id, member_id, held)


def _code(exc: TxlogError | None) -> int:
    return 0 if exc is None else exc.code.kafka_code


# --- topic ids ------------------------------------------------------------------------------------


# The names of the topic ids this gateway resolved. A topic's id names it for good (deleted and made
# again, a topic has a new id), so a name found here is that id's for as long as the topic lives;
# every share operation checks the id against the name under the share partition's lock
# (``share.fetch``'s ``topic_ids``: UNKNOWN_TOPIC_ID otherwise), and an id refused is forgotten. A
# ShareFetch resolves its ids without a database transaction of its own.
_TOPIC_NAMES: dict[uuid.UUID, str] = {}
_TOPIC_NAMES_MAX = 10_000


async def _names(ctx: RequestContext, topic_ids: Iterable[uuid.UUID], fresh: bool = False) -> dict[uuid.UUID, str]:
    """The names of ``topic_ids`` that exist (``fresh``: read now; else those resolved before are
    taken as known, for a share operation to check)."""
    wanted = sorted(set(topic_ids))
    out = {} if fresh else {t: _TOPIC_NAMES[t] for t in wanted if t in _TOPIC_NAMES}
    missing = [t for t in wanted if t not in out]
    if missing:
        found = await ctx.call(topics.topics_metadata, ctx.broker, [], missing)
        if len(_TOPIC_NAMES) + len(found) > _TOPIC_NAMES_MAX:
            _TOPIC_NAMES.clear()
        for meta in found:
            out[meta.topic_id] = _TOPIC_NAMES[meta.topic_id] = meta.name
        for topic_id in missing:
            if topic_id not in out:
                _TOPIC_NAMES.pop(topic_id, None)
    return out


def _forget_refused(ids: dict[str, uuid.UUID], results: Iterable[Any]) -> None:
    """A topic id a share operation refused (its topic deleted, or made again) is resolved anew
    next time."""
    for r in results:
        if r.error is not None and r.error.code is ErrorCode.UNKNOWN_TOPIC_ID:
            _TOPIC_NAMES.pop(ids[r.topic], None)


async def _names_checked(ctx: RequestContext, topic_ids: list[uuid.UUID], api: Api) -> dict[uuid.UUID, str]:
    """``_names``, read anew when a name known before would be refused by the ACLs (the topic of
    an id that is gone is UNKNOWN_TOPIC_ID, whatever the ACLs say of its old name)."""
    names = await _names(ctx, topic_ids)
    if _topic_refusals(ctx, api, names.values()):
        names = await _names(ctx, topic_ids, fresh=True)
    return names


def _batches(entries: Iterable[Any]) -> tuple[AcknowledgementBatch, ...]:
    return tuple(AcknowledgementBatch(b.first_offset, b.last_offset, tuple(b.acknowledge_types)) for b in entries)


def _topic_refusals(ctx: RequestContext, api: Api, names: Iterable[str]) -> dict[str, TxlogError]:
    return access.refused(ctx, api, "topics", list(names))


def _acknowledgements(
    ctx: RequestContext,
    acks: dict[tuple[uuid.UUID, int], tuple[AcknowledgementBatch, ...]],
    names: dict[uuid.UUID, str],
    api: Api,
) -> tuple[dict[tuple[uuid.UUID, int], TxlogError | None], dict[tuple[str, int], tuple[AcknowledgementBatch, ...]]]:
    """Each partition's acknowledgement refused here (an unknown topic id, the ACLs), and the
    rest by topic name, for the services."""
    out: dict[tuple[uuid.UUID, int], TxlogError | None] = {}
    refused = _topic_refusals(ctx, api, [names[t] for t, _ in acks if t in names])
    wanted: dict[tuple[str, int], tuple[AcknowledgementBatch, ...]] = {}
    for (topic_id, partition), batches in acks.items():
        name = names.get(topic_id)
        if name is None:
            out[(topic_id, partition)] = TxlogError(ErrorCode.UNKNOWN_TOPIC_ID, ErrorCode.UNKNOWN_TOPIC_ID.value.default_message)
        elif name in refused:
            out[(topic_id, partition)] = refused[name]
        else:
            out[(topic_id, partition)] = None
            wanted[(name, partition)] = batches
    return out, wanted


async def _acknowledge(
    ctx: RequestContext,
    group_id: str,
    member_id: str,
    acks: dict[tuple[uuid.UUID, int], tuple[AcknowledgementBatch, ...]],
    names: dict[uuid.UUID, str],
    api: Api,
) -> dict[tuple[uuid.UUID, int], TxlogError | None]:
    """Each partition's acknowledgement error (None: taken)."""
    out, wanted = _acknowledgements(ctx, acks, names, api)
    if wanted:
        ids = {name: topic_id for topic_id, name in names.items()}
        results = await ctx.call(share.acknowledge, ctx.broker, group_id, member_id, wanted, None, ids)
        for result in results:
            out[(ids[result.topic], result.partition)] = result.error
        _forget_refused(ids, results)
    return out


def _partition_entry(partition: int, **fields: Any) -> dict:
    return {"partition_index": partition, "error_code": 0, "error_message": None, **fields}


def _by_topic(entries: dict[tuple[uuid.UUID, int], dict]) -> list[dict]:
    topics_out: dict[uuid.UUID, list[dict]] = {}
    for (topic_id, _), entry in entries.items():
        topics_out.setdefault(topic_id, []).append(entry)
    return [{"topic_id": t, "partitions": ps} for t, ps in topics_out.items()]


# --- ShareFetch ---------------------------------------------------------------------------------


async def handle_share_fetch(ctx: RequestContext, request: Any) -> dict:
    group_id, member_id, epoch = request.group_id, request.member_id, request.share_session_epoch
    access.check(ctx, Api.SHARE_FETCH, group=group_id)
    if not group_id or not member_id:
        raise TxlogError(ErrorCode.INVALID_REQUEST, "GroupId and MemberId must be set")
    await _check_member(ctx, group_id, member_id)
    acks: dict[tuple[uuid.UUID, int], tuple[AcknowledgementBatch, ...]] = {}
    asked: dict[uuid.UUID, list[int]] = {}
    for topic in request.topics:
        for p in topic.partitions:
            asked.setdefault(topic.topic_id, []).append(p.partition_index)
            if p.acknowledgement_batches:
                acks[(topic.topic_id, p.partition_index)] = _batches(p.acknowledgement_batches)
    sessions, node = SESSIONS, ctx.node.node_id
    if epoch == INITIAL_EPOCH:
        if acks:
            raise TxlogError(ErrorCode.INVALID_REQUEST, "Acknowledge data present on initial fetch")
        session = sessions.open(node, group_id, member_id)
    elif epoch == FINAL_EPOCH:
        if asked and any(not p.acknowledgement_batches for t in request.topics for p in t.partitions):
            raise TxlogError(ErrorCode.INVALID_REQUEST, "The final share fetch must not fetch records")
        session = sessions.close(node, group_id, member_id)
    else:
        session = sessions.use(node, group_id, member_id, epoch)
    if epoch != FINAL_EPOCH:
        for forgotten in request.forgotten_topics_data:
            kept = session.partitions.get(forgotten.topic_id, set()) - set(forgotten.partitions)
            if kept:
                session.partitions[forgotten.topic_id] = kept
            else:
                session.partitions.pop(forgotten.topic_id, None)
        for topic_id, partitions in asked.items():
            session.partitions.setdefault(topic_id, set()).update(partitions)

    in_session = session.topic_partitions()
    topic_ids = [t for t, _ in in_session] + [t for t, _ in acks]
    # The final fetch releases what the member holds by name: its names are read anew.
    names = await (
        _names(ctx, topic_ids, fresh=True) if epoch == FINAL_EPOCH else _names_checked(ctx, topic_ids, Api.SHARE_FETCH)
    )
    entries: dict[tuple[uuid.UUID, int], dict] = {}
    lock_duration_ms: int | None = None
    if epoch == FINAL_EPOCH:
        if acks:
            for key, error in (await _acknowledge(ctx, group_id, member_id, acks, names, Api.SHARE_FETCH)).items():
                entries[key] = _ack_entry(key[1], error)
        await _give_back(ctx, group_id, member_id, in_session, names)
    else:
        acked, acks_wanted = _acknowledgements(ctx, acks, names, Api.SHARE_FETCH)
        for key in acked:
            entries[key] = _partition_entry(key[1])
        refused = _topic_refusals(ctx, Api.SHARE_FETCH, [names[t] for t, _ in in_session if t in names])
        wanted: list[tuple[str, int]] = []
        for topic_id, partition in in_session:
            name = names.get(topic_id)
            error = None
            if name is None:
                error = TxlogError(ErrorCode.UNKNOWN_TOPIC_ID, ErrorCode.UNKNOWN_TOPIC_ID.value.default_message)
            elif name in refused:
                error = refused[name]
            else:
                wanted.append((name, partition))
            entry = entries.setdefault((topic_id, partition), _partition_entry(partition))
            if error is not None:
                entry.update(error_code=_code(error), error_message=error.message)
        ids = {name: topic_id for topic_id, name in names.items()}
        got: list[share.ShareFetchPartition] = []
        if wanted:
            # The acknowledgements ride on the acquisition: they and the first partition read are
            # one database transaction, the acknowledgements applied first.
            max_records = request.max_records if request.max_records > 0 else 500
            answers, got = await share.fetch_waiting(
                ctx.broker,
                ctx.notifier,
                _runner(ctx),
                group_id,
                member_id,
                wanted,
                request.max_wait_ms,
                max_records,
                _partition_max_bytes(request.max_bytes, len(wanted)),
                min_bytes=request.min_bytes,
                batch_size=request.batch_size if request.batch_size > 0 else None,
                acknowledgements=acks_wanted,
                topic_ids=ids,
            )
        elif acks_wanted:
            answers = await ctx.call(share.acknowledge, ctx.broker, group_id, member_id, acks_wanted, None, ids)
        else:
            answers = []
        for answer in answers:
            acked[(ids[answer.topic], answer.partition)] = answer.error
        _forget_refused(ids, [*answers, *got])
        for key, error in acked.items():
            entries[key].update(_ack_error(error))
        for part in got:
            entry = entries[(ids[part.topic], part.partition)]
            if part.error is not None:
                entry.update(error_code=_code(part.error), error_message=part.error.message)
                continue
            lock_duration_ms = lock_duration_ms or part.record_lock_duration_ms
            entry["acquired_records"] = [
                {"first_offset": a.first_offset, "last_offset": a.last_offset, "delivery_count": a.delivery_count}
                for a in part.acquired
            ]
            entry["records"] = encode.encode_runs(encode.batch_runs(part.records)) if part.records else b""
    for entry in entries.values():
        entry.setdefault("records", b"")
    if lock_duration_ms is None:  # nothing acquired told it
        lock_duration_ms = (await ctx.call(share_configs.group_config, ctx.broker, group_id)).delivery.record_lock_duration_ms
    return {
        "throttle_time_ms": 0,
        "error_code": 0,
        "error_message": None,
        "acquisition_lock_timeout_ms": lock_duration_ms,
        "responses": _by_topic(entries),
        "node_endpoints": [],
    }


def _ack_error(error: TxlogError | None) -> dict:
    """A ShareFetch partition's acknowledgement error fields."""
    return {"acknowledge_error_code": _code(error), "acknowledge_error_message": None if error is None else error.message}


def _ack_entry(partition: int, error: TxlogError | None) -> dict:
    return _partition_entry(partition, **_ack_error(error))


def _partition_max_bytes(max_bytes: int, partitions: int) -> int:
    """Each partition's share of a ShareFetch's MaxBytes, split evenly as Kafka's broker does
    (its uniform strategy), at most a page of ``share.DEFAULT_MAX_BYTES``; a first record larger
    than that is still given (KIP-74)."""
    return max(1, min(max_bytes // max(1, partitions), share.DEFAULT_MAX_BYTES))


def _runner(ctx: RequestContext) -> Any:
    async def run(fn: Any) -> Any:
        return await ctx.call(fn)

    return run


# --- ShareAcknowledge ---------------------------------------------------------------------------


async def handle_share_acknowledge(ctx: RequestContext, request: Any) -> dict:
    group_id, member_id, epoch = request.group_id, request.member_id, request.share_session_epoch
    access.check(ctx, Api.SHARE_ACKNOWLEDGE, group=group_id)
    if not group_id or not member_id:
        raise TxlogError(ErrorCode.INVALID_REQUEST, "GroupId and MemberId must be set")
    await _check_member(ctx, group_id, member_id)
    sessions, node = SESSIONS, ctx.node.node_id
    if epoch == INITIAL_EPOCH:
        raise TxlogError(ErrorCode.INVALID_SHARE_SESSION_EPOCH, "A share acknowledgement cannot open a share session.")
    session = (
        sessions.close(node, group_id, member_id) if epoch == FINAL_EPOCH else sessions.use(node, group_id, member_id, epoch)
    )
    acks = {(t.topic_id, p.partition_index): _batches(p.acknowledgement_batches) for t in request.topics for p in t.partitions}
    in_session = session.topic_partitions()
    topic_ids = [t for t, _ in acks] + [t for t, _ in in_session]
    names = await (
        _names(ctx, topic_ids, fresh=True) if epoch == FINAL_EPOCH else _names_checked(ctx, topic_ids, Api.SHARE_ACKNOWLEDGE)
    )
    results = await _acknowledge(ctx, group_id, member_id, acks, names, Api.SHARE_ACKNOWLEDGE)
    if epoch == FINAL_EPOCH:
        await _give_back(ctx, group_id, member_id, in_session, names)
    entries = {
        key: {"partition_index": key[1], "error_code": _code(error), "error_message": None if error is None else error.message}
        for key, error in results.items()
    }
    return {"throttle_time_ms": 0, "error_code": 0, "error_message": None, "responses": _by_topic(entries), "node_endpoints": []}
