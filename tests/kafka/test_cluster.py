"""Several gateway processes as the brokers of one cluster, on one database.

First the registry-backed cluster view in process (two nodes on a real PostgreSQL, their leases
short); then three real ``txlog kafka`` processes, node ids 0, 1 and 2: Metadata and
FindCoordinator agree from every gateway and spread the work, librdkafka bootstrapped at one
gateway produces to the leaders of all partitions, a consumer group works when another gateway
coordinates it, a duplicate node id refuses to start, and a gateway killed with SIGKILL drops out
once its lease lapses while clients carry on.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Iterator

import pytest
from sqlalchemy import text

from api.kafka.cluster import NodeIdInUse, RegistryCluster
from api.kafka.handlers import Node
from app.domain.cluster import coordinator_of, leader_of
from app.errors import DatabaseUnavailable, ErrorCode
from app.services import cluster as registry
from app.wire.kafka.messages import ApiKey
from tests.conftest import fresh_database, make_broker
from tests.kafka.conftest import GatewayProcess
from tests.support import wait_until

LEASE_MS = 1500
NODE_IDS = [0, 1, 2]
PARTITIONS = 12
GROUP, TRANSACTION = 0, 1


# -- the cluster view, in process --------------------------------------------------------------------


def test_two_nodes_see_each_other_and_split_the_groups(db_url: str) -> None:
    broker = make_broker(db_url, kafka_node_lease_ms=60_000)  # renewals do not run within the test

    async def scenario() -> None:
        a = RegistryCluster(broker, Node(0, "a.example", 9092))
        b = RegistryCluster(broker, Node(1, "b.example", 9093))
        seen: list[list[int]] = []
        a.on_change(lambda nodes: seen.append([n.node_id for n in nodes]))
        await a.start()
        assert [n.node_id for n in a.list_nodes()] == [0] and all(a.owns(f"g{i}") for i in range(20))
        await b.start()
        assert b.list_nodes() == [Node(0, "a.example", 9092), Node(1, "b.example", 9093)]
        assert a.cluster_id and a.cluster_id == b.cluster_id
        await a.beat()  # the next beat shows the new node
        assert a.list_nodes() == b.list_nodes() and seen == [[0, 1]]
        keys = [f"group-{i}" for i in range(40)]
        for key in keys:  # one owner each, the one the rule names, the same from both
            assert a.owns(key) != b.owns(key)
            assert a.coordinator_of(key) == b.coordinator_of(key) == a.list_nodes()[coordinator_of(key, [0, 1])]
        assert {a.coordinator_of(key).node_id for key in keys} == {0, 1}
        assert [a.leader_of("t", p).node_id for p in range(4)] == [leader_of("t", p, [0, 1]) for p in range(4)]
        await a.beat()
        assert seen == [[0, 1]]  # no change, no call
        await b.stop()  # gives its id up at once
        await a.beat()
        assert seen == [[0, 1], [0]] and all(a.owns(key) for key in keys)
        await a.stop()

    try:
        asyncio.run(scenario())
        assert_no_nodes(broker)
    finally:
        broker.db.dispose()


def test_a_node_back_from_a_database_outage_keeps_the_others_for_one_lease(db_url: str) -> None:
    """While the database is away no gateway can renew; the first one back must not drop the
    others, whose leases lapsed meanwhile, before they had a lease to renew."""
    broker = make_broker(db_url, kafka_node_lease_ms=1500)
    away = make_broker("postgresql://txlog@127.0.0.1:1/txlog")  # nothing listens on port 1

    async def scenario() -> None:
        a = RegistryCluster(broker, Node(0, "a.example", 9092))
        await a.start()
        # another gateway, which renews no more (it is cut off from the database too, say)
        other = await asyncio.to_thread(registry.register_node, broker, 1, "b.example", 9093, 1500)
        await a.beat()
        assert [n.node_id for n in a.list_nodes()] == [0, 1]
        a.broker = away
        with pytest.raises(DatabaseUnavailable):
            await a.beat()
        await asyncio.sleep(1.7)  # both leases lapse
        a.broker = broker
        await a.beat()  # back: renewed, node 1 lapsed in the registry and still in the view
        assert [n.node_id for n in a.list_nodes()] == [0, 1]
        assert [n for n, *_ in await asyncio.to_thread(registry.live_nodes, broker)] == [0]
        await asyncio.sleep(1.7)  # node 1 had a lease to come back, and did not
        await a.beat()
        assert [n.node_id for n in a.list_nodes()] == [0]
        await asyncio.to_thread(registry.deregister_node, broker, other)
        await a.stop()

    try:
        asyncio.run(scenario())
        assert_no_nodes(broker)
    finally:
        broker.db.dispose()
        away.db.dispose()


def test_a_node_id_held_elsewhere_is_refused_and_a_taken_one_is_lost(db_url: str) -> None:
    broker = make_broker(db_url, kafka_node_lease_ms=900)  # renewed every 300 ms: a loaded machine keeps it

    async def scenario() -> None:
        lost = asyncio.Event()
        a = RegistryCluster(broker, Node(5, "a.example", 9092), on_lost=lost.set)
        await a.start()
        began = time.monotonic()
        with pytest.raises(NodeIdInUse, match=r"Node id 5 is held by another live gateway process \(a.example:9092\)"):
            await RegistryCluster(broker, Node(5, "intruder.example", 9999)).start()
        assert 1.2 <= time.monotonic() - began < 4  # refused once a lease and a third passed: a renews
        assert not lost.is_set()
        with broker.db.transaction() as conn:  # another process takes the id (a missed its renewals)
            conn.execute(
                text(
                    "UPDATE txlog.kafka_nodes SET process_token = 'other', host = 'other.example', "
                    "expires_at = clock_timestamp() + interval '1 minute' WHERE node_id = 5"
                )
            )
        await asyncio.wait_for(lost.wait(), 2)
        assert a.lost is not None and "other.example" in a.lost
        await a.stop()  # leaves the other holder's entry alone

    try:
        asyncio.run(scenario())
        with broker.db.read() as conn:
            assert conn.execute(text("SELECT host FROM txlog.kafka_nodes")).scalars().all() == ["other.example"]
    finally:
        broker.db.dispose()


def test_a_restart_after_a_crash_takes_its_node_id_back_once_the_lease_lapses(db_url: str) -> None:
    broker = make_broker(db_url, kafka_node_lease_ms=600)

    async def scenario() -> None:
        # a process that registered and died: it never renews nor gives its id up
        await asyncio.to_thread(registry.register_node, broker, 3, "127.0.0.1", 9092, 600)
        began = time.monotonic()
        again = RegistryCluster(broker, Node(3, "127.0.0.1", 9092))
        await again.start()
        assert time.monotonic() - began < 0.6 + 0.2 + 2  # the lease and a retry, with room for a loaded machine
        assert again.list_nodes() == [Node(3, "127.0.0.1", 9092)]
        await again.stop()

    try:
        asyncio.run(scenario())
        assert_no_nodes(broker)
    finally:
        broker.db.dispose()


def assert_no_nodes(broker: Any) -> None:
    with broker.db.read() as conn:
        assert conn.execute(text("SELECT count(*) FROM txlog.kafka_nodes")).scalar() == 0


# -- three gateway processes ---------------------------------------------------------------------------


SETTINGS = {"TXLOG_KAFKA_NODE_LEASE_MS": str(LEASE_MS), "TXLOG_KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0"}


@pytest.fixture(scope="module")
def cluster_db(pg_admin_url: str, template_db: str) -> Iterator[str]:
    with fresh_database(pg_admin_url, template_db) as url:
        yield url


@pytest.fixture(scope="module")
def trio(cluster_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[GatewayProcess]]:
    """Gateways with node ids 0, 1 and 2 on one database, once each lists all three."""
    logs = tmp_path_factory.mktemp("cluster")
    gateways = [GatewayProcess(cluster_db, env=SETTINGS, log_path=logs / f"node-{n}.log", node_id=n) for n in NODE_IDS]
    try:
        for g in gateways:
            g.start()
        wait_for_brokers(gateways, NODE_IDS)
        yield gateways
    finally:
        for g in gateways:
            g.stop()


def metadata(g: GatewayProcess, version: int = 12, topics: list[str] | None = None) -> Any:
    body: dict[str, Any] = {"topics": None if topics is None else [{"name": t} for t in topics]}
    if version >= 4:
        body["allow_auto_topic_creation"] = False
    with g.connect() as conn:
        return conn.request(ApiKey.Metadata, version, body)


def broker_ids(g: GatewayProcess) -> list[int]:
    return [b.node_id for b in metadata(g, topics=[]).brokers]


def wait_for_brokers(gateways: list[GatewayProcess], ids: list[int], timeout: float = 15) -> float:
    """Wait until every gateway lists exactly ``ids``; the seconds it took."""
    began = time.monotonic()
    wait_until(lambda: all(broker_ids(g) == ids for g in gateways), timeout, 0.1, f"every gateway to list nodes {ids}")
    return time.monotonic() - began


def create_topic(g: GatewayProcess, name: str, partitions: int = PARTITIONS) -> None:
    with g.connect() as conn:
        created = conn.request(
            ApiKey.CreateTopics, 7, {"topics": [{"name": name, "num_partitions": partitions, "replication_factor": 1}]}
        ).topics[0]
    assert created.error_code == 0, created


def find_coordinators(g: GatewayProcess, keys: list[str], key_type: int = GROUP) -> list[tuple[int, str, int]]:
    """(node id, host, port) of each key's coordinator, asked one key at a time (v3) and batched (v4)."""
    with g.connect() as conn:
        single = []
        for key in keys:
            got = conn.request(ApiKey.FindCoordinator, 3, {"key": key, "key_type": key_type})
            assert got.error_code == 0, got
            single.append((got.node_id, got.host, got.port))
        batched = conn.request(ApiKey.FindCoordinator, 4, {"key_type": key_type, "coordinator_keys": keys}).coordinators
    assert [c.key for c in batched] == keys and all(c.error_code == 0 for c in batched)
    assert [(c.node_id, c.host, c.port) for c in batched] == single
    return single


