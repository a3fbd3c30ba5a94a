"""Share groups' delivery (KIP-932): members acquire records of a topic partition, each record held
by one member at a time until it acknowledges it or its lock expires; ShareFetch and
ShareAcknowledge, which a ShareFetch carries. Locks given back (a member leaving, the lock timer)
are ``app.services.share_locks``', a group's configs ``share_configs``', the admin's describe,
alter and delete of share-partition state ``share_admin``'s.

Each share partition is changed in a database transaction of its own, under its row lock
(``storage.share.share_partition_open``, ``share_partition_lock``): any process serves any share
partition, and the rules are the domain's (``app.domain.share_partition``, ``share_acquisition``,
``share_acknowledgement``), decided on the state as locked and persisted as the rows that changed.
Time is the database's clock (``Broker.now``): lock deadlines agree across hosts.
"""

from __future__ import annotations

import dataclasses
import functools
import uuid
from dataclasses import dataclass
from typing import Mapping, Sequence

from sqlalchemy.engine import Connection

from app.domain import share_acknowledgement, share_acquisition
from app.domain import share_partition as sp
from app.domain.log import PartitionStatus, StoredRecord, unknown_partition
from app.domain.records import IsolationLevel
from app.domain.share_configs import ShareConfigs, config_of
from app.errors import ErrorCode, TxlogError
from app.services import Broker
from app.services.fetch import list_offsets, log_rows
from app.services.notify import AppendNotifier, RunBlocking, wait_for_records
from app.storage import log as log_store
from app.storage import share as share_store
from app.storage import topics as topics_store

# A share fetch's byte budget per partition when the caller gives none (Kafka's
# fetch.max.bytes default for a share consumer: 50 MiB over a request; one partition's page here).
DEFAULT_MAX_BYTES = 1_048_576


# --- acquiring ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShareFetchPartition:
    """What one share partition gave a share fetch: the runs of offsets acquired, each with its
    delivery count (Kafka's AcquiredRecords), and the data records among them, in offset order
    (an acquired offset without a record — compacted away — is acknowledged as GAP). ``error``
    instead, per partition, as Kafka answers it."""

    topic: str
    partition: int
    acquired: tuple[sp.AcquiredRecords, ...] = ()
    records: tuple[StoredRecord, ...] = ()
    delivery_counts: tuple[int, ...] = ()  # of each of ``records``
    error: TxlogError | None = None
    start_offset: int | None = None  # the SPSO after this fetch
    high_watermark: int | None = None
    log_start_offset: int | None = None
    next_lock_deadline_ms: int | None = None  # the earliest lock still held on the partition after this fetch
    read_at_ms: int | None = None  # the database's clock when it acquired
    record_lock_duration_ms: int | None = None  # the group's share.record.lock.duration.ms, as it acquired

    @property
    def count(self) -> int:
        return len(self.records)

    @property
    def bytes(self) -> int:
        return sum(r.size for r in self.records)


@dataclass(frozen=True)
class ShareAcknowledged:
    """One share partition's answer to an acknowledgement: what it did, or Kafka's error
    (INVALID_RECORD_STATE: a record not held by the member, its lock expired; INVALID_REQUEST:
    malformed batches or offsets never acquired; UNKNOWN_TOPIC_OR_PARTITION). A refused
    acknowledgement changed nothing."""

    topic: str
    partition: int
    outcome: sp.Acknowledgement | None = None
    error: TxlogError | None = None


def _not_deliverable(rows: Sequence[StoredRecord], committed: bool) -> list[tuple[int, int]]:
    """Runs of offsets a share group never delivers: control records always, and records of aborted
    transactions under read_committed (Kafka's share fetch archives them)."""
    runs: list[tuple[int, int]] = []
    for r in rows:
        if r.control_type is not None or (committed and r.aborted):
            if runs and runs[-1][1] + 1 == r.offset:
                runs[-1] = (runs[-1][0], r.offset)
            else:
                runs.append((r.offset, r.offset))
    return runs


