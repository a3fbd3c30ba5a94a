"""Automatic failover under Patroni, with transactional load over HTTP and the Kafka gateway.

A Patroni cluster (``patroni_cluster``: etcd, a primary and a synchronous standby, each node run by
its own Patroni) serves one ``txlog serve`` and one ``txlog kafka``, both given the multi-host URL
of the two nodes (``target_session_attrs=read-write``) and never restarted. Real clients load them
and keep what was acknowledged: transactional producers over HTTP (raw requests, each answer on
record; a quarter of the transactions aborted) and confluent-kafka transactional producers through
the gateway (delivery reports give each record's offset; ``commit_transaction`` returning is the
acknowledged commit). Then a fault:

- ``kill -9`` of every process of the primary's PostgreSQL. Its Patroni sees the crash and, as
  ``primary_start_timeout`` is 0, lets the synchronous standby take the leader key at once; the
  standby is promoted; the old primary comes back as a standby of the new one by itself
  (crash recovery, ``pg_rewind`` if its WAL went further) and becomes its synchronous standby.
- Under ``make chaos`` (tests/replication/patroni_stall.py), a network stall: SIGSTOP of every
  process of the primary's PostgreSQL while its Patroni keeps running. Patroni's loop hangs on the frozen server, the leader key expires after the TTL and the
  standby is promoted. When the old primary is resumed it must not take writes as a second
  primary: its commits wait for a synchronous standby it no longer has, so none is acknowledged,
  and Patroni demotes it (it finds the leader key another's) and rewinds it to follow.

After each: both clients committed again on the new primary with the same txlog processes; every
acknowledged record of every acknowledged commit is there, at its acknowledged offset, exactly
once; nothing of an aborted transaction is visible and each transaction is all or nothing; no
transaction is left Ongoing or Prepare* and the last stable offset reaches the high watermark;
the time to recover is printed.

``make chaos`` also runs the loss of the primary's whole host (tests/replication/patroni_host_loss.py):
its Patroni and its PostgreSQL killed at once, so the standby waits for the leader key's TTL;
Patroni is started again on the old node, which rejoins as a standby.
"""

from __future__ import annotations

import collections
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import confluent_kafka
import httpx
import pytest

import txlog
from tests.kafka.conftest import GatewayProcess
from tests.replication.patroni_cluster import TTL, PatroniCluster, PatroniNode, have_patroni, patroni_cluster
from tests.support import ServerProcess, wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not have_patroni(), reason="needs patroni and etcd (scripts/system-deps.sh installs them)"),
]

HTTP_TOPIC = "ledger-http"  # written by txlog's client over HTTP
KAFKA_TOPIC = "ledger-kafka"  # written by confluent-kafka through the gateway
PARTITIONS = 3
PRODUCERS = 2  # of each client
BATCH = 4  # records per transaction
TXN_TIMEOUT_MS = 10_000
ENV = {"TXLOG_TRANSACTION_ABORT_CHECK_INTERVAL_MS": "500", "TXLOG_KAFKA_NODE_LEASE_MS": "3000"}


class Phase:
    def __init__(self) -> None:
        self.name = "before"


@dataclass
class Txn:
    number: int
    sent: list[str] = field(default_factory=list)
    delivered: dict[str, tuple[int, int]] = field(default_factory=dict)  # value -> (partition, offset)
    outcome: str = "open"  # committed / aborted (acknowledged), unknown (the producer failed fatally)
    phase: str = ""  # the test's phase when the outcome was known
    answered_at: float = 0.0


