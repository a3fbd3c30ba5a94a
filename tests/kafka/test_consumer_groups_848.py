"""Consumer groups of the next-generation protocol (KIP-848) against real ``txlog kafka`` gateways
on a real PostgreSQL, with confluent-kafka (librdkafka) consumers set to ``group.protocol:
consumer``: a group grows and shrinks (1 → 3 → 1 members) with every partition read by exactly one
member at a time and every record read; a member killed with SIGKILL is fenced at its session
timeout and its partitions move; a regex subscription picks up a topic created later; a gateway
killed under a running group costs the members no rejoin (their epochs and assignments are in
PostgreSQL, the next coordinator carries on); a classic group runs beside a consumer group, and
each protocol is refused a group of the other; a static member restarted within its session gets
its partitions back without the group epoch moving; ``group.remote.assignor: range`` assigns
ranges. Raw frames check the offset-commit fence, and the fencing of a member that does not revoke
within its rebalance timeout.

Members run in threads of their own; a member that must die without leaving is a subprocess of
this module (``python -m tests.kafka.test_consumer_groups_848``), killed with SIGKILL.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

from app.domain.records import NewRecord
from app.errors import ErrorCode as E
from app.services import Broker, topics
from app.services import produce as produce_service
from app.services.produce import ProduceRequest
from app.wire.kafka.messages import ApiKey
from tests.conftest import fresh_database, make_broker
from tests.kafka.conftest import GatewayProcess
from tests.support import ROOT, wait_until

SESSION_MS = 4_000  # group.consumer.session.timeout.ms of these gateways
HEARTBEAT_MS = 500
ENV = {
    "TXLOG_KAFKA_CONSUMER_GROUP_SESSION_TIMEOUT_MS": str(SESSION_MS),
    "TXLOG_KAFKA_CONSUMER_GROUP_HEARTBEAT_INTERVAL_MS": str(HEARTBEAT_MS),
    "TXLOG_KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "100",
    "TXLOG_KAFKA_NODE_LEASE_MS": "3000",
}


@pytest.fixture(scope="module")
def database(pg_admin_url: str, template_db: str) -> Iterator[str]:
    with fresh_database(pg_admin_url, template_db) as url:
        yield url


@pytest.fixture(scope="module")
def gateway(database: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    log = tmp_path_factory.mktemp("cg848") / "gateway.log"
    with GatewayProcess(database, env=ENV, log_path=log) as g:
        yield g


@pytest.fixture(scope="module")
def store(database: str) -> Iterator[Broker]:
    b = make_broker(database)
    yield b
    b.db.dispose()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def new_topic(store: Broker, partitions: int = 6, name: str | None = None) -> str:
    name = name or unique("cg")
    topics.create_topic(store, name, partitions)
    return name


def write(store: Broker, topic: str, per_partition: int, partitions: int = 6) -> None:
    for p in range(partitions):
        batch = [NewRecord(None, f"{p}-{i}".encode()) for i in range(per_partition)]
        produce_service.produce(store, topic, p, ProduceRequest(batch))


def config(bootstrap: str, group: str, **extra: Any) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "group.protocol": "consumer",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        **extra,
    }


class Member:
    """A KIP-848 consumer in a thread: polls, records what it reads, commits after each record
    (synchronously), and keeps the set of (topic, partition) librdkafka says it is assigned."""

    def __init__(self, bootstrap: str, group: str, subscription: list[str], **extra: Any) -> None:
        self.conf = config(bootstrap, group, **extra)
        self.subscription = subscription
        self.assignment: frozenset[tuple[str, int]] = frozenset()
        self.records: list[tuple[str, int, int]] = []
        self.errors: list[str] = []
        self.commit_errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "Member":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive()

    def _run(self) -> None:
        from confluent_kafka import Consumer, KafkaException

        consumer = Consumer(self.conf)
        try:
            consumer.subscribe(self.subscription)
            while not self._stop.is_set():
                message = consumer.poll(0.1)
                self.assignment = frozenset((tp.topic, tp.partition) for tp in consumer.assignment())
                if message is None:
                    continue
                if message.error():
                    if message.error().fatal():
                        self.errors.append(str(message.error()))
                    continue
                self.records.append((message.topic(), message.partition(), message.offset()))
                try:
                    consumer.commit(message, asynchronous=False)
                except KafkaException as exc:  # a commit refused during a reassignment: the next one carries it
                    self.commit_errors.append(str(exc))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            consumer.close()


def _exclusive(members: list[Member]) -> bool:
    seen: set[tuple[str, int]] = set()
    for m in members:
        if m.assignment & seen:
            return False
        seen |= m.assignment
    return True


def _covers(members: list[Member], topic: str, partitions: int = 6) -> bool:
    together: set[tuple[str, int]] = set()
    for m in members:
        together |= m.assignment
    return together == {(topic, p) for p in range(partitions)}


def _read_everything(members: list[Member], topic: str, per_partition: int, partitions: int = 6) -> bool:
    read = {(t, p, o) for m in members for t, p, o in m.records if t == topic}
    return read >= {(topic, p, o) for p in range(partitions) for o in range(per_partition)}


def _described(gateway: GatewayProcess, group: str) -> Any:
    with gateway.connect() as conn:
        return conn.request(ApiKey.ConsumerGroupDescribe, 1, {"group_ids": [group], "include_authorized_operations": False})


def test_a_group_grows_to_three_and_shrinks_to_one(gateway: GatewayProcess, store: Broker) -> None:
    topic, group = new_topic(store), unique("g")
    write(store, topic, 5)
    first = Member(gateway.bootstrap, group, [topic]).start()
    members = [first]
    try:
        wait_until(lambda: _covers([first], topic) and _read_everything([first], topic, 5), message="one member reads it all")
        members += [Member(gateway.bootstrap, group, [topic]).start() for _ in range(2)]
        wait_until(
            lambda: all(len(m.assignment) == 2 for m in members) and _covers(members, topic), message="three members, two each"
        )
        assert _exclusive(members)
        described = _described(gateway, group).groups[0]
        assert (described.error_code, described.group_state, described.assignor_name) == (0, "Stable", "uniform")
        assert len(described.members) == 3 and all(m.member_epoch == described.assignment_epoch for m in described.members)
        write(store, topic, 5)
        wait_until(lambda: _read_everything(members, topic, 10), message="the second batch read")
        for m in members[1:]:
            m.stop()
        wait_until(lambda: _covers([first], topic), message="the last member has every partition again")
        assert not any(m.errors for m in members), [m.errors for m in members]
        with gateway.connect() as conn:
            listed = conn.request(ApiKey.ListGroups, 5, {"states_filter": [], "types_filter": ["consumer"]})
            assert any(g.group_id == group and g.group_type == "consumer" for g in listed.groups)
            old = conn.request(ApiKey.DescribeGroups, 6, {"groups": [group], "include_authorized_operations": False})
            assert old.groups[0].error_code == E.GROUP_ID_NOT_FOUND.kafka_code
    finally:
        for m in members:
            if m._thread.is_alive():
                m.stop()


def test_a_killed_member_is_fenced_at_its_session_timeout(gateway: GatewayProcess, store: Broker, tmp_path: Path) -> None:
    topic, group = new_topic(store), unique("g")
    report = tmp_path / "victim.json"
    victim = subprocess.Popen(
        [sys.executable, "-m", "tests.kafka.test_consumer_groups_848", gateway.bootstrap, group, topic, str(report)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        start_new_session=True,
    )
    survivor = None
    try:
        wait_until(lambda: report.exists() and len(json.loads(report.read_text())) == 6, message="the victim has every partition")
        survivor = Member(gateway.bootstrap, group, [topic]).start()
        wait_until(lambda: len(survivor.assignment) == 3, message="the partitions split")
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait(10)
        wait_until(lambda: _covers([survivor], topic), timeout=SESSION_MS / 1000 + 20, message="the survivor takes them all")
        described = _described(gateway, group).groups[0]
        assert len(described.members) == 1
    finally:
        if victim.poll() is None:
            os.killpg(victim.pid, signal.SIGKILL)
            victim.wait(10)
        if survivor is not None:
            survivor.stop()


def test_a_regex_subscription_picks_up_a_topic_created_later(gateway: GatewayProcess, store: Broker) -> None:
    prefix = unique("rx")
    first = new_topic(store, 2, name=f"{prefix}-a")
    member = Member(gateway.bootstrap, unique("g"), [f"^{prefix}-.*"], **{"topic.metadata.refresh.interval.ms": 1000}).start()
    try:
        wait_until(lambda: member.assignment == {(first, 0), (first, 1)}, message="the first topic assigned")
        later = new_topic(store, 2, name=f"{prefix}-b")
        write(store, later, 3, partitions=2)
        wait_until(lambda: {(later, 0), (later, 1)} <= member.assignment, message="the later topic assigned")
        wait_until(lambda: _read_everything([member], later, 3, partitions=2), message="the later topic read")
        assert not member.errors
    finally:
        member.stop()


# A gateway's death is seen once its node lease runs out; the members' sessions must outlast that
# and the clients' search for the next coordinator, as the defaults do (a 10 s lease, 45 s
# sessions) — here a 2 s lease and 15 s sessions.
FAILOVER_ENV = {**ENV, "TXLOG_KAFKA_CONSUMER_GROUP_SESSION_TIMEOUT_MS": "15000", "TXLOG_KAFKA_NODE_LEASE_MS": "2000"}


def test_a_gateway_killed_under_a_running_group(pg_admin_url: str, template_db: str, tmp_path: Path) -> None:
    """Two gateways; the one coordinating the group is killed: the members find the other, which
    carries on with their epochs (no member goes back to epoch 0, no reassignment). A database of
    its own, so that the two are the whole cluster."""
    with fresh_database(pg_admin_url, template_db) as database:
        own = make_broker(database)
        try:
            _gateway_killed_under_a_running_group(database, own, tmp_path)
        finally:
            own.db.dispose()


def _gateway_killed_under_a_running_group(database: str, store: Broker, tmp_path: Path) -> None:
    topic, group = new_topic(store), unique("g")
    write(store, topic, 3)
    gateways = [GatewayProcess(database, env=FAILOVER_ENV, node_id=n, log_path=tmp_path / f"gw{n}.log").start() for n in (11, 12)]
    members: list[Member] = []
    try:
        bootstrap = ",".join(g.bootstrap for g in gateways)
        members = [Member(bootstrap, group, [topic]).start() for _ in range(2)]
        wait_until(lambda: all(len(m.assignment) == 3 for m in members) and _covers(members, topic), message="two members")
        with gateways[0].connect() as conn:
            found = conn.request(ApiKey.FindCoordinator, 3, {"key": group, "key_type": 0})
        victim = next(g for g in gateways if g.port == found.port)
        other = next(g for g in gateways if g is not victim)
        before = {(m.member_id, m.member_epoch) for m in _described(victim, group).groups[0].members}
        assert len(before) == 2
        assignments = [m.assignment for m in members]
        victim.stop(signal.SIGKILL)
        write(store, topic, 3)
        wait_until(lambda: _read_everything(members, topic, 6), timeout=60, message="the group reads on")
        after = {(m.member_id, m.member_epoch) for m in _described(other, group).groups[0].members}
        assert after == before  # the same members at the same epochs: nobody rejoined
        assert [m.assignment for m in members] == assignments
        assert not any(m.errors for m in members)
    finally:
        for m in members:
            m.stop()
        for g in gateways:
            g.stop()


def test_classic_and_consumer_groups_side_by_side(gateway: GatewayProcess, store: Broker) -> None:
    topic, classic_group, consumer_group = new_topic(store), unique("classic"), unique("consumer")
    write(store, topic, 4)
    classic = Member(gateway.bootstrap, classic_group, [topic], **{"group.protocol": "classic", "session.timeout.ms": 6000})
    modern = Member(gateway.bootstrap, consumer_group, [topic])
    members = [classic.start(), modern.start()]
    try:
        wait_until(lambda: all(_read_everything([m], topic, 4) for m in members), message="both groups read everything")
        with gateway.connect() as conn:
            join = {
                "group_id": consumer_group,
                "session_timeout_ms": 6000,
                "rebalance_timeout_ms": 6000,
                "member_id": "",
                "protocol_type": "consumer",
                "protocols": [{"name": "range", "metadata": b""}],
            }
            assert conn.request(ApiKey.JoinGroup, 5, join).error_code == E.INCONSISTENT_GROUP_PROTOCOL.kafka_code
            beat = {
                "group_id": classic_group,
                "member_id": str(uuid.uuid4()),
                "member_epoch": 0,
                "rebalance_timeout_ms": 5000,
                "subscribed_topic_names": [topic],
                "topic_partitions": [],
            }
            assert conn.request(ApiKey.ConsumerGroupHeartbeat, 1, beat).error_code == E.GROUP_ID_NOT_FOUND.kafka_code
            listed = {
                g.group_id: g.group_type
                for g in conn.request(ApiKey.ListGroups, 5, {"states_filter": [], "types_filter": []}).groups
            }
            assert (listed[classic_group], listed[consumer_group]) == ("classic", "consumer")
        assert not any(m.errors for m in members)
    finally:
        for m in members:
            m.stop()


def test_offset_commits_fenced_by_member_epoch(gateway: GatewayProcess, store: Broker) -> None:
    topic, group = new_topic(store, 2), unique("g")
    member_id = str(uuid.uuid4())
    with gateway.connect() as conn:
        beat = {
            "group_id": group,
            "member_id": member_id,
            "member_epoch": 0,
            "rebalance_timeout_ms": 5000,
            "subscribed_topic_names": [topic],
            "topic_partitions": [],
        }
        joined = conn.request(ApiKey.ConsumerGroupHeartbeat, 1, beat)
        assert (joined.error_code, joined.member_epoch) == (0, 1)

        def commit(version: int, member: str, epoch: int) -> int:
            body = {
                "group_id": group,
                "generation_id_or_member_epoch": epoch,
                "member_id": member,
                "group_instance_id": None,
                "retention_time_ms": -1,
                "topics": [
                    {"name": topic, "partitions": [{"partition_index": 0, "committed_offset": 1, "committed_metadata": ""}]}
                ],
            }
            return int(conn.request(ApiKey.OffsetCommit, version, body).topics[0].partitions[0].error_code)

        assert commit(9, member_id, 1) == 0
        assert commit(9, member_id, 2) == E.STALE_MEMBER_EPOCH.kafka_code
        assert commit(9, "nobody", 1) == E.UNKNOWN_MEMBER_ID.kafka_code
        assert commit(8, member_id, 1) == E.UNSUPPORTED_VERSION.kafka_code
        stale = conn.request(ApiKey.ConsumerGroupHeartbeat, 1, {**beat, "member_epoch": 5, "topic_partitions": None})
        assert stale.error_code == E.FENCED_MEMBER_EPOCH.kafka_code
        bad = conn.request(
            ApiKey.ConsumerGroupHeartbeat,
            1,
            {**beat, "member_id": str(uuid.uuid4()), "subscribed_topic_names": None, "subscribed_topic_regex": r"\p{L}+"},
        )
        assert bad.error_code == E.INVALID_REGULAR_EXPRESSION.kafka_code
        left = conn.request(ApiKey.ConsumerGroupHeartbeat, 1, {**beat, "member_epoch": -1})
        assert (left.error_code, left.member_epoch) == (0, -1)
        assert commit(9, "", -1) == 0  # an empty group takes a simple consumer's commit


def _epochs(gateway: GatewayProcess, group: str) -> tuple[int, dict[str, tuple[str | None, int]]]:
    """The group epoch, and each member's (instance id, member epoch) by member id."""
    [described] = _described(gateway, group).groups
    return described.group_epoch, {m.member_id: (m.instance_id, m.member_epoch) for m in described.members}