def _start_offset(broker: Broker, config: ShareConfigs, status: PartitionStatus) -> int:
    """Where a share partition the group never read starts (share.auto.offset.reset)."""
    reset = config.auto_offset_reset
    found: int | None = None
    when = sp.reset_timestamp(reset, broker.now())
    if when is not None:
        listed = list_offsets(broker, [(status.topic, status.partition, max(0, when))], config.isolation_level)[0]
        found = listed.offset.offset if listed.offset is not None else None
    end = status.last_stable_offset if config.isolation_level == "read_committed" else status.high_watermark
    return sp.initial_state(
        reset, log_start_offset=status.log_start_offset, log_end_offset=end, offset_for_timestamp=found
    ).start_offset


@dataclass(frozen=True)
class _Opened:
    status: PartitionStatus
    stored: sp.SharePartitionState  # as locked
    state: sp.SharePartitionState  # with the log start's moves applied
    config: ShareConfigs


def _unknown_topic_id() -> TxlogError:
    return TxlogError(ErrorCode.UNKNOWN_TOPIC_ID, ErrorCode.UNKNOWN_TOPIC_ID.value.default_message)


def _open(
    conn: Connection,
    broker: Broker,
    group_id: str,
    topic: str,
    partition: int,
    config: ShareConfigs | None,
    create: bool,
    topic_id: uuid.UUID | None,
    opened: share_store.OpenedSharePartition | None,
) -> _Opened:
    """The share partition as ``share_store.share_partitions_open`` locked and read it (``opened``),
    with the group's configs (read with it, when ``config`` is not given). Made first if the group
    never read it, when ``create``. ``topic_id``: the id the caller knows the topic by —
    UNKNOWN_TOPIC_ID unless the topic of that name still has it (deleted and made again, a topic
    has a new id), checked in the same statement."""
    if opened is None:
        if topic_id is not None:
            found = topics_store.topics_metadata(conn, [topic], None)
            if not found or found[0].topic_id != topic_id:
                raise _unknown_topic_id()
        status = log_store.partition_status(conn, topic, partition)  # UNKNOWN_TOPIC_OR_PARTITION first
        if not create:
            raise TxlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"Share group {group_id} has no state of {topic}-{partition}")
        if config is None:
            config = config_of(share_store.share_group_configs(conn, group_id))
        share_store.share_partition_create(conn, group_id, topic, partition, _start_offset(broker, config, status))
        opened = share_store.share_partition_open(conn, group_id, topic, partition)
        assert opened is not None
    if topic_id is not None and opened.topic_id != topic_id:
        raise _unknown_topic_id()
    if opened.status is None:
        raise unknown_partition(topic, partition)
    if config is None:
        # Read with the partition's state when it was the first opened; else (the first was
        # refused) now.
        config = config_of(opened.configs if opened.configs is not None else share_store.share_group_configs(conn, group_id))
    return _Opened(opened.status, opened.state, sp.advance_log_start(opened.state, opened.status.log_start_offset), config)


@dataclass(frozen=True)
class _Acquisition:
    max_records: int
    max_bytes: int
    isolation_level: IsolationLevel | None
    lock_duration_ms: int | None


def _acquire_locked(
    conn: Connection, broker: Broker, member_id: str, opened: _Opened, state: sp.SharePartitionState, ask: _Acquisition
) -> tuple[ShareFetchPartition, sp.SharePartitionState, bool]:
    """The acquiring half on the locked share partition in ``state``: the answer, the state after
    it, and whether it gave records back (expired locks)."""
    status, config = opened.status, opened.config
    isolation: IsolationLevel = ask.isolation_level or config.isolation_level
    now = broker.now()
    start = share_acquisition.next_fetch_offset(state, now)
    # Read the in-flight records from the first acquirable one, and as many new ones past the
    # end offset as may be acquired: bounded by the window and the request, never the log.
    span_end = max(state.end_offset, start) + min(ask.max_records, share_acquisition.new_records_room(state, config.delivery))
    rows = log_rows(conn, status, start, ask.max_bytes, isolation, max(1, span_end - start)) if start < span_end else []
    last = rows[-1].offset if rows else start - 1
    outcome = share_acquisition.acquire(
        state,
        member_id,
        start,
        last,
        now_ms=now,
        config=config.delivery,
        max_records=ask.max_records,
        not_deliverable=_not_deliverable(rows, isolation == "read_committed"),
        lock_duration_ms=ask.lock_duration_ms,
    )
    counts: list[int] = []
    records: list[StoredRecord] = []
    runs = iter(outcome.acquired)
    run = next(runs, None)
    for r in rows:
        while run is not None and run.last_offset < r.offset:
            run = next(runs, None)
        if run is None:
            break
        if run.first_offset <= r.offset and r.control_type is None:
            records.append(r)
            counts.append(run.delivery_count)
    answer = ShareFetchPartition(
        status.topic,
        status.partition,
        outcome.acquired,
        tuple(records),
        tuple(counts),
        None,
        outcome.state.start_offset,
        status.high_watermark,
        status.log_start_offset,
        share_acquisition.next_lock_deadline(outcome.state),
        now,
        config.delivery.record_lock_duration_ms,
    )
    return answer, outcome.state, bool(outcome.released)