class Transactions(threading.Thread):
    """A transactional producer of a real client (confluent-kafka through the gateway, or txlog's
    own client over HTTP, which has confluent-kafka's shapes): begin, BATCH records on random
    partitions, commit (a quarter aborted). Delivery reports give each record's offset. A
    retriable error on commit is retried, one that requires an abort aborts, a fatal one starts a
    new producer (whose init_transactions fences the old one and aborts what it left open)."""

    def __init__(self, kind: str, target: str, tid: str, phase: Phase, stop: threading.Event, seed: int) -> None:
        super().__init__(name=tid, daemon=True)
        self.kind, self.target, self.tid, self.phase, self.stop = kind, target, tid, phase, stop
        self.topic = KAFKA_TOPIC if kind == "kafka" else HTTP_TOPIC
        self.rng = random.Random(seed)
        self.txns: list[Txn] = []
        self.errors: collections.Counter[str] = collections.Counter()
        self.failure: BaseException | None = None

    def producer(self):  # type: ignore[no-untyped-def]
        config = {"bootstrap.servers": self.target, "transactional.id": self.tid, "transaction.timeout.ms": TXN_TIMEOUT_MS}
        p = confluent_kafka.Producer({**config, "linger.ms": 5}) if self.kind == "kafka" else txlog.Producer(config)
        p.init_transactions(90)
        return p

    def committed(self, phase: str | None = None) -> list[Txn]:
        return [t for t in self.txns if t.outcome == "committed" and phase in (None, t.phase)]

    def run(self) -> None:
        try:
            producer = self.producer()
            while not self.stop.is_set():
                if not self.transaction(producer):
                    producer = self.producer()
        except BaseException as exc:  # reported by the test
            self.failure = exc

    def transaction(self, producer) -> bool:  # type: ignore[no-untyped-def]
        """One transaction; False when the producer must be replaced."""
        txn = Txn(len(self.txns))
        self.txns.append(txn)

        def delivered(err, msg) -> None:  # type: ignore[no-untyped-def]
            if err is None:
                txn.delivered[msg.value().decode()] = (msg.partition(), msg.offset())

        abort = self.rng.random() < 0.25
        deadline = time.monotonic() + 90
        try:
            producer.begin_transaction()
            for i in range(BATCH):
                value = f"{self.tid}/{txn.number}/{i}"
                txn.sent.append(value)
                producer.produce(self.topic, value.encode(), partition=self.rng.randrange(PARTITIONS), on_delivery=delivered)
            while True:
                try:
                    if abort:
                        producer.abort_transaction(30)
                    else:
                        producer.commit_transaction(30)
                    break
                except CLIENT_ERRORS as exc:
                    error = exc.args[0]
                    self.errors[f"{error.name()} ({self.phase.name})"] += 1
                    if error.retriable() and time.monotonic() < deadline:
                        continue
                    if error.txn_requires_abort() and not abort:
                        abort = True
                        continue
                    raise
        except CLIENT_ERRORS as exc:
            self.errors[f"{exc.args[0].name()} ({self.phase.name}, fatal)"] += 1
            txn.outcome, txn.phase = "unknown", self.phase.name
            return False
        txn.outcome = "aborted" if abort else "committed"
        txn.phase, txn.answered_at = self.phase.name, time.monotonic()
        return True


CLIENT_ERRORS = (confluent_kafka.KafkaException, txlog.KafkaException)


@dataclass
class HA:
    cluster: PatroniCluster
    server: ServerProcess
    gateway: GatewayProcess
    api: httpx.Client


@pytest.fixture(scope="module")
def ha(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HA]:
    root = tmp_path_factory.mktemp("patroni")
    with (
        patroni_cluster(root / "cluster") as cluster,
        ServerProcess(cluster.url, env=ENV, log_path=root / "server.log") as server,
        GatewayProcess(cluster.url, env=ENV, log_path=root / "gateway.log", node_id=1) as gateway,
        server.client(timeout=60) as api,
    ):
        for topic in (HTTP_TOPIC, KAFKA_TOPIC):
            assert api.post("/v1/topics", json={"name": topic, "partitions": PARTITIONS}).status_code == 201
        yield HA(cluster, server, gateway, api)


def read_committed(bootstrap: str) -> dict[str, tuple[str, int, int]]:
    """Every record of both topics a confluent-kafka read_committed consumer sees through the
    gateway, value -> (topic, partition, offset); no value twice."""
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "patroni-check",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    seen: dict[str, tuple[str, int, int]] = {}
    ends = {(t, p) for t in (HTTP_TOPIC, KAFKA_TOPIC) for p in range(PARTITIONS)}
    try:
        consumer.assign([confluent_kafka.TopicPartition(t, p, 0) for t, p in ends])
        at_end: set[tuple[str, int]] = set()
        deadline = time.monotonic() + 60
        while at_end != ends:
            assert time.monotonic() < deadline, f"the read_committed consumer is stuck short of {ends - at_end}"
            msg = consumer.poll(1)
            if msg is None:
                continue
            if msg.error():
                assert msg.error().code() == confluent_kafka.KafkaError._PARTITION_EOF, msg.error()
                at_end.add((msg.topic(), msg.partition()))
                continue
            value = msg.value().decode()
            assert value not in seen, f"{value} seen twice"
            seen[value] = (msg.topic(), msg.partition(), msg.offset())
    finally:
        consumer.close()
    return seen


