"""Consumer groups against a real ``txlog kafka`` on a real PostgreSQL, with the real clients:
confluent-kafka (librdkafka), kafka-python and aiokafka join, rebalance (1 → 3 → 1 members), commit
and read back offsets, lose a member to its session timeout (``kill -9``), restart a static member
without a rebalance, and read a transaction's pending offset as UNSTABLE_OFFSET_COMMIT; the admin
clients list and describe groups and their offsets; raw frames check OffsetCommit and OffsetFetch
version by version, the generation fence of OffsetCommit and TxnOffsetCommit, and that a JoinGroup
waiting when the gateway stops is answered.

Each consumer of a group runs in a thread of its own (aiokafka on an event loop of its own) and
commits synchronously after each batch it processed; a consumer that must die without leaving is
a subprocess of this module (``python -m tests.kafka.test_groups``), killed with SIGKILL.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, Iterable, Iterator

import pytest

from app.domain.groups.offsets import GroupOffset
from app.domain.records import NewRecord
from app.errors import ErrorCode
from app.services import Broker, topics
from app.services import groups as groups_service
from app.services import produce as produce_service
from app.services import transactions as txn_service
from app.services.produce import ProduceRequest
from app.wire.kafka.messages import ApiKey
from app.wire.kafka.structs import decode_response
from tests.conftest import fresh_database, make_broker
from tests.kafka.conftest import GatewayProcess
from tests.support import ROOT, wait_until

CLIENTS = ("confluent", "kafka-python", "aiokafka")
PARTITIONS = 6
SESSION_MS = 6_000  # what members ask for, unless a test needs them gone sooner
HEARTBEAT_MS = 250
E = ErrorCode


@pytest.fixture(scope="module")
def group_gateway(pg_admin_url: str, template_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """One gateway for this module's groups (each test names its own topics and groups), quick to
    start a group (100 ms initial rebalance delay) and allowing sessions from 1 s."""
    log = tmp_path_factory.mktemp("groups") / "gateway.log"
    env = {"TXLOG_KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "100", "TXLOG_KAFKA_GROUP_MIN_SESSION_TIMEOUT_MS": "1000"}
    with fresh_database(pg_admin_url, template_db) as url, GatewayProcess(url, env=env, log_path=log) as gateway:
        yield gateway


@pytest.fixture(scope="module")
def store(group_gateway: GatewayProcess) -> Iterator[Broker]:
    """txlog's own services on the gateway's database."""
    b = make_broker(group_gateway.database_url)
    yield b
    b.db.dispose()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def new_topic(store: Broker, partitions: int = PARTITIONS) -> str:
    name = unique("grp")
    topics.create_topic(store, name, partitions)
    return name


def write(store: Broker, topic: str, per_partition: int, partitions: int = PARTITIONS) -> None:
    """``per_partition`` plain records on each partition, through the produce service."""
    for p in range(partitions):
        batch = [NewRecord(None, f"{p}-{i}".encode()) for i in range(per_partition)]
        produce_service.produce(store, topic, p, ProduceRequest(batch))


def committed(store: Broker, group: str, topic: str, partitions: int = PARTITIONS) -> dict[int, int | None]:
    fetched = groups_service.offset_fetch_partitions(store, group, [(topic, p) for p in range(partitions)])
    return {f.partition: f.offset for f in fetched}


# -- one consumer of a group, whatever its client ----------------------------------------------------


class Member:
    """A consumer subscribed to one topic in one group. It polls, records each record it gets,
    commits after each batch (synchronously, the next offset of each partition) and publishes its
    assignment as its rebalance callbacks see it. ``stop`` closes it: a dynamic member leaves the
    group, a static one (``instance_id``) does not."""

    def __init__(
        self,
        client: str,
        bootstrap: str,
        group: str,
        topic: str,
        *,
        name: str = "",
        instance_id: str | None = None,
        session_ms: int = SESSION_MS,
        read_committed: bool = False,
        on_change: Callable[["Member"], None] | None = None,
    ) -> None:
        self.client, self.bootstrap, self.group, self.topic = client, bootstrap, group, topic
        self.name = name or unique(client)
        self.instance_id = instance_id
        self.session_ms = session_ms
        self.read_committed = read_committed
        self.on_change = on_change
        self.assignment: frozenset[int] = frozenset()
        self.assigned = 0  # assignments received
        self.revoked = 0  # revocations received
        self.records: list[tuple[int, int]] = []  # (partition, offset) in the order consumed
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self.run, name=self.name, daemon=True)

    def start(self) -> "Member":
        self._thread.start()
        return self

    def stop(self, timeout: float = 30) -> None:
        self._stop.set()
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"{self.name} did not close"

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self) -> None:
        try:
            {"confluent": _run_confluent, "kafka-python": _run_kafka_python, "aiokafka": _run_aiokafka}[self.client](self)
        except BaseException as exc:  # noqa: BLE001 - reported by the test, not lost in a thread
            self.errors.append(f"{type(exc).__name__}: {exc}")

    def on_assigned(self, partitions: Iterable[int]) -> None:
        self.assignment = frozenset(partitions)
        self.assigned += 1
        if self.on_change:
            self.on_change(self)

    def on_revoked(self) -> None:
        self.assignment = frozenset()
        self.revoked += 1
        if self.on_change:
            self.on_change(self)


def _run_confluent(m: Member) -> None:
    from confluent_kafka import Consumer, TopicPartition

    conf = {
        "bootstrap.servers": m.bootstrap,
        "group.id": m.group,
        "client.id": m.name,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "session.timeout.ms": m.session_ms,
        "heartbeat.interval.ms": HEARTBEAT_MS,
        "fetch.wait.max.ms": 50,
        "isolation.level": "read_committed" if m.read_committed else "read_uncommitted",
    }
    if m.instance_id:
        conf["group.instance.id"] = m.instance_id
    consumer = Consumer(conf)
    consumer.subscribe(
        [m.topic],
        on_assign=lambda _c, parts: m.on_assigned(p.partition for p in parts),
        on_revoke=lambda _c, parts: m.on_revoked(),
    )
    try:
        while not m.stopping:
            batch = consumer.consume(num_messages=100, timeout=0.05)
            last: dict[int, int] = {}
            for msg in batch:
                if msg.error():
                    m.errors.append(str(msg.error()))
                    continue
                m.records.append((msg.partition(), msg.offset()))
                last[msg.partition()] = msg.offset()
            if last:
                consumer.commit(
                    offsets=[TopicPartition(m.topic, p, o + 1, f"by {m.name}") for p, o in last.items()], asynchronous=False
                )
    finally:
        consumer.close()


def _run_kafka_python(m: Member) -> None:
    from kafka.structs import OffsetAndMetadata

    from kafka import ConsumerRebalanceListener, KafkaConsumer

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked):  # type: ignore[no-untyped-def]
            m.on_revoked()

        def on_partitions_assigned(self, assigned):  # type: ignore[no-untyped-def]
            m.on_assigned(tp.partition for tp in assigned)

    consumer = KafkaConsumer(
        bootstrap_servers=m.bootstrap,
        group_id=m.group,
        client_id=m.name,
        group_instance_id=m.instance_id,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=m.session_ms,
        heartbeat_interval_ms=HEARTBEAT_MS,
        fetch_max_wait_ms=50,
        isolation_level="read_committed" if m.read_committed else "read_uncommitted",
    )
    consumer.subscribe([m.topic], listener=Listener())
    # kafka-python 3.0.12 loses a join's answer when its leader rejoins because the topic's metadata
    # came after its first assignment and the join outlasts a poll: the member waits in the join with
    # heartbeats off until its session ends. Reading the topic's partitions before the first poll
    # gives the first assignment the partitions, so the metadata that follows changes nothing. A join
    # that outlasts a poll is also sent again when the next poll finds it done but not taken up,
    # starting another rebalance: polls of a quarter second outlast a join on a loaded machine.
    try:
        assert consumer.partitions_for_topic(m.topic), f"{m.topic} has partitions"
        while not m.stopping:
            batches = consumer.poll(timeout_ms=250)
            offsets = {}
            for tp, records in batches.items():
                for r in records:
                    m.records.append((tp.partition, r.offset))
                offsets[tp] = OffsetAndMetadata(records[-1].offset + 1, f"by {m.name}", -1)
            if offsets:
                consumer.commit(offsets)
    finally:
        consumer.close()


def _run_aiokafka(m: Member) -> None:
    asyncio.run(_aiokafka_member(m))


async def _aiokafka_member(m: Member) -> None:
    from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
    from aiokafka.structs import OffsetAndMetadata

    # aiokafka rebalances in a task of its own, while getmany waits (getmany answers records of the
    # assignment current when it returns): a revocation waits for the batch in hand to be
    # processed and committed. The lock is free when getmany returns, so taking it does not yield
    # to the rebalance in between.
    busy = asyncio.Lock()

    class Listener(ConsumerRebalanceListener):
        async def on_partitions_revoked(self, revoked):  # type: ignore[no-untyped-def]
            async with busy:
                m.on_revoked()

        async def on_partitions_assigned(self, assigned):  # type: ignore[no-untyped-def]
            m.on_assigned(tp.partition for tp in assigned)

    consumer = AIOKafkaConsumer(
        bootstrap_servers=m.bootstrap,
        group_id=m.group,
        client_id=m.name,
        group_instance_id=m.instance_id,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=m.session_ms,
        heartbeat_interval_ms=HEARTBEAT_MS,
        fetch_max_wait_ms=50,
        isolation_level="read_committed" if m.read_committed else "read_uncommitted",
    )
    consumer.subscribe([m.topic], listener=Listener())
    await consumer.start()
    try:
        while not m.stopping:
            batches = await consumer.getmany(timeout_ms=50)
            async with busy:
                offsets = {}
                for tp, records in batches.items():
                    for r in records:
                        m.records.append((tp.partition, r.offset))
                    offsets[tp] = OffsetAndMetadata(records[-1].offset + 1, f"by {m.name}")
                if offsets:
                    await consumer.commit(offsets)
    finally:
        await consumer.stop()


def settled(members: list[Member], partitions: int = PARTITIONS) -> bool:
    """Every partition is assigned to exactly one of ``members``, each has its even share."""
    assignments = [m.assignment for m in members]
    every = [p for a in assignments for p in a]
    return sorted(every) == list(range(partitions)) and all(len(a) == partitions // len(members) for a in assignments)


def wait_for(members: list[Member], predicate: Callable[[], object], what: str, timeout: float = 30) -> None:
    """Wait until ``predicate()``; a member's error ends the wait at once."""

    def check() -> object:
        errors = [e for m in members for e in m.errors]
        assert not errors, errors
        return predicate()

    wait_until(check, timeout, 0.05, what)