@dataclass(frozen=True)
class _Job:
    """One share partition's part of a database transaction: its acknowledgements (``batches``),
    its acquisition (``ask``), or both."""

    topic: str
    partition: int
    batches: Sequence[sp.AcknowledgementBatch] | None
    ask: _Acquisition | None


_Served = tuple[ShareAcknowledged | None, ShareFetchPartition | None]


def _serve(
    broker: Broker,
    group_id: str,
    member_id: str,
    jobs: Sequence[_Job],
    config: ShareConfigs | None,
    lock_duration_ms: int | None,
    topic_ids: Mapping[str, uuid.UUID],
) -> tuple[list[_Served], ShareConfigs | None]:
    """Share partitions in one database transaction, each under its row lock, the locks taken in
    (topic, partition) order so that two such transactions never wait on each other: per
    partition its acknowledgements first, then its acquisition from the state they left; each
    written once. Three round trips whatever the number of partitions: the locks and reads, the
    records, the writes with the COMMIT (``share_partitions_open``, ``share_partitions_write``). The group's configs are read with the first
    partition's state when not given, and answered for the next transaction. A partition refused
    (unknown, its topic id changed) or an acknowledgement refused changes nothing of it and stops
    no other; an error of the database transaction fails them all (nothing of any was
    committed). Answers in the order of ``jobs``."""
    out: dict[int, _Served] = {}
    opened: dict[int, _Opened] = {}
    with broker.db.transaction() as conn:
        order = sorted(range(len(jobs)), key=lambda n: (jobs[n].topic, jobs[n].partition))
        found = share_store.share_partitions_open(
            conn, group_id, [(jobs[i].topic, jobs[i].partition) for i in order], with_configs=config is None
        )
        for i, one in zip(order, found):
            job = jobs[i]
            try:
                opened[i] = _open(
                    conn, broker, group_id, job.topic, job.partition, config, job.ask is not None, topic_ids.get(job.topic), one
                )
            except TxlogError as exc:
                if exc.code is ErrorCode.UNKNOWN_SERVER_ERROR:
                    raise
                out[i] = (
                    None if job.batches is None else ShareAcknowledged(job.topic, job.partition, error=exc),
                    None if job.ask is None else ShareFetchPartition(job.topic, job.partition, error=exc),
                )
                continue
            config = opened[i].config
        writes: list[share_store.SharePartitionWrite] = []
        for i, job in enumerate(jobs):
            if i not in opened:
                continue
            o = opened[i]
            acked: ShareAcknowledged | None = None
            got: ShareFetchPartition | None = None
            state, released, changed = o.state, False, job.ask is not None
            if job.batches is not None:
                outcome = share_acknowledgement.acknowledge(
                    state,
                    member_id,
                    job.batches,
                    now_ms=broker.now(),
                    config=o.config.delivery,
                    lock_duration_ms=lock_duration_ms,
                )
                if isinstance(outcome, sp.Refused):
                    acked = ShareAcknowledged(job.topic, job.partition, error=outcome.error())
                else:
                    acked = ShareAcknowledged(job.topic, job.partition, outcome)
                    state, released, changed = outcome.state, bool(outcome.released), True
            if job.ask is not None:
                got, state, expired = _acquire_locked(conn, broker, member_id, o, state, job.ask)
                released = released or expired
            out[i] = (acked, got)
            if changed:
                writes.append(share_store.SharePartitionWrite(job.topic, job.partition, o.stored, state, released))
        share_store.share_partitions_write(conn, group_id, writes, commit=True)
    return [out[i] for i in range(len(jobs))], config