def run_fault(ha: HA, name: str, fault: Callable[[PatroniNode, PatroniNode], None]) -> dict:
    """Load, ``fault(leader, standby)``, the standby promoted, load on the new primary; then the
    checks. Returns the old and new leader and when the fault began."""
    cluster, server, gateway, api = ha.cluster, ha.server, ha.gateway, ha.api
    old, new = cluster.healthy()
    processes = {**server.processes(), **gateway.processes()}
    phase, stop = Phase(), threading.Event()
    loads = [
        Transactions(kind, target, f"{name}-{kind}-{i}", phase, stop, seed=i)
        for kind, target in (("http", server.url), ("kafka", gateway.bootstrap))
        for i in range(PRODUCERS)
    ]
    for load in loads:
        load.start()

    def everyone_committed(phase: str, n: int) -> bool:
        assert not [load.failure for load in loads if load.failure], [load.failure for load in loads]
        return all(len(load.committed(phase)) >= n for load in loads)

    try:
        wait_until(lambda: everyone_committed("before", 3), timeout=60, message="commits before the fault")
        phase.name = "fault"
        faulted_at = time.monotonic()
        fault(old, new)
        cluster.wait(new.is_primary, TTL * 3 + 30, f"{new.name} promoted")
        promoted_at = time.monotonic()
        phase.name = "after"
        wait_until(lambda: everyone_committed("after", 2), timeout=90, message="every producer committing on the new primary")
    finally:
        stop.set()
        deadline = time.monotonic() + 120
        for load in loads:
            load.join(max(0.0, deadline - time.monotonic()))
    for load in loads:
        assert not load.is_alive(), f"{load.name} still running"
        assert load.failure is None, f"{load.name}: {load.failure!r}"

    # txlog found the new primary by itself: the same processes, connected to it.
    assert server.alive() and gateway.alive()
    assert {**server.processes(), **gateway.processes()}.keys() == processes.keys(), "a txlog process was restarted"
    assert not new.is_in_recovery()
    assert new.query("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'txlog'")[0][0] >= 1

    # Nothing left open: the sweeper aborts what a replaced producer left, at its timeout.
    def settled() -> bool:
        open_txns = new.query(
            "SELECT count(*) FROM txlog.transactions WHERE state IN ('Ongoing', 'PrepareCommit', 'PrepareAbort')",
            database="txlog",
        )[0][0]
        ends = [p for t in (HTTP_TOPIC, KAFKA_TOPIC) for p in api.get(f"/v1/topics/{t}").json()["partitions"]]
        return open_txns == 0 and all(p["last_stable_offset"] == p["high_watermark"] for p in ends)

    wait_until(settled, timeout=TXN_TIMEOUT_MS / 1000 + 30, interval=0.2, message="every transaction ended, LSO at the end")
    settled_at = time.monotonic()

    # Every acknowledged commit is there at its offsets; aborted ones invisible; all or nothing.
    visible = read_committed(gateway.bootstrap)
    for load in loads:
        for t in load.txns:
            shown = {v for v in t.sent if v in visible}
            where = f"{load.tid} #{t.number} ({t.outcome}, {t.phase})"
            if t.outcome == "committed":
                assert set(t.delivered) == set(t.sent), f"{where}: committed without a delivery report for each record"
                assert all(visible.get(v) == (load.topic, *t.delivered[v]) for v in t.sent), f"{where}: acknowledged record lost"
            if t.outcome == "aborted":
                assert not shown, f"{where}: records of an aborted transaction are visible"
            assert shown in (set(), set(t.sent)), f"{where}: part of a transaction is visible"

    def first_after(kind: str) -> float:
        return min(t.answered_at for load in loads if load.kind == kind for t in load.committed("after")) - faulted_at

    errors = sum((load.errors for load in loads), collections.Counter())
    print(
        f"\n{name}: {old.name} -> {new.name}; {new.name} promoted {promoted_at - faulted_at:.1f} s after the fault; first "
        f"commit acknowledged on it {first_after('http'):.1f} s after the fault over HTTP, {first_after('kafka'):.1f} s "
        f"through the Kafka gateway; every transaction ended {settled_at - faulted_at:.1f} s after it\n"
        f"  commits acknowledged: {sum(len(load.committed()) for load in loads)}, none lost; client errors "
        f"{dict(errors) or 'none'}"
    )
    return {"old": old, "new": new, "faulted_at": faulted_at}


def rejoins(ha: HA, old: PatroniNode, new: PatroniNode, since: float, how: str) -> None:
    """The old primary follows the new one as its synchronous standby, on the new timeline."""
    ha.cluster.wait_synchronous(new, old, timeout=90)
    assert old.is_in_recovery()
    timeline = new.status()["timeline"]
    wait_until(lambda: old.status().get("timeline") == timeline, timeout=30, message=f"{old.name} on timeline {timeline}")
    print(f"  {old.name} rejoined as the synchronous standby {time.monotonic() - since:.1f} s after the fault ({how})")


def test_kill9_of_the_primary_postgresql_patroni_promotes_and_the_old_primary_rejoins(ha: HA) -> None:
    result = run_fault(ha, "kill9", lambda old, new: old.kill9())
    rejoins(ha, result["old"], result["new"], result["faulted_at"], "crash recovery, rewound if needed, by its Patroni")