def test_every_gateway_lists_the_same_brokers_and_spreads_the_leaders(trio: list[GatewayProcess]) -> None:
    create_topic(trio[0], "spread")
    expected_brokers = [(g.node_id, "127.0.0.1", g.port) for g in trio]
    answers = []
    for g in trio:
        for version in (0, 1, 4, 9, 12):
            got = metadata(g, version, ["spread"])
            assert [(b.node_id, b.host, b.port) for b in got.brokers] == expected_brokers, (g.node_id, version)
            if version >= 1:
                assert got.controller_id == 0
            if version >= 2:
                assert got.cluster_id == metadata(trio[0]).cluster_id
            (topic,) = got.topics
            assert topic.error_code == 0
            answers.append([(p.partition_index, p.leader_id, list(p.replica_nodes), list(p.isr_nodes)) for p in topic.partitions])
    assert all(a == answers[0] for a in answers)  # the same leaders from every gateway, at every version
    leaders = [leader for _, leader, _, _ in answers[0]]
    assert leaders == [leader_of("spread", p, NODE_IDS) for p in range(PARTITIONS)]
    assert Counter(leaders) == {0: 4, 1: 4, 2: 4}
    assert all(replicas == isr == [leader] for _, leader, replicas, isr in answers[0])


def test_each_gateway_describes_the_log_dirs_of_the_partitions_it_leads(trio: list[GatewayProcess]) -> None:
    """DescribeLogDirs from every gateway names the replicas Metadata gives it (one per partition,
    its leader), so kafka-python's admin client, asking every broker, sees each partition once."""
    from kafka.admin import KafkaAdminClient

    create_topic(trio[0], "dirs", 6)
    (topic,) = metadata(trio[0], topics=["dirs"]).topics
    leaders = {p.partition_index: p.leader_id for p in topic.partitions}
    for g in trio:
        with g.connect() as conn:
            (d,) = conn.request(ApiKey.DescribeLogDirs, 4, {"topics": [{"topic": "dirs", "partitions": list(range(6))}]}).results
        held = sorted(p.partition_index for t in d.topics for p in t.partitions)
        assert (d.error_code, d.log_dir) == (0, "/txlog")
        assert held == [p for p, leader in leaders.items() if leader == g.node_id], g.node_id
    admin = KafkaAdminClient(bootstrap_servers=trio[1].bootstrap)
    try:
        answers = admin.describe_log_dirs({"dirs": list(range(6))})
    finally:
        admin.close()
    by_partition = Counter(
        p["partition_index"] for a in answers for d in a["log_dirs"] for t in d["topics"] for p in t["partitions"]
    )
    assert sorted(a["broker"] for a in answers) == NODE_IDS and by_partition == Counter(range(6))