def _serve_or_fail(
    broker: Broker,
    group_id: str,
    member_id: str,
    jobs: Sequence[_Job],
    config: ShareConfigs | None,
    lock_duration_ms: int | None,
    topic_ids: Mapping[str, uuid.UUID],
) -> tuple[list[_Served], ShareConfigs | None]:
    """``_serve``, its database transaction's failure (a conflict, a timeout) answered as each of
    its partitions' error; a server error raised."""
    try:
        return _serve(broker, group_id, member_id, jobs, config, lock_duration_ms, topic_ids)
    except TxlogError as exc:
        if exc.code is ErrorCode.UNKNOWN_SERVER_ERROR:
            raise
        return [
            (
                None if job.batches is None else ShareAcknowledged(job.topic, job.partition, error=exc),
                None if job.ask is None else ShareFetchPartition(job.topic, job.partition, error=exc),
            )
            for job in jobs
        ], config


def fetch(
    broker: Broker,
    group_id: str,
    member_id: str,
    partitions: Sequence[tuple[str, int]],
    acknowledgements: Mapping[tuple[str, int], Sequence[sp.AcknowledgementBatch]] | None = None,
    max_records: int = 500,
    max_bytes: int = DEFAULT_MAX_BYTES,
    isolation_level: IsolationLevel | None = None,
    lock_duration_ms: int | None = None,
    topic_ids: Mapping[str, uuid.UUID] | None = None,
) -> tuple[list[ShareAcknowledged], list[ShareFetchPartition]]:
    """Kafka's ShareFetch whole: the ``acknowledgements`` (as ``acknowledge`` takes them) applied
    before acquiring, as ``acquire`` acquires — the acknowledgements and the first partition read
    are one database transaction (``_serve``), the acknowledgements applied first. The
    acknowledgements' answers in the order of ``acknowledgements``, and the acquisitions' in the
    order of ``partitions``. ``topic_ids``:
    the ids the caller knows topics by (a Kafka client's), each partition of a topic whose name
    no longer has that id refused UNKNOWN_TOPIC_ID, checked under its lock."""
    if not member_id:
        raise TxlogError(ErrorCode.INVALID_REQUEST, "A share fetch needs a member id")
    if max_records < 1 or max_bytes < 1:
        raise TxlogError(ErrorCode.INVALID_REQUEST, "max_records and max_bytes must be positive")
    acks = dict(acknowledgements or {})
    ids = topic_ids or {}
    # The configs are read in the first transaction, and kept for the rest.
    config: ShareConfigs | None = None
    acked: dict[tuple[str, int], ShareAcknowledged] = {}

    def serve(jobs: list[_Job]) -> list[ShareFetchPartition | None]:
        nonlocal config
        served, config = _serve_or_fail(broker, group_id, member_id, jobs, config, lock_duration_ms, ids)
        for job, (answer, _) in zip(jobs, served):
            if answer is not None:
                acked[(job.topic, job.partition)] = answer
        return [got for _, got in served]

    # Every acknowledgement rides with the first partition read: one database transaction (and
    # one commit) for a consumer's acceptances and its next records, wherever each was. A partition
    # read later is read after its acknowledgements all the same.
    first = partitions[0] if partitions else None
    pending = [
        _Job(topic, partition, batches, None) for (topic, partition), batches in acks.items() if (topic, partition) != first
    ]
    left = max_records
    out: list[ShareFetchPartition] = []
    for topic, partition in partitions:
        if left <= 0:
            out.append(ShareFetchPartition(topic, partition))
            continue
        ask = _Acquisition(left, max_bytes, isolation_level, lock_duration_ms)
        got = serve([*pending, _Job(topic, partition, acks.get((topic, partition)) if not out else None, ask)])[-1]
        pending = []
        assert got is not None
        if got.error is None:
            left -= sp.record_count(got.acquired)
        out.append(got)
    if pending:
        serve(pending)
    return [acked[key] for key in acks if key in acked], out