def test_a_static_member_restarting_within_its_session_gets_its_partitions_back(gateway: GatewayProcess, store: Broker) -> None:
    """A static member (``group.instance.id``) that closes leaves for a while (epoch -2), keeping
    its assignment; restarted within the session timeout, it takes its place back with the same
    partitions, and the group epoch does not move: the other member is not disturbed."""
    topic, group = new_topic(store), unique("g")
    write(store, topic, 2)
    static = Member(gateway.bootstrap, group, [topic], **{"group.instance.id": "instance-a"}).start()
    other = Member(gateway.bootstrap, group, [topic]).start()
    members = [static, other]
    try:
        wait_until(lambda: all(len(m.assignment) == 3 for m in members) and _covers(members, topic), message="two members")
        wait_until(lambda: _epochs(gateway, group)[0] == max(e for _, e in _epochs(gateway, group)[1].values()))
        group_epoch, before = _epochs(gateway, group)
        others = {k: v for k, v in before.items() if v[0] is None}
        kept, kept_other = static.assignment, other.assignment
        static.stop()
        wait_until(lambda: any(e == -2 for _, e in _epochs(gateway, group)[1].values()), message="the static member away")
        assert other.assignment == kept_other
        again = Member(gateway.bootstrap, group, [topic], **{"group.instance.id": "instance-a"}).start()
        members = [again, other]
        wait_until(lambda: again.assignment == kept, message="its partitions back")
        epoch_after, after = _epochs(gateway, group)
        assert epoch_after == group_epoch
        assert {k: v for k, v in after.items() if v[0] is None} == others  # the other member's epoch unchanged
        assert [v for v in after.values() if v[0] == "instance-a"] == [v for v in before.values() if v[0] == "instance-a"]
        assert other.assignment == kept_other and _exclusive(members)
        assert not any(m.errors for m in members)
    finally:
        for m in members:
            m.stop()