def wait_settled(members: list[Member], timeout: float = 30) -> None:
    wait_for(members, lambda: settled(members), f"{len(members)} members to share the partitions", timeout)


def consumed(members: list[Member]) -> list[tuple[int, int]]:
    return [r for m in members for r in m.records]


# -- 1 → 3 → 1 -----------------------------------------------------------------------------------------


class Writer:
    """Writes one record to each partition every few milliseconds, in a thread, until stopped."""

    def __init__(self, store: Broker, topic: str, partitions: int = PARTITIONS) -> None:
        self.store, self.topic, self.partitions = store, topic, partitions
        self.written = [0] * partitions
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            while not self._stop.wait(0.01):
                for p in range(self.partitions):
                    produce_service.produce(self.store, self.topic, p, ProduceRequest([NewRecord(None, b"x")]))
                    self.written[p] += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.errors.append(f"{type(exc).__name__}: {exc}")

    def __enter__(self) -> "Writer":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    @property
    def total(self) -> int:
        return sum(self.written)


@pytest.mark.parametrize("client", CLIENTS)
def test_a_group_grows_to_three_and_shrinks_to_one_and_each_record_is_consumed_once(
    group_gateway: GatewayProcess, store: Broker, client: str
) -> None:
    """Records keep arriving while members join and leave; each member commits synchronously
    after each batch, so a partition's next owner starts where the last one stopped: every
    record is consumed once, and the group's offsets end at the end of each partition."""
    topic, group = new_topic(store), unique("g")
    start = lambda: Member(client, group_gateway.bootstrap, group, topic).start()  # noqa: E731
    a = start()
    members = [a]
    try:
        with Writer(store, topic) as writer:
            wait_settled([a])
            wait_for(members, lambda: len(a.records) >= 60, "the first member to consume")

            b, c = start(), start()
            members += [b, c]
            wait_settled([a, b, c])
            wait_for(members, lambda: len(b.records) >= 20 and len(c.records) >= 20, "the newcomers to consume")

            b.stop()
            c.stop()
            wait_settled([a])
            seen = len(a.records)
            wait_for(members, lambda: len(a.records) >= seen + 60, "the last member to consume again")
        assert not writer.errors
        wait_for(members, lambda: len(consumed(members)) >= writer.total, "the last member to consume the rest")
        final = {p: n for p, n in enumerate(writer.written)}
        wait_for(members, lambda: committed(store, group, topic) == final, "the last commits")
    finally:
        for m in members:
            if not m.stopping:
                m.stop()
    assert not [e for m in members for e in m.errors]
    assert sorted(consumed(members)) == [(p, o) for p in range(PARTITIONS) for o in range(writer.written[p])], "each record once"
    assert a.assigned >= 3 and a.revoked >= 2  # an assignment per rebalance: to 1, 3, then 1 member