def test_describe_cluster_names_what_metadata_names(trio: list[GatewayProcess]) -> None:
    """DescribeCluster, over raw frames from every gateway (v0-2; the controllers' endpoints
    refused as a broker refuses them) and through confluent-kafka's and kafka-python's admin
    clients: the cluster id, the controller and the brokers of Metadata."""
    from confluent_kafka.admin import AdminClient
    from kafka.admin import KafkaAdminClient

    cluster_id = metadata(trio[0]).cluster_id
    for g, version in zip(trio, (0, 1, 2)):
        with g.connect() as conn:
            got = conn.request(
                ApiKey.DescribeCluster, version, {"include_cluster_authorized_operations": True, "endpoint_type": 1}
            )
            controllers = conn.request(ApiKey.DescribeCluster, 2, {"endpoint_type": 2})
        assert (got.error_code, got.cluster_id, got.controller_id) == (0, cluster_id, 0)
        assert [(b.broker_id, b.host, b.port, b.rack) for b in got.brokers] == [
            (n.node_id, "127.0.0.1", n.port, None) for n in trio
        ]
        assert got.authorized_operations is None  # the codec's reading of INT32_MIN: not provided
        assert (controllers.error_code, controllers.brokers) == (ErrorCode.MISMATCHED_ENDPOINT_TYPE.kafka_code, [])
    kp = KafkaAdminClient(bootstrap_servers=trio[2].bootstrap)
    try:
        cluster = kp.describe_cluster()
    finally:
        kp.close()
    assert (cluster["cluster_id"], cluster["controller_id"]) == (cluster_id, 0)
    assert [(b["broker_id"], b["port"]) for b in cluster["brokers"]] == [(g.node_id, g.port) for g in trio]
    admin = AdminClient({"bootstrap.servers": trio[1].bootstrap})
    described = admin.describe_cluster(request_timeout=10).result(15)
    assert described.cluster_id == cluster_id and described.controller.id == 0
    assert sorted((n.id, n.port) for n in described.nodes) == [(g.node_id, g.port) for g in trio]