def test_the_range_server_assignor_gives_ranges_of_each_topic(gateway: GatewayProcess, store: Broker) -> None:
    """``group.remote.assignor: range``: each topic's partitions in contiguous ranges, members with
    the same subscription getting the same partition numbers of co-partitioned topics."""
    first, second, group = new_topic(store, 4), new_topic(store, 4), unique("g")
    members = [Member(gateway.bootstrap, group, [first, second], **{"group.remote.assignor": "range"}).start() for _ in range(2)]
    try:
        wait_until(lambda: all(len(m.assignment) == 4 for m in members), timeout=60, message="two members")
        [described] = _described(gateway, group).groups
        assert described.assignor_name == "range"
        by_member = {
            m.member_id: {(t.topic_name, p) for t in m.assignment.topic_partitions for p in t.partitions}
            for m in described.members
        }
        low, high = sorted(by_member)
        assert by_member[low] == {(t, p) for t in (first, second) for p in (0, 1)}
        assert by_member[high] == {(t, p) for t in (first, second) for p in (2, 3)}
        assert {m.assignment for m in members} == {frozenset(a) for a in by_member.values()}
    finally:
        for m in members:
            m.stop()


def test_a_member_that_does_not_revoke_within_its_rebalance_timeout_is_fenced(gateway: GatewayProcess, store: Broker) -> None:
    """Over raw frames, as librdkafka cannot be made to hold a revocation: a member asked to give a
    partition up that keeps heartbeating with it owned is fenced at its rebalance timeout
    (FENCED_MEMBER_EPOCH, or UNKNOWN_MEMBER_ID once the sweeper removed it), and the partitions
    move to the other member."""
    topic, group = new_topic(store, 2), unique("g")
    slow, quick = str(uuid.uuid4()), str(uuid.uuid4())

    def beat(conn: Any, member: str, epoch: int, owned: list[dict] | None, **join: Any) -> Any:
        body = {
            "group_id": group,
            "member_id": member,
            "member_epoch": epoch,
            "rebalance_timeout_ms": join.get("rebalance_timeout_ms", -1),
            "subscribed_topic_names": join.get("subscribed_topic_names"),
            "topic_partitions": owned,
        }
        return conn.request(ApiKey.ConsumerGroupHeartbeat, 1, body)

    def owned(answer: Any) -> list[dict]:
        return [{"topic_id": t.topic_id, "partitions": list(t.partitions)} for t in answer.assignment.topic_partitions]

    with gateway.connect() as conn:
        joined = beat(conn, slow, 0, [], rebalance_timeout_ms=1000, subscribed_topic_names=[topic])
        assert joined.error_code == 0 and sum(len(t.partitions) for t in joined.assignment.topic_partitions) == 2
        holding = owned(joined)
        other = beat(conn, quick, 0, [], rebalance_timeout_ms=30_000, subscribed_topic_names=[topic])
        assert other.error_code == 0
        asked = beat(conn, slow, joined.member_epoch, holding)
        assert asked.error_code == 0 and asked.member_epoch == joined.member_epoch  # still revoking: its epoch kept
        assert sum(len(t.partitions) for t in asked.assignment.topic_partitions) == 1

        def fenced() -> Any:
            answer = beat(conn, slow, joined.member_epoch, holding)  # still owning what it was asked to give up
            return answer if answer.error_code != 0 else None

        answer = wait_until(fenced, timeout=15, interval=0.2, message="the member fenced")
        assert answer.error_code in (E.FENCED_MEMBER_EPOCH.kafka_code, E.UNKNOWN_MEMBER_ID.kafka_code)

        def quick_owns_both() -> bool:
            answer = beat(conn, quick, other_epoch[0], other_owned[0])
            assert answer.error_code == 0
            other_epoch[0] = answer.member_epoch
            if answer.assignment is not None:
                other_owned[0] = owned(answer)
            return sum(len(t["partitions"]) for t in other_owned[0]) == 2

        other_epoch, other_owned = [other.member_epoch], [owned(other) if other.assignment is not None else []]
        wait_until(quick_owns_both, timeout=15, interval=0.2, message="the other member owning both partitions")
        [described] = _described(gateway, group).groups
        assert [m.member_id for m in described.members] == [quick]


def main(argv: list[str]) -> None:
    """One member until killed, writing its assignment to a file at each change."""
    from confluent_kafka import Consumer

    bootstrap, group, topic, report = argv
    consumer = Consumer(config(bootstrap, group))
    consumer.subscribe([topic])
    last: list[int] | None = None
    while True:
        consumer.poll(0.1)
        now = sorted(tp.partition for tp in consumer.assignment())
        if now != last:
            tmp = Path(report + ".tmp")
            tmp.write_text(json.dumps(now))
            tmp.replace(report)
            last = now


if __name__ == "__main__":
    main(sys.argv[1:])