# -- a member that stops heartbeating --------------------------------------------------------------


def _subprocess_member(
    client: str, bootstrap: str, group: str, topic: str, session_ms: int, report: Path
) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXLOG_")}
    with open(report.with_suffix(".log"), "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.kafka.test_groups", client, bootstrap, group, topic, str(session_ms), str(report)],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _reported(report: Path) -> frozenset[int]:
    try:
        return frozenset(json.loads(report.read_text()))
    except (FileNotFoundError, ValueError):
        return frozenset()


@pytest.mark.parametrize("client", CLIENTS)
def test_a_killed_member_is_removed_after_its_session_timeout_and_its_partitions_move(
    group_gateway: GatewayProcess, store: Broker, client: str, tmp_path: Path
) -> None:
    topic, group = new_topic(store), unique("g")
    session_ms = 2_000
    report = tmp_path / "assignment.json"
    victim = _subprocess_member(client, group_gateway.bootstrap, group, topic, session_ms, report)
    survivor = Member(client, group_gateway.bootstrap, group, topic).start()
    try:

        def shared() -> bool:
            assert victim.poll() is None, report.with_suffix(".log").read_text(errors="replace")
            assert not survivor.errors, survivor.errors
            theirs, ours = _reported(report), survivor.assignment
            return len(theirs) == len(ours) == PARTITIONS // 2 and not theirs & ours

        wait_until(shared, 60, 0.05, "the subprocess member and this one to share the partitions")
        killed_at = time.monotonic()
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait(10)
        wait_settled([survivor], timeout=30)
        moved_after = time.monotonic() - killed_at
    finally:
        if victim.poll() is None:
            os.killpg(victim.pid, signal.SIGKILL)
            victim.wait(10)
        survivor.stop()
    # removed by its session timeout, not before it (its last heartbeat was at most one interval
    # before the kill), and then at once
    assert (session_ms - HEARTBEAT_MS) / 1000 - 0.2 <= moved_after <= session_ms / 1000 + 8, moved_after
    assert not survivor.errors


# -- static membership ---------------------------------------------------------------------------------


@pytest.mark.parametrize("client", CLIENTS)
def test_a_static_member_restarted_within_its_session_gets_its_partitions_back_without_a_rebalance(
    group_gateway: GatewayProcess, store: Broker, client: str
) -> None:
    topic, group = new_topic(store), unique("g")
    write(store, topic, 5)
    session_ms = 4_000

    def start(instance: str) -> Member:
        return Member(client, group_gateway.bootstrap, group, topic, instance_id=instance, session_ms=session_ms).start()

    a, b = start("host-a"), start("host-b")
    b2 = None
    try:
        wait_settled([a, b])
        wait_for([a, b], lambda: len(consumed([a, b])) >= 30, "every record consumed")
        before = (a.assignment, a.assigned, a.revoked)
        b_partitions = b.assignment
        b.stop()  # a static member does not leave the group when it closes
        stopped = time.monotonic()
        b2 = start("host-b")
        wait_for([a, b2], lambda: b2.assignment == b_partitions, "the restarted member's partitions", session_ms / 1000)
        # past the closed instance's session (it must not end the one that took over), and past
        # the heartbeat that would bring a rebalance to the other member
        time.sleep(max(stopped + (session_ms + 4 * HEARTBEAT_MS) / 1000 - time.monotonic(), 0))
        assert (a.assignment, a.assigned, a.revoked) == before, "the other member saw no rebalance"
        assert not b2.records, "the restarted member resumes from the committed offsets"
        write(store, topic, 1)
        wait_for([a, b2], lambda: len(consumed([a, b, b2])) >= 36, "the new records consumed")
        assert {p for p, _ in b2.records} == set(b_partitions)
    finally:
        for m in (a, b, b2):
            if m is not None and not m.stopping:
                m.stop()
    assert not [e for m in (a, b, b2) if m for e in m.errors]
    assert sorted(consumed([a, b, b2])) == [(p, o) for p in range(PARTITIONS) for o in range(6)]


# -- offsets pending in a transaction (KIP-447's require_stable) ---------------------------------------