def test_group_coordinators_spread_and_every_gateway_names_the_same(trio: list[GatewayProcess]) -> None:
    keys = [f"group-{i}" for i in range(60)]
    by_gateway = [find_coordinators(g, keys) for g in trio]
    assert by_gateway[0] == by_gateway[1] == by_gateway[2]
    ports = {g.node_id: g.port for g in trio}
    assert by_gateway[0] == [(n, "127.0.0.1", ports[n]) for n in (coordinator_of(k, NODE_IDS) for k in keys)]
    assert all(count >= 10 for count in Counter(n for n, _, _ in by_gateway[0]).values())
    assert set(n for n, _, _ in by_gateway[0]) == set(NODE_IDS)
    # transactions: the gateway asked coordinates them (their state is in PostgreSQL)
    for g in trio:
        assert find_coordinators(g, ["txn-a", "txn-b"], TRANSACTION) == [(g.node_id, "127.0.0.1", g.port)] * 2


def test_an_idempotent_producer_bootstrapped_at_one_gateway_produces_to_every_leader(trio: list[GatewayProcess]) -> None:
    create_topic(trio[0], "fanout")
    produce_requests: dict[int, int] = {}

    def stats(raw: str) -> None:
        for b in json.loads(raw)["brokers"].values():
            if b["nodeid"] >= 0:
                produce_requests[b["nodeid"]] = max(produce_requests.get(b["nodeid"], 0), b["req"].get("Produce", 0))

    sent = produce(
        trio[0].bootstrap, "fanout", range(PARTITIONS), per_partition=10, stats_cb=stats, **{"statistics.interval.ms": 100}
    )
    assert sorted(produce_requests) == NODE_IDS and all(produce_requests[n] > 0 for n in NODE_IDS), produce_requests
    assert consume(trio[2].bootstrap, "fanout", range(PARTITIONS), sum(map(len, sent.values()))) == sent


def test_a_consumer_group_coordinated_by_node_2(trio: list[GatewayProcess]) -> None:
    group = next(f"orders-{i}" for i in range(100) if coordinator_of(f"orders-{i}", NODE_IDS) == 2)
    create_topic(trio[0], "grouped")
    with GroupConsumers(trio[0].bootstrap, "grouped", group, members=3) as members:
        wait_until(lambda: all(members.assignments()), 30, 0.2, "each of the three members to be given partitions")
        assert sorted(p for a in members.assignments() for p in a) == list(range(PARTITIONS))
        sent = produce(trio[0].bootstrap, "grouped", range(PARTITIONS), per_partition=5)
        assert members.read(PARTITIONS * 5) == sent
        state, described = describe_group(trio[2], group)
        assert (state, len(described)) == ("Stable", 3)
        for g in (trio[0], trio[1]):  # the others do not coordinate it
            assert describe_group(g, group) == ("NOT_COORDINATOR", [])