def acquire(
    broker: Broker,
    group_id: str,
    member_id: str,
    partitions: Sequence[tuple[str, int]],
    max_records: int = 500,
    max_bytes: int = DEFAULT_MAX_BYTES,
    isolation_level: IsolationLevel | None = None,
    lock_duration_ms: int | None = None,
) -> list[ShareFetchPartition]:
    """Kafka's ShareFetch (the acquiring half): ``member_id`` acquires up to ``max_records``
    records in all over ``partitions``, taken in the order given (a caller spreading members over
    partitions rotates them), each partition within ``max_bytes``. A share partition the group
    never read starts per share.auto.offset.reset (latest by default). read_committed (the
    group's share.isolation.level unless ``isolation_level`` is given) reads up to the last stable
    offset and archives the records of aborted transactions; control records are never delivered.
    ``lock_duration_ms`` overrides share.record.lock.duration.ms (an invisible time). Errors per
    partition (UNKNOWN_TOPIC_OR_PARTITION, a database conflict); one partition each in its own
    database transaction, its row lock held only for it (the next partition is read only when
    this one left room). Never waits for records: see
    ``acquire_waiting`` for that."""
    return fetch(broker, group_id, member_id, partitions, None, max_records, max_bytes, isolation_level, lock_duration_ms)[1]


async def acquire_waiting(
    broker: Broker,
    notifier: AppendNotifier | None,
    run_blocking: RunBlocking,
    group_id: str,
    member_id: str,
    partitions: Sequence[tuple[str, int]],
    wait_ms: int,
    max_records: int = 500,
    max_bytes: int = DEFAULT_MAX_BYTES,
    isolation_level: IsolationLevel | None = None,
    min_bytes: int = 1,
    batch_size: int | None = None,
    lock_duration_ms: int | None = None,
    acknowledgements: Mapping[tuple[str, int], Sequence[sp.AcknowledgementBatch]] | None = None,
) -> list[ShareFetchPartition]:
    """A long-polled ShareFetch, for every way in: ``acquire``, and until it acquired records of
    at least ``min_bytes`` (or ``max_records`` or ``max_bytes`` are used up), wait — at most
    ``wait_ms``, bounded as a fetch's long poll is — and acquire again, adding to what it has.

    The wait ends at an append to one of ``partitions`` or records given back there (released, a
    member gone, expired by the sweeper: those transactions notify as an append does), and at the
    earliest lock deadline held on them (records another member holds come back by the clock, and
    nobody notifies that: the next acquisition takes them) — one wait, one timer, no polling.
    Records acquired while it waits for ``min_bytes`` stay locked to the member, their lock
    running. ``batch_size``: acquired runs cut to at most that many records (``in_batches``).
    ``max_bytes`` bounds each partition's records (KIP-74: a first record larger is still
    given), less what earlier acquisitions of the same request took. ``lock_duration_ms``: as
    ``acquire``'s (RocketMQ's invisible duration). ``run_blocking`` runs ``acquire`` off the event
    loop. ``acknowledgements``: see ``fetch_waiting``, which answers them too."""
    return (
        await fetch_waiting(
            broker,
            notifier,
            run_blocking,
            group_id,
            member_id,
            partitions,
            wait_ms,
            max_records,
            max_bytes,
            isolation_level,
            min_bytes,
            batch_size,
            acknowledgements,
            lock_duration_ms=lock_duration_ms,
        )
    )[1]