@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
def test_a_read_committed_consumer_waits_for_an_offset_pending_in_a_transaction(
    group_gateway: GatewayProcess, store: Broker, client: str
) -> None:
    """librdkafka and kafka-python ask OffsetFetch for stable offsets when read_committed (aiokafka
    never does): while a transaction holds an offset for the group, the partition answers
    UNSTABLE_OFFSET_COMMIT and the consumer asks again; once it commits, consumption starts there."""
    topic, group = new_topic(store, 1), unique("g")
    write(store, topic, 10, partitions=1)
    groups_service.offset_commit(store, group, [GroupOffset(topic, 0, 2, "before")])
    tid = unique("tx")
    ids = txn_service.init_producer_id(store, tid, 60_000)
    txn_service.add_offsets_to_txn(store, tid, ids.producer_id, ids.producer_epoch, group)
    txn_service.txn_offset_commit(store, tid, ids.producer_id, ids.producer_epoch, group, [GroupOffset(topic, 0, 7, "txn")])
    member = Member(client, group_gateway.bootstrap, group, topic, read_committed=True).start()
    try:
        wait_for([member], lambda: member.assignment == {0}, "the member's assignment")
        time.sleep(1.5)
        assert member.records == [], "nothing is consumed while the offset is pending"
        txn_service.end_txn(store, tid, ids.producer_id, ids.producer_epoch, "commit", 1)
        wait_for([member], lambda: len(member.records) >= 3, "the records after the transaction's offset")
    finally:
        member.stop()
    assert not member.errors
    assert member.records == [(0, 7), (0, 8), (0, 9)]


# -- admin clients: ListGroups, DescribeGroups, OffsetFetch of a group ----------------------------------


def test_admin_clients_list_and_describe_groups_and_their_offsets(group_gateway: GatewayProcess, store: Broker) -> None:
    from confluent_kafka import ConsumerGroupState, ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import AdminClient
    from kafka.admin import KafkaAdminClient

    topic, group, simple = new_topic(store), unique("g"), unique("simple")
    write(store, topic, 3)
    members = [Member("confluent", group_gateway.bootstrap, group, topic, name=f"c{i}").start() for i in range(2)]
    try:
        wait_settled(members)
        wait_for(members, lambda: len(consumed(members)) >= 18, "every record consumed")
        admin = AdminClient({"bootstrap.servers": group_gateway.bootstrap})
        # a group that only ever had offsets committed for it (OffsetCommit at generation -1)
        altered = admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(simple, [TopicPartition(topic, 1, 2)])])
        assert [(tp.partition, tp.offset, tp.error) for tp in altered[simple].result().topic_partitions] == [(1, 2, None)]
        listed = {g.group_id: g for g in admin.list_consumer_groups(request_timeout=10).result().valid}
        assert listed[group].state == ConsumerGroupState.STABLE and not listed[group].is_simple_consumer_group
        assert listed[simple].state == ConsumerGroupState.EMPTY and listed[simple].is_simple_consumer_group
        empty = admin.describe_consumer_groups([simple], request_timeout=10)[simple].result()
        assert (empty.state, empty.members) == (ConsumerGroupState.EMPTY, [])

        described = admin.describe_consumer_groups([group], request_timeout=10)[group].result()
        assert described.state == ConsumerGroupState.STABLE and described.partition_assignor == "range"
        assert sorted(m.client_id for m in described.members) == ["c0", "c1"]
        assigned = sorted(tp.partition for m in described.members for tp in m.assignment.topic_partitions)
        assert assigned == list(range(PARTITIONS))

        request = [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in range(PARTITIONS)])]
        offsets = admin.list_consumer_group_offsets(request, request_timeout=10)[group].result().topic_partitions
        assert sorted((tp.partition, tp.offset) for tp in offsets) == [(p, 3) for p in range(PARTITIONS)]
        assert all(tp.metadata.startswith("by c") for tp in offsets)

        kp = KafkaAdminClient(bootstrap_servers=group_gateway.bootstrap)
        try:
            assert {
                "group_id": group,
                "protocol_type": "consumer",
                "group_state": "Stable",
                "group_type": "classic",
            } in kp.list_groups()
            info = kp.describe_groups([group])[group]
            assert info["error"] is None and info["group_state"] == "Stable" and info["protocol_data"] == "range"
            parts = sorted(
                p for m in info["members"] for t in m["member_assignment"]["assigned_partitions"] for p in t["partitions"]
            )
            assert parts == list(range(PARTITIONS))
            kp_offsets = kp.list_group_offsets({group: None, simple: None})  # OffsetFetch v8: two groups, every partition
            assert sorted((tp.partition, om.offset) for tp, om in kp_offsets[group].items()) == [
                (p, 3) for p in range(PARTITIONS)
            ]
            assert [(tp.partition, om.offset) for tp, om in kp_offsets[simple].items()] == [(1, 2)]
            assert kp.describe_groups([simple])[simple]["group_state"] == "Empty"
        finally:
            kp.close()
    finally:
        for m in members:
            m.stop()
    assert not [e for m in members for e in m.errors]


# -- the wire, version by version ----------------------------------------------------------------------


def _commit_body(
    group: str,
    offsets: list[tuple[str, int, int, str | None]],
    generation: int = -1,
    member: str = "",
    instance: str | None = None,
) -> dict:
    topics: dict[str, list[dict]] = {}
    for t, p, o, meta in offsets:
        topics.setdefault(t, []).append({"partition_index": p, "committed_offset": o, "committed_metadata": meta})
    return {
        "group_id": group,
        "generation_id_or_member_epoch": generation,
        "member_id": member,
        "group_instance_id": instance,
        "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()],
    }


def _codes(response) -> list[tuple[str, int, int]]:  # type: ignore[no-untyped-def]
    return [(t.name, p.partition_index, p.error_code) for t in response.topics for p in t.partitions]


def _fetched(topics) -> list[tuple[str, int, int, str | None, int]]:  # type: ignore[no-untyped-def]
    return [(t.name, p.partition_index, p.committed_offset, p.metadata, p.error_code) for t in topics for p in t.partitions]


