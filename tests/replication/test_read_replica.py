"""Consumers on a read replica (KIP-392, fetch from follower): a gateway of the primary and a read
replica gateway on the streaming standby (``tests.replication.cluster``), in rack ``r1``.

- librdkafka in read_committed with ``client.rack=r1``, bootstrapped at the primary's gateway,
  reads a topic written by a transactional producer that commits some transactions and aborts
  others: it gets exactly the committed records, and it fetched them from the replica (librdkafka's
  own statistics name the broker each partition is fetched from, and the standby served the reads:
  its own transaction counter moved). A consumer without a rack reads them from the leader.
- With the standby's replay paused, the replica answers from its own snapshot: its high watermark
  behind the primary's, never ahead, its last stable offset its own (a transaction the primary
  has committed since is still open there), no record past either; an offset the primary has and
  the standby has not replayed is no records, not OFFSET_OUT_OF_RANGE; a fetch waiting there is
  answered once the standby replays, by the replica's poll of its standby.
- The replica leads nothing: Metadata names the primary's gateway as every partition's leader and
  the replica among its replicas, with its rack, and a Produce sent to the replica is
  NOT_LEADER_OR_FOLLOWER.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from typing import Any, Iterator

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from app.storage.embedded import DATABASE
from app.wire.kafka.messages import ApiKey
from tests.kafka.conftest import GatewayProcess
from tests.replication.cluster import Pair, replicated_pair
from tests.support import wait_until

TOPIC = "replicated"
PARTITIONS = 2
PRIMARY_NODE, REPLICA_NODE = 0, 1
RACK = "r1"
ENV = {
    "TXLOG_KAFKA_NODE_LEASE_MS": "1500",
    "TXLOG_REPLICA_POLL_INTERVAL_MS": "20",
    "TXLOG_KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
}
NOT_LEADER_OR_FOLLOWER = 6
OFFSET_OUT_OF_RANGE = 1
LATEST = -1


class Deployment:
    def __init__(self, pair: Pair, primary: GatewayProcess, replica: GatewayProcess) -> None:
        self.pair = pair
        self.primary = primary
        self.replica = replica


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    root = tmp_path_factory.mktemp("read-replica")
    with replicated_pair(root, synchronous=False) as pair:
        primary_url = pair.primary.admin_url(DATABASE)
        primary = GatewayProcess(primary_url, env=ENV, log_path=root / "primary-gateway.log", node_id=PRIMARY_NODE)
        replica = GatewayProcess(
            primary_url,
            env={**ENV, "TXLOG_REPLICA_DATABASE_URL": pair.standby.admin_url(DATABASE), "TXLOG_KAFKA_RACK": RACK},
            log_path=root / "replica-gateway.log",
            node_id=REPLICA_NODE,
        )
        with primary, replica:
            admin = AdminClient({"bootstrap.servers": primary.bootstrap})
            wait_until(lambda: len(admin.list_topics(timeout=5).brokers) == 2, timeout=15, message="both gateways listed")
            admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(timeout=15)
            yield Deployment(pair, primary, replica)


def standby_reads(pair: Pair) -> int:
    """Transactions the standby has run in txlog's database: only read replicas read there."""
    return int(pair.standby.query("SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (DATABASE,))[0][0])


def caught_up(pair: Pair) -> bool:
    target = pair.primary.wal_lsn()
    return int(pair.standby.query("SELECT pg_last_wal_replay_lsn() - '0/0'")[0][0]) >= target


def transactional_producer(d: Deployment) -> Producer:
    producer = Producer({"bootstrap.servers": d.primary.bootstrap, "transactional.id": f"rr-{uuid.uuid4()}", "linger.ms": 5})
    producer.init_transactions(30)
    return producer


def write_transactions(d: Deployment) -> list[bytes]:
    """Five transactions over both partitions, the second and fourth aborted, the last committed:
    the values committed, in the order sent."""
    producer = transactional_producer(d)
    committed: list[bytes] = []
    for txn in range(5):
        producer.begin_transaction()
        values = [f"t{txn}-{i}".encode() for i in range(6)]
        for i, value in enumerate(values):
            producer.produce(TOPIC, value, partition=i % PARTITIONS)
        if txn in (1, 3):
            producer.flush(30)
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)
            committed += values
    return committed


def consume(d: Deployment, rack: str | None, expected: int) -> tuple[list[bytes], list[dict[str, Any]]]:
    """``expected`` records read_committed from the start, and librdkafka's statistics meanwhile."""
    stats: list[dict[str, Any]] = []
    config = {
        "bootstrap.servers": d.primary.bootstrap,
        "group.id": f"rr-{uuid.uuid4()}",
        "isolation.level": "read_committed",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "statistics.interval.ms": 100,
        "stats_cb": lambda raw: stats.append(json.loads(raw)),
    }
    if rack is not None:
        config["client.rack"] = rack
    consumer = Consumer(config)
    got: list[bytes] = []
    try:
        consumer.subscribe([TOPIC])
        deadline = time.monotonic() + 30
        while len(got) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                got.append(msg.value())
        consumer.poll(0.3)  # one more statistics round
    finally:
        consumer.close()
    return got, stats


def fetched_from(stats: list[dict[str, Any]]) -> dict[int, set[int]]:
    """Per partition, the brokers librdkafka fetched it from (its ``broker`` statistic)."""
    found: dict[int, set[int]] = {p: set() for p in range(PARTITIONS)}
    for s in stats:
        for key, part in s.get("topics", {}).get(TOPIC, {}).get("partitions", {}).items():
            if int(key) >= 0 and part.get("broker", -1) >= 0:
                found[int(key)].add(part["broker"])
    return found


def test_a_consumer_in_the_replicas_rack_reads_exactly_the_committed_records_from_it(deployment: Deployment) -> None:
    d = deployment
    committed = write_transactions(d)
    before = standby_reads(d.pair)
    got, stats = consume(d, RACK, len(committed))
    assert Counter(got) == Counter(committed)
    # the leader sent the partitions to the replica (answering no records), which served them from then on
    last = {int(k): part for k, part in stats[-1]["topics"][TOPIC]["partitions"].items() if int(k) >= 0}
    assert {p: (part["leader"], part["broker"]) for p, part in last.items()} == {
        p: (PRIMARY_NODE, REPLICA_NODE) for p in range(PARTITIONS)
    }
    wait_until(lambda: standby_reads(d.pair) > before, timeout=15, message="the standby's read transactions counted")

    got, stats = consume(d, None, len(committed))  # no rack: the leader
    assert Counter(got) == Counter(committed)
    assert fetched_from(stats) == {p: {PRIMARY_NODE} for p in range(PARTITIONS)}


def test_metadata_names_the_primarys_gateway_leader_and_the_replica_a_follower_with_its_rack(deployment: Deployment) -> None:
    d = deployment
    with d.replica.connect() as raw:
        meta = raw.request(ApiKey.Metadata, 9, {"topics": [{"name": TOPIC}], "allow_auto_topic_creation": False})
        racks = {b.node_id: b.rack for b in meta.brokers}
        assert racks == {PRIMARY_NODE: None, REPLICA_NODE: RACK}
        for part in meta.topics[0].partitions:
            assert part.leader_id == PRIMARY_NODE
            assert list(part.replica_nodes) == list(part.isr_nodes) == [PRIMARY_NODE, REPLICA_NODE]
        answer = raw.request(
            ApiKey.Produce,
            9,
            {"acks": -1, "timeout_ms": 5000, "topic_data": [{"name": TOPIC, "partition_data": [{"index": 0, "records": None}]}]},
        )
        assert answer.responses[0].partition_responses[0].error_code == NOT_LEADER_OR_FOLLOWER


def fetch(gateway: GatewayProcess, offset: int, wait_ms: int = 0, isolation: int = 1, partition: int = 0) -> Any:
    with gateway.connect(timeout=20) as raw:
        answer = raw.request(
            ApiKey.Fetch,
            12,
            {
                "replica_id": -1,
                "max_wait_ms": wait_ms,
                "min_bytes": 1,
                "max_bytes": 1 << 20,
                "isolation_level": isolation,
                "session_id": 0,
                "session_epoch": -1,
                "topics": [
                    {
                        "topic": TOPIC,
                        "partitions": [
                            {
                                "partition": partition,
                                "current_leader_epoch": -1,
                                "fetch_offset": offset,
                                "last_fetched_epoch": -1,
                                "log_start_offset": -1,
                                "partition_max_bytes": 1 << 20,
                            }
                        ],
                    }
                ],
                "forgotten_topics_data": [],
                "rack_id": "",
            },
        )
    return answer.responses[0].partitions[0]


def list_offset(gateway: GatewayProcess, isolation: int, partition: int = 0) -> int:
    with gateway.connect() as raw:
        answer = raw.request(
            ApiKey.ListOffsets,
            7,
            {
                "replica_id": -1,
                "isolation_level": isolation,
                "topics": [
                    {
                        "name": TOPIC,
                        "partitions": [{"partition_index": partition, "current_leader_epoch": -1, "timestamp": LATEST}],
                    }
                ],
            },
        )
    part = answer.topics[0].partitions[0]
    assert part.error_code == 0
    return int(part.offset)


def last_offset(records: bytes | None) -> int | None:
    """The last offset of the record batches of a fetch answer (each batch: base offset, length,
    ..., last offset delta at byte 23)."""
    data, last, at = records or b"", None, 0
    while at + 12 <= len(data):
        base = int.from_bytes(data[at : at + 8], "big")
        length = int.from_bytes(data[at + 8 : at + 12], "big")
        last = base + int.from_bytes(data[at + 23 : at + 27], "big")
        at += 12 + length
    return last


def test_a_lagging_replica_serves_only_its_own_snapshot(deployment: Deployment) -> None:
    d = deployment
    producer = transactional_producer(d)
    producer.begin_transaction()
    for i in range(2):
        producer.produce(TOPIC, f"open-{i}".encode(), partition=0)
    producer.flush(30)  # appended, its transaction open
    open_first = list_offset(d.primary, 1)  # the primary's last stable offset: the open transaction's first offset
    wait_until(lambda: caught_up(d.pair), timeout=15, interval=0.05, message="the standby replays the open transaction")
    wait_until(lambda: list_offset(d.replica, 0) == list_offset(d.primary, 0), timeout=15, message="the replica's high watermark")
    d.pair.standby.query("SELECT pg_wal_replay_pause()")
    wait_until(
        lambda: d.pair.standby.query("SELECT pg_get_wal_replay_pause_state()") == [("paused",)],
        timeout=15,
        interval=0.05,
        message="replay paused",
    )
    try:
        producer.commit_transaction(30)  # committed on the primary, not yet replayed on the standby
        producer.begin_transaction()
        for i in range(3):
            producer.produce(TOPIC, f"later-{i}".encode(), partition=0)
        producer.commit_transaction(30)

        primary_hw, primary_lso = list_offset(d.primary, 0), list_offset(d.primary, 1)
        replica_hw, replica_lso = list_offset(d.replica, 0), list_offset(d.replica, 1)
        assert primary_lso == primary_hw  # nothing open on the primary
        assert replica_lso == open_first < replica_hw < primary_hw  # its own: the transaction still open there

        page = fetch(d.replica, 0)
        assert page.error_code == 0
        assert (page.high_watermark, page.last_stable_offset) == (replica_hw, replica_lso)
        last = last_offset(page.records)
        assert last is not None and last < replica_lso  # nothing of the open transaction, nothing later
        leader_page = fetch(d.primary, 0)
        assert (leader_page.high_watermark, leader_page.last_stable_offset) == (primary_hw, primary_lso)
        assert last_offset(leader_page.records) == primary_hw - 1

        beyond = fetch(d.replica, primary_hw - 1)  # the primary has it, the standby not yet
        assert (beyond.error_code, beyond.records or b"", beyond.high_watermark) == (0, b"", replica_hw)
        assert fetch(d.replica, primary_hw + 5).error_code == OFFSET_OUT_OF_RANGE  # nobody has it

        # a fetch waiting on the replica is answered once the standby replays (its poll of the standby)
        waiting: dict[str, Any] = {}
        waiter = threading.Thread(target=lambda: waiting.update(page=fetch(d.replica, replica_lso, wait_ms=10_000)))
        polls = standby_reads(d.pair)
        waiter.start()
        # parked, it reads the standby again and again (the statistics come within a second)
        wait_until(lambda: standby_reads(d.pair) >= polls + 10, timeout=10, message="the waiting fetch polls the standby")
        assert waiter.is_alive()
    finally:
        d.pair.standby.query("SELECT pg_wal_replay_resume()")
    waiter.join(20)
    assert not waiter.is_alive()
    page = waiting["page"]
    assert page.error_code == 0 and page.last_stable_offset == primary_lso and last_offset(page.records) is not None
    assert (list_offset(d.replica, 0), list_offset(d.replica, 1)) == (primary_hw, primary_lso)


def test_the_replica_is_never_ahead_of_the_primary(deployment: Deployment) -> None:
    producer = Producer({"bootstrap.servers": deployment.primary.bootstrap, "enable.idempotence": True, "linger.ms": 0})
    stop = threading.Event()

    def produce() -> None:
        n = 0
        while not stop.is_set():
            producer.produce(TOPIC, f"run-{n}".encode(), partition=1)
            producer.poll(0)
            n += 1
            if n % 50 == 0:
                producer.flush(10)

    writer = threading.Thread(target=produce)
    writer.start()
    try:
        for _ in range(30):
            replica = list_offset(deployment.replica, 0, partition=1)  # read first: the primary's can only grow
            assert replica <= list_offset(deployment.primary, 0, partition=1)
    finally:
        stop.set()
        writer.join()
        producer.flush(10)