async def fetch_waiting(
    broker: Broker,
    notifier: AppendNotifier | None,
    run_blocking: RunBlocking,
    group_id: str,
    member_id: str,
    partitions: Sequence[tuple[str, int]],
    wait_ms: int,
    max_records: int = 500,
    max_bytes: int = DEFAULT_MAX_BYTES,
    isolation_level: IsolationLevel | None = None,
    min_bytes: int = 1,
    batch_size: int | None = None,
    acknowledgements: Mapping[tuple[str, int], Sequence[sp.AcknowledgementBatch]] | None = None,
    topic_ids: Mapping[str, uuid.UUID] | None = None,
    lock_duration_ms: int | None = None,
) -> tuple[list[ShareAcknowledged], list[ShareFetchPartition]]:
    """``acquire_waiting`` carrying a ShareFetch's ``acknowledgements``, applied by its first
    acquisition (``fetch``: they and the first partition read are one database transaction)
    before any wait. Their answers, and the acquisitions'. ``topic_ids``: as ``fetch`` takes them."""
    acked: list[ShareAcknowledged] = []

    got: dict[tuple[str, int], ShareFetchPartition] = {}
    left = [max_records, max_bytes]
    pending = [acknowledgements] if acknowledgements else []

    def once() -> list[ShareFetchPartition]:
        if left[0] > 0 and left[1] > 0:
            answers, read = fetch(
                broker,
                group_id,
                member_id,
                partitions,
                pending.pop() if pending else None,
                left[0],
                left[1],
                isolation_level,
                lock_duration_ms,
                topic_ids=topic_ids,
            )
            acked.extend(answers)
            for part in read:
                got[(part.topic, part.partition)] = _merged(got.get((part.topic, part.partition)), part)
                left[0] -= sp.record_count(part.acquired)
                left[1] -= part.bytes
        return [got[(t, p)] for t, p in dict.fromkeys(partitions) if (t, p) in got]

    def enough(parts: list[ShareFetchPartition]) -> bool:
        if not any(p.acquired for p in parts):
            return False
        return left[0] <= 0 or left[1] <= 0 or sum(p.bytes for p in parts) >= min_bytes

    def due_in(parts: list[ShareFetchPartition]) -> float | None:
        waits = [
            (p.next_lock_deadline_ms - p.read_at_ms) / 1000
            for p in parts
            if p.next_lock_deadline_ms is not None and p.read_at_ms is not None
        ]
        return max(0.0, min(waits)) if waits else None

    parts = await wait_for_records(
        notifier,
        partitions,
        wait_ms,
        broker.settings.max_fetch_wait_ms,
        broker.settings.max_long_polls,
        lambda: run_blocking(once),
        enough,
        due_in,
    )
    if pending:  # nothing was acquired (nothing may be): the acknowledgements still count
        acked.extend(
            await run_blocking(functools.partial(acknowledge, broker, group_id, member_id, pending.pop(), topic_ids=topic_ids))
        )
    if batch_size is None:
        return acked, parts
    return acked, [dataclasses.replace(p, acquired=share_acquisition.in_batches(p.acquired, batch_size)) for p in parts]


def _merged(before: ShareFetchPartition | None, now: ShareFetchPartition) -> ShareFetchPartition:
    """One partition's answer over several acquisitions of one long-polled fetch: everything
    acquired, in offset order, with the latest reading's offsets and lock deadline (an error only
    where nothing was acquired)."""
    if before is None or not before.acquired:
        return now
    if now.error is not None or not now.acquired:
        return dataclasses.replace(
            before, next_lock_deadline_ms=now.next_lock_deadline_ms or before.next_lock_deadline_ms, read_at_ms=now.read_at_ms
        )
    pairs = sorted(zip(before.records + now.records, before.delivery_counts + now.delivery_counts), key=lambda rc: rc[0].offset)
    return dataclasses.replace(
        now,
        acquired=tuple(sorted(before.acquired + now.acquired, key=lambda a: a.first_offset)),
        records=tuple(r for r, _ in pairs),
        delivery_counts=tuple(c for _, c in pairs),
    )


# --- acknowledging --------------------------------------------------------------------------------


def acknowledge(
    broker: Broker,
    group_id: str,
    member_id: str,
    acks: Mapping[tuple[str, int], Sequence[sp.AcknowledgementBatch]],
    lock_duration_ms: int | None = None,
    topic_ids: Mapping[str, uuid.UUID] | None = None,
) -> list[ShareAcknowledged]:
    """Kafka's ShareAcknowledge (and a ShareFetch's acknowledgements): per share partition, its
    batches (ACCEPT, RELEASE, REJECT, GAP, RENEW by Kafka's type ids) taken whole or refused whole,
    under its row lock; answers in the order of ``acks``. ``topic_ids``: as ``fetch`` takes them."""
    if not member_id:
        raise TxlogError(ErrorCode.INVALID_REQUEST, "An acknowledgement needs a member id")
    # One database transaction for them all, the group's configs read in the statement reading
    # the first partition's state: an acknowledgement of one partition (a batch, as a consumer
    # sends them) takes two round trips.
    jobs = [_Job(topic, partition, batches, None) for (topic, partition), batches in acks.items()]
    served, _ = _serve_or_fail(broker, group_id, member_id, jobs, None, lock_duration_ms, topic_ids or {})
    return [answer for answer, _ in served if answer is not None]