@pytest.mark.parametrize("version", range(2, 10))
def test_offset_commit_answers_each_partition_and_commits_the_others(
    group_gateway: GatewayProcess, store: Broker, version: int
) -> None:
    topic, group = new_topic(store, 2), unique("g")
    with group_gateway.connect() as conn:
        body = _commit_body(
            group, [(topic, 0, 5, "five"), (topic, 1, 6, None), (topic, 2, 1, ""), ("nope", 0, 1, ""), (topic, 0, 7, "seven")]
        )
        answer = conn.request(ApiKey.OffsetCommit, version, body)
        unknown = E.UNKNOWN_TOPIC_OR_PARTITION.kafka_code
        assert _codes(answer) == [(topic, 0, 0), (topic, 1, 0), (topic, 2, unknown), (topic, 0, 0), ("nope", 0, unknown)]
        assert committed(store, group, topic, 2) == {0: 7, 1: 6}  # a partition given twice keeps its last offset
        negative = conn.request(ApiKey.OffsetCommit, version, _commit_body(group, [(topic, 0, -1, ""), (topic, 1, 9, "")]))
        assert _codes(negative) == [(topic, 0, E.INVALID_REQUEST.kafka_code), (topic, 1, 0)]
        # any string Kafka keeps, a NUL inside included (confluent-kafka's Python binding ends each
        # metadata with its C string's NUL, and gets it back, from Kafka too)
        terminated = conn.request(ApiKey.OffsetCommit, version, _commit_body(group, [(topic, 1, 10, "ten\x00")]))
        assert _codes(terminated) == [(topic, 1, 0)]
        inner = conn.request(
            ApiKey.OffsetCommit, version, _commit_body(group, [(topic, 1, 10, "a\x00b\x00"), (topic, 0, 7, "seven")])
        )
        assert _codes(inner) == [(topic, 1, 0), (topic, 0, 0)]
        # offset.metadata.max.bytes (4096), counted as Kafka counts it
        long = conn.request(
            ApiKey.OffsetCommit, version, _commit_body(group, [(topic, 1, 12, "m" * 4097), (topic, 0, 7, "s" * 4096)])
        )
        assert _codes(long) == [(topic, 1, E.OFFSET_METADATA_TOO_LARGE.kafka_code), (topic, 0, 0)]
        # a real generation of a group the coordinator does not know, and no group id at all
        stale = conn.request(ApiKey.OffsetCommit, version, _commit_body(group, [(topic, 0, 1, "")], generation=3, member="m-1"))
        assert _codes(stale) == [(topic, 0, E.ILLEGAL_GENERATION.kafka_code)]
        nameless = conn.request(ApiKey.OffsetCommit, version, _commit_body("", [(topic, 0, 1, "")]))
        assert _codes(nameless) == [(topic, 0, E.INVALID_GROUP_ID.kafka_code)]
    fetched = groups_service.offset_fetch_partitions(store, group, [(topic, 0), (topic, 1)])
    assert [(f.offset, f.metadata) for f in fetched] == [(7, "s" * 4096), (10, "a\x00b\x00")]


def test_confluent_kafka_hears_offset_metadata_too_large(group_gateway: GatewayProcess, store: Broker) -> None:
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    topic, group = new_topic(store, 1), unique("g")
    consumer = Consumer({"bootstrap.servers": group_gateway.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        with pytest.raises(KafkaException) as refused:
            consumer.commit(offsets=[TopicPartition(topic, 0, 3, metadata="m" * 5000)], asynchronous=False)
        assert refused.value.args[0].code() == KafkaError.OFFSET_METADATA_TOO_LARGE
        consumer.commit(offsets=[TopicPartition(topic, 0, 4, metadata="fits")], asynchronous=False)
    finally:
        consumer.close()
    # kept as sent, as Kafka keeps it: the binding sends its C string's terminator along
    assert [(f.offset, f.metadata) for f in groups_service.offset_fetch_partitions(store, group, [(topic, 0)])] == [
        (4, "fits\x00")
    ]


def _join(conn, group: str, version: int = 5, member: str = "", instance: str | None = None):  # type: ignore[no-untyped-def]
    body = {
        "group_id": group,
        "session_timeout_ms": 10_000,
        "rebalance_timeout_ms": 10_000,
        "member_id": member,
        "group_instance_id": instance,
        "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": b""}],
    }
    answer = conn.request(ApiKey.JoinGroup, version, body)
    if answer.error_code == E.MEMBER_ID_REQUIRED.kafka_code:
        answer = conn.request(ApiKey.JoinGroup, version, {**body, "member_id": answer.member_id})
    assert answer.error_code == 0
    sync = conn.request(
        ApiKey.SyncGroup,
        3,
        {
            "group_id": group,
            "generation_id": answer.generation_id,
            "member_id": answer.member_id,
            "group_instance_id": instance,
            "assignments": [{"member_id": answer.member_id, "assignment": b""}],
        },
    )
    assert sync.error_code == 0
    return answer