def test_a_duplicate_node_id_refuses_to_start(trio: list[GatewayProcess], tmp_path: Path) -> None:
    intruder = GatewayProcess(trio[0].database_url, env=SETTINGS, log_path=tmp_path / "intruder.log", node_id=1)
    with pytest.raises(AssertionError, match="exited with 1"):
        intruder.start()  # after a lease and a third, in which node 1 renewed
    assert f"Node id 1 is held by another live gateway process (127.0.0.1:{trio[1].port})" in intruder.log()
    assert not intruder.alive()
    with socket.socket() as s:  # it never listened
        assert s.connect_ex(("127.0.0.1", intruder.port)) != 0
    assert all(broker_ids(g) == NODE_IDS for g in trio)  # the holder keeps its id and its place
    assert [(b.node_id, b.port) for b in metadata(trio[1], topics=[]).brokers][1] == (1, trio[1].port)


def test_a_killed_gateway_drops_out_and_clients_carry_on(trio: list[GatewayProcess]) -> None:
    """SIGKILL node 1: within the lease and a third the others stop listing it, its partitions and
    groups move to the two left, an idempotent producer that was sending to it delivers every record
    exactly once, and a group member it coordinated joins the new coordinator and reads on. Node 1
    then starts again and the group moves back to it."""
    create_topic(trio[0], "failover")
    moved_group = next(f"moved-{i}" for i in range(100) if coordinator_of(f"moved-{i}", NODE_IDS) == 1)
    stand_in = trio[coordinator_of(moved_group, [0, 2])]
    survivors = [trio[0], trio[2]]
    first = produce(trio[0].bootstrap, "failover", range(PARTITIONS), per_partition=10)
    with GroupConsumers(trio[0].bootstrap, "failover", moved_group, members=1) as member:
        assert member.read(PARTITIONS * 10) == first
        member.commit()
        assert describe_group(trio[1], moved_group)[0] == "Stable"

        killed_at = time.monotonic()
        trio[1].stop(signal.SIGKILL)
        # sent while node 1 is dead and still listed: librdkafka follows the leaders once they move
        second = produce(trio[0].bootstrap, "failover", range(PARTITIONS), per_partition=10, start=10)
        wait_for_brokers(survivors, [0, 2])
        assert time.monotonic() - killed_at < 2 * LEASE_MS / 1000 + 3

        leaders = [[p.leader_id for p in metadata(g, topics=["failover"]).topics[0].partitions] for g in survivors]
        assert leaders[0] == leaders[1] == [leader_of("failover", p, [0, 2]) for p in range(PARTITIONS)]
        assert [find_coordinators(g, [moved_group])[0][0] for g in survivors] == [stand_in.node_id] * 2
        expected = {p: first[p] + second[p] for p in range(PARTITIONS)}
        assert consume(trio[2].bootstrap, "failover", range(PARTITIONS), PARTITIONS * 20) == expected  # each once

        # the member finds the new coordinator, joins again and reads on (from its committed
        # offsets: what it read before it rejoined may come twice)
        assert member.read_values(values_of(second)) and describe_group(stand_in, moved_group)[0] == "Stable"
        member.commit()

        trio[1].start()  # at once: its id is free, the lease lapsed
        wait_for_brokers(trio, NODE_IDS)
        # the stand-in gives the group up; the member finds node 1 again, joins it and reads on
        wait_until(
            lambda: member.assignments() and describe_group(trio[1], moved_group)[0] == "Stable",
            30,
            0.2,
            "the member to join node 1 again",
        )
        assert describe_group(stand_in, moved_group) == ("NOT_COORDINATOR", [])
        third = produce(trio[0].bootstrap, "failover", range(PARTITIONS), per_partition=5, start=20)
        assert member.read_values(values_of(third))


# -- clients ----------------------------------------------------------------------------------------