def test_offset_commit_is_fenced_by_the_group_generation(group_gateway: GatewayProcess, store: Broker) -> None:
    """A member of the current generation commits; an older generation, an unknown member, a
    fenced static instance or a "simple" consumer (generation -1) while the group has members do
    not, and nothing of theirs is written. Once the group is empty, the simple consumer may."""
    topic, group = new_topic(store, 1), unique("g")
    with group_gateway.connect() as conn:
        joined = _join(conn, group, instance="host-1")
        gen, me = joined.generation_id, joined.member_id

        def commit(offset: int, **fence: object) -> int:
            body = _commit_body(group, [(topic, 0, offset, "")], **fence)  # type: ignore[arg-type]
            return _codes(conn.request(ApiKey.OffsetCommit, 8, body))[0][2]

        assert commit(1, generation=gen, member=me, instance="host-1") == 0
        assert commit(2, generation=gen - 1, member=me, instance="host-1") == E.ILLEGAL_GENERATION.kafka_code
        assert commit(3, generation=gen, member="someone-else") == E.UNKNOWN_MEMBER_ID.kafka_code
        assert commit(4, generation=gen, member="host-1-old", instance="host-1") == E.FENCED_INSTANCE_ID.kafka_code
        assert commit(5) == E.UNKNOWN_MEMBER_ID.kafka_code
        assert committed(store, group, topic, 1) == {0: 1}
        left = conn.request(
            ApiKey.LeaveGroup, 3, {"group_id": group, "members": [{"member_id": me, "group_instance_id": "host-1"}]}
        )
        assert left.error_code == 0 and left.members[0].error_code == 0
        assert commit(6) == 0
        assert commit(7, generation=gen, member=me) == E.UNKNOWN_MEMBER_ID.kafka_code
    assert committed(store, group, topic, 1) == {0: 6}


def test_txn_offset_commit_is_fenced_by_the_group_generation(group_gateway: GatewayProcess, store: Broker) -> None:
    """KIP-447: from v3 a TxnOffsetCommit carries the consumer's generation and member id, and a
    zombie (an older generation, an unknown member, a fenced static instance) is refused with
    nothing left pending in the transaction, so a copier that lost its partitions cannot commit
    their input offsets. Before v3 the request has no generation to check, as in Kafka."""
    topic, group, tid = new_topic(store, 1), unique("g"), unique("tx")
    with group_gateway.connect() as conn:
        joined = _join(conn, group, instance="host-1")
        gen, me = joined.generation_id, joined.member_id
        init = {"transactional_id": tid, "transaction_timeout_ms": 60_000, "producer_id": -1, "producer_epoch": -1}
        pid = conn.request(ApiKey.InitProducerId, 3, init)
        assert pid.error_code == 0
        ids = {"transactional_id": tid, "producer_id": pid.producer_id, "producer_epoch": pid.producer_epoch}

        def commit(offset: int, version: int = 3, **fence: object) -> int:
            partition = {"partition_index": 0, "committed_offset": offset, "committed_leader_epoch": -1, "committed_metadata": ""}
            body = {
                **ids,
                "group_id": group,
                "generation_id": -1,
                "member_id": "",
                "group_instance_id": None,
                **fence,
                "topics": [{"name": topic, "partitions": [partition]}],
            }
            return _codes(conn.request(ApiKey.TxnOffsetCommit, version, body))[0][2]

        def commit_transaction() -> None:
            assert conn.request(ApiKey.EndTxn, 3, {**ids, "committed": True}).error_code == 0

        assert conn.request(ApiKey.AddOffsetsToTxn, 3, {**ids, "group_id": group}).error_code == 0
        assert commit(1, generation_id=gen, member_id=me, group_instance_id="host-1") == 0
        assert commit(2, generation_id=gen - 1, member_id=me, group_instance_id="host-1") == E.ILLEGAL_GENERATION.kafka_code
        assert commit(3, generation_id=gen, member_id="someone-else") == E.UNKNOWN_MEMBER_ID.kafka_code
        assert commit(4, generation_id=gen, member_id="host-1-old", group_instance_id="host-1") == E.FENCED_INSTANCE_ID.kafka_code
        commit_transaction()
        assert committed(store, group, topic, 1) == {0: 1}

        # v2 has no generation: a transaction's offsets from such a client are its own to commit
        assert conn.request(ApiKey.AddOffsetsToTxn, 3, {**ids, "group_id": group}).error_code == 0
        assert commit(5, version=2) == 0
        commit_transaction()
    assert committed(store, group, topic, 1) == {0: 5}


@pytest.mark.parametrize("version", range(1, 10))
def test_offset_fetch_every_version(group_gateway: GatewayProcess, store: Broker, version: int) -> None:
    topic, group, other = new_topic(store, 3), unique("g"), unique("g")
    groups_service.offset_commit(store, group, [GroupOffset(topic, 0, 4, "four"), GroupOffset(topic, 2, 9, "")])
    groups_service.offset_commit(store, other, [GroupOffset(topic, 1, 1, "one")])
    tid = unique("tx")
    ids = txn_service.init_producer_id(store, tid, 60_000)
    txn_service.txn_offset_commit(store, tid, ids.producer_id, ids.producer_epoch, group, [GroupOffset(topic, 2, 11, "")])
    asked = [{"name": topic, "partition_indexes": [0, 1, 2, 7]}, {"name": "nope", "partition_indexes": [0]}]
    want = [(topic, 0, 4, "four", 0), (topic, 1, -1, "", 0), (topic, 2, 9, "", 0), (topic, 7, -1, "", 0), ("nope", 0, -1, "", 0)]
    unstable = E.UNSTABLE_OFFSET_COMMIT.kafka_code
    try:
        with group_gateway.connect() as conn:
            if version < 8:
                answer = conn.request(ApiKey.OffsetFetch, version, {"group_id": group, "topics": asked, "require_stable": False})
                assert _fetched(answer.topics) == want
                if version >= 5:
                    assert {p.committed_leader_epoch for t in answer.topics for p in t.partitions} == {-1}
                if version >= 2:  # null topics: every partition the group has an offset for
                    everything = conn.request(ApiKey.OffsetFetch, version, {"group_id": group, "topics": None})
                    assert everything.error_code == 0
                    assert _fetched(everything.topics) == [(topic, 0, 4, "four", 0), (topic, 2, 9, "", 0)]
                if version >= 7:
                    stable = conn.request(
                        ApiKey.OffsetFetch, version, {"group_id": group, "topics": asked, "require_stable": True}
                    )
                    assert _fetched(stable.topics)[2] == (topic, 2, 9, "", unstable)
                    assert [f[4] for f in _fetched(stable.topics)] == [0, 0, unstable, 0, 0]
                nameless = conn.request(ApiKey.OffsetFetch, version, {"group_id": "", "topics": asked})
                invalid = E.INVALID_GROUP_ID.kafka_code
                if version >= 2:
                    assert (nameless.error_code, nameless.topics) == (invalid, [])
                else:  # v1 has no top-level error: each partition carries it
                    assert {f[4] for f in _fetched(nameless.topics)} == {invalid} and len(_fetched(nameless.topics)) == 5
            else:
                body = {
                    "groups": [
                        {
                            "group_id": group,
                            "topics": [{"name": t["name"], "partition_indexes": t["partition_indexes"]} for t in asked],
                        },
                        {"group_id": other, "topics": None},
                        {"group_id": "", "topics": None},
                    ],
                    "require_stable": True,
                }
                answer = conn.request(ApiKey.OffsetFetch, version, body)
                first, second, third = answer.groups
                assert (first.group_id, first.error_code) == (group, 0)
                assert [f[4] for f in _fetched(first.topics)] == [0, 0, unstable, 0, 0]
                assert [f[:4] for f in _fetched(first.topics)] == [w[:4] for w in want]
                assert (second.group_id, second.error_code, _fetched(second.topics)) == (other, 0, [(topic, 1, 1, "one", 0)])
                assert (third.error_code, third.topics) == (E.INVALID_GROUP_ID.kafka_code, [])
    finally:
        txn_service.end_txn(store, tid, ids.producer_id, ids.producer_epoch, "abort", 1)


def test_a_join_waiting_when_the_gateway_stops_is_answered_not_coordinator(start_gateway: Callable[..., GatewayProcess]) -> None:
    """SIGTERM: the group coordinator stops first, so a JoinGroup parked for a long join phase is
    answered (the client looks for the coordinator again) instead of waiting out the shutdown."""
    gateway = start_gateway(kafka_group_initial_rebalance_delay_ms="60000")
    with gateway.connect(timeout=30) as conn:
        sent = conn.send(
            ApiKey.JoinGroup,
            5,
            {
                "group_id": "g",
                "session_timeout_ms": 10_000,
                "rebalance_timeout_ms": 60_000,
                "member_id": "",
                "group_instance_id": "host-1",
                "protocol_type": "consumer",
                "protocols": [{"name": "range", "metadata": b""}],
            },
        )
        time.sleep(0.5)  # parked for the initial rebalance delay
        stopping = time.monotonic()
        assert gateway.stop() == 0
        frame = conn.read_frame()
        assert frame is not None, "the parked JoinGroup was not answered"
        correlation_id, answer = decode_response(ApiKey.JoinGroup, 5, frame)
    assert (correlation_id, answer.error_code) == (sent, E.NOT_COORDINATOR.kafka_code)
    assert time.monotonic() - stopping < 5


# -- a member in a subprocess (``python -m tests.kafka.test_groups``) ---------------------------------


def main(argv: list[str]) -> None:
    """Run one member until killed, writing its assignment to a file at each change."""
    client, bootstrap, group, topic, session_ms, report = argv

    def publish(m: Member) -> None:
        tmp = Path(report + ".tmp")
        tmp.write_text(json.dumps(sorted(m.assignment)))
        tmp.replace(report)

    member = Member(client, bootstrap, group, topic, session_ms=int(session_ms), on_change=publish)
    member.run()
    print("\n".join(member.errors), file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1:])


def test_a_committed_offset_keeps_its_leader_epoch(group_gateway: GatewayProcess, store: Broker) -> None:
    """OffsetFetch answers the leader epoch an offset was committed with (OffsetCommit v6+,
    TxnOffsetCommit v2+, through the transaction's commit), -1 for one committed without; a
    consumer checks its position against it (KIP-320). confluent-kafka's ``committed()`` reads it."""
    from confluent_kafka import Consumer, TopicPartition

    topic, group, tid = new_topic(store, 3), unique("g"), unique("tx")
    fetch = {"groups": [{"group_id": group, "topics": [{"name": topic, "partition_indexes": [0, 1, 2]}]}], "require_stable": True}
    with group_gateway.connect() as conn:
        plain = _commit_body(group, [(topic, 0, 4, "four")])
        plain["topics"][0]["partitions"][0]["committed_leader_epoch"] = 5
        assert _codes(conn.request(ApiKey.OffsetCommit, 8, plain)) == [(topic, 0, 0)]
        old = _commit_body(group, [(topic, 1, 2, "")])  # v5 has no leader epoch
        assert _codes(conn.request(ApiKey.OffsetCommit, 5, old)) == [(topic, 1, 0)]
        init = {"transactional_id": tid, "transaction_timeout_ms": 60_000, "producer_id": -1, "producer_epoch": -1}
        pid = conn.request(ApiKey.InitProducerId, 3, init)
        ids = {"transactional_id": tid, "producer_id": pid.producer_id, "producer_epoch": pid.producer_epoch}
        assert conn.request(ApiKey.AddOffsetsToTxn, 3, {**ids, "group_id": group}).error_code == 0
        partition = {"partition_index": 2, "committed_offset": 9, "committed_leader_epoch": 7, "committed_metadata": ""}
        body = {
            **ids,
            "group_id": group,
            "generation_id": -1,
            "member_id": "",
            "group_instance_id": None,
            "topics": [{"name": topic, "partitions": [partition]}],
        }
        assert _codes(conn.request(ApiKey.TxnOffsetCommit, 3, body)) == [(topic, 2, 0)]
        assert conn.request(ApiKey.EndTxn, 3, {**ids, "committed": True}).error_code == 0
        answer = conn.request(ApiKey.OffsetFetch, 8, fetch).groups[0]
        assert [
            (p.partition_index, p.committed_offset, p.committed_leader_epoch) for t in answer.topics for p in t.partitions
        ] == [(0, 4, 5), (1, 2, -1), (2, 9, 7)]
    consumer = Consumer({"bootstrap.servers": group_gateway.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, 1, 3, leader_epoch=2)], asynchronous=False)
        got = consumer.committed([TopicPartition(topic, p) for p in range(3)], 10)
        assert [(tp.offset, tp.leader_epoch) for tp in got] == [(4, 5), (3, 2), (9, 7)]
    finally:
        consumer.close()