def produce(
    bootstrap: str, topic: str, partitions: Any, per_partition: int, start: int = 0, stats_cb: Any = None, **conf: Any
) -> dict[int, list[bytes]]:
    """Send ``per_partition`` records to each partition with an idempotent confluent-kafka
    producer; the values sent, by partition, once every one is acknowledged."""
    from confluent_kafka import Producer

    config = {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "linger.ms": 5,
        "message.timeout.ms": 30_000,
        "topic.metadata.refresh.interval.ms": 1_000,
        "retry.backoff.ms": 100,
        **conf,
    }
    if stats_cb is not None:
        config["stats_cb"] = stats_cb
    producer = Producer(config)
    failures: list[Any] = []
    sent: dict[int, list[bytes]] = defaultdict(list)
    for i in range(start, start + per_partition):
        for p in partitions:
            value = f"{topic}-{p}-{i}".encode()
            producer.produce(topic, value=value, partition=p, on_delivery=lambda err, msg: err and failures.append(err))
            sent[p].append(value)
        producer.poll(0)
    assert producer.flush(45) == 0, "records still unacknowledged"
    if stats_cb is not None:
        producer.poll(0.3)  # one more statistics callback, after the last acknowledgement
    assert failures == []
    return dict(sent)


def consume(bootstrap: str, topic: str, partitions: Any, n: int, timeout: float = 30) -> dict[int, list[bytes]]:
    """``n`` values read by ``assign`` from the start of the partitions, by partition."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "assign-only",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    got: dict[int, list[bytes]] = defaultdict(list)
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        deadline = time.monotonic() + timeout
        count = 0
        while count < n and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got[msg.partition()].append(msg.value())
            count += 1
    finally:
        consumer.close()
    return dict(got)


class GroupConsumers:
    """``members`` confluent-kafka consumers subscribed to ``topic`` in ``group``, from the
    earliest offsets, offsets committed by hand."""

    def __init__(self, bootstrap: str, topic: str, group: str, members: int) -> None:
        from confluent_kafka import Consumer

        self.consumers = [
            Consumer(
                {
                    "bootstrap.servers": bootstrap,
                    "group.id": group,
                    "auto.offset.reset": "earliest",
                    "enable.auto.commit": False,
                    "session.timeout.ms": 6_000,
                    "heartbeat.interval.ms": 500,
                    "isolation.level": "read_committed",
                }
            )
            for _ in range(members)
        ]
        for c in self.consumers:
            c.subscribe([topic])

    def _poll(self) -> Iterator[Any]:
        for c in self.consumers:
            msg = c.poll(0.1)
            if msg is not None:
                assert msg.error() is None, msg.error()
                yield msg

    def read(self, n: int, timeout: float = 60) -> dict[int, list[bytes]]:
        """The next ``n`` values the members read, by partition."""
        got: dict[int, list[bytes]] = defaultdict(list)
        deadline = time.monotonic() + timeout
        count = 0
        while count < n and time.monotonic() < deadline:
            for msg in self._poll():
                got[msg.partition()].append(msg.value())
                count += 1
        return dict(got)

    def read_values(self, wanted: set[bytes], timeout: float = 60) -> bool:
        """Read until each of ``wanted`` was read (some may come twice: a rebalance goes back to
        the committed offsets); whether they all were, within ``timeout``."""
        got: set[bytes] = set()
        deadline = time.monotonic() + timeout
        while not wanted <= got and time.monotonic() < deadline:
            got.update(msg.value() for msg in self._poll())
        return wanted <= got

    def assignments(self) -> list[list[int]]:
        for _ in self._poll():
            pass
        return [sorted(tp.partition for tp in c.assignment()) for c in self.consumers]

    def commit(self) -> None:
        for c in self.consumers:
            c.commit(asynchronous=False)

    def __enter__(self) -> "GroupConsumers":
        return self

    def __exit__(self, *exc: object) -> None:
        for c in self.consumers:
            c.close()


def values_of(sent: dict[int, list[bytes]]) -> set[bytes]:
    return {v for values in sent.values() for v in values}


def describe_group(g: GatewayProcess, group: str) -> tuple[str, list[Any]]:
    """The group's state and members as gateway ``g`` describes it, or the error's name."""
    with g.connect() as conn:
        (d,) = conn.request(ApiKey.DescribeGroups, 5, {"groups": [group], "include_authorized_operations": False}).groups
    if d.error_code:
        return next(c.name for c in ErrorCode if c.kafka_code == d.error_code), []
    return d.group_state, list(d.members)