def test_delete_groups(group_gateway: GatewayProcess, store: Broker) -> None:
    """DeleteGroups through confluent-kafka's and kafka-python's admin clients and raw frames: a
    group with members is NON_EMPTY_GROUP and keeps its offsets; once they left, it goes with its
    offsets, committed and pending in a transaction (whose commit then leaves the group alone); a
    group known only by its offsets goes too; an unknown one is GROUP_ID_NOT_FOUND; the id can be
    used again at once; ListGroups and OffsetFetch agree afterwards."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient
    from kafka.admin import KafkaAdminClient

    topic, group, simple, tid = new_topic(store), unique("g"), unique("simple"), unique("tx")
    write(store, topic, 3)
    members = [Member("confluent", group_gateway.bootstrap, group, topic, name=f"c{i}").start() for i in range(2)]
    admin = AdminClient({"bootstrap.servers": group_gateway.bootstrap})
    try:
        wait_settled(members)
        wait_for(members, lambda: committed(store, group, topic) == {p: 3 for p in range(PARTITIONS)}, "every offset committed")
        with pytest.raises(KafkaException, match="NON_EMPTY_GROUP"):
            admin.delete_consumer_groups([group], request_timeout=10)[group].result()
        assert committed(store, group, topic) == {p: 3 for p in range(PARTITIONS)}
    finally:
        for m in members:
            m.stop()
    ids = txn_service.init_producer_id(store, tid, 60_000)
    txn_service.txn_offset_commit(store, tid, ids.producer_id, ids.producer_epoch, group, [GroupOffset(topic, 0, 7, "")])
    admin.delete_consumer_groups([group], request_timeout=10)[group].result()
    assert committed(store, group, topic) == {p: None for p in range(PARTITIONS)}
    txn_service.end_txn(store, tid, ids.producer_id, ids.producer_epoch, "commit")
    assert committed(store, group, topic) == {p: None for p in range(PARTITIONS)}
    assert group not in groups_service.list_groups(store)

    groups_service.offset_commit(store, simple, [GroupOffset(topic, 1, 2, "")])
    never = unique("never")
    kp = KafkaAdminClient(bootstrap_servers=group_gateway.bootstrap)
    try:
        deleted = kp.delete_groups([simple, never])
    finally:
        kp.close()
    assert deleted == {simple: "OK", never: "GroupIdNotFoundError"}
    assert committed(store, simple, topic) == {p: None for p in range(PARTITIONS)}
    with group_gateway.connect() as conn:
        for version in (0, 2):
            answer = conn.request(ApiKey.DeleteGroups, version, {"groups_names": [simple, ""]})
            assert [(r.group_id, r.error_code) for r in answer.results] == [
                (simple, E.GROUP_ID_NOT_FOUND.kafka_code),
                ("", E.INVALID_GROUP_ID.kafka_code),
            ]
    groups_service.offset_commit(store, simple, [GroupOffset(topic, 1, 5, "")])  # the id again, at once
    assert committed(store, simple, topic) == {p: 5 if p == 1 else None for p in range(PARTITIONS)}


def test_offset_delete(group_gateway: GatewayProcess, store: Broker) -> None:
    """OffsetDelete through kafka-python's admin client and raw frames: while confluent-kafka
    members subscribe to a topic, its offsets stay (GROUP_SUBSCRIBED_TO_TOPIC) and another topic's
    go; once they left, every offset asked for goes, pending ones too; an unknown partition is
    UNKNOWN_TOPIC_OR_PARTITION; a group with neither members nor offsets GROUP_ID_NOT_FOUND."""
    from kafka.admin import KafkaAdminClient

    from kafka import TopicPartition as KTP

    topic, other, group, tid = new_topic(store), new_topic(store, 1), unique("g"), unique("tx")
    write(store, topic, 1)
    groups_service.offset_commit(store, group, [GroupOffset(other, 0, 1, "")])
    members = [Member("confluent", group_gateway.bootstrap, group, topic, name=f"c{i}").start() for i in range(2)]
    kp = KafkaAdminClient(bootstrap_servers=group_gateway.bootstrap)
    try:
        try:
            wait_settled(members)
            wait_for(
                members, lambda: committed(store, group, topic) == {p: 1 for p in range(PARTITIONS)}, "every offset committed"
            )
            got = kp.delete_group_offsets(group, [KTP(topic, 0), KTP(other, 0)])
            assert {tp.topic: e.__name__ for tp, e in got.items()} == {topic: "GroupSubscribedToTopicError", other: "NoError"}
            assert committed(store, group, topic)[0] == 1 and committed(store, group, other, 1) == {0: None}
        finally:
            for m in members:
                m.stop()
        ids = txn_service.init_producer_id(store, tid, 60_000)
        txn_service.txn_offset_commit(store, tid, ids.producer_id, ids.producer_epoch, group, [GroupOffset(topic, 1, 7, "")])
        got = kp.delete_group_offsets(group, [KTP(topic, 0), KTP(topic, 1), KTP(topic, 99)])
        assert {tp.partition: e.__name__ for tp, e in got.items()} == {
            0: "NoError",
            1: "NoError",
            99: "UnknownTopicOrPartitionError",
        }
        txn_service.end_txn(store, tid, ids.producer_id, ids.producer_epoch, "commit")
        assert committed(store, group, topic) == {p: (None if p < 2 else 1) for p in range(PARTITIONS)}
    finally:
        kp.close()
    with group_gateway.connect() as conn:
        body = {"group_id": unique("never"), "topics": [{"name": topic, "partitions": [{"partition_index": 0}]}]}
        answer = conn.request(ApiKey.OffsetDelete, 0, body)
        assert (answer.error_code, answer.topics) == (E.GROUP_ID_NOT_FOUND.kafka_code, [])
