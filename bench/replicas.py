"""Read throughput of read_committed consumers with one PostgreSQL primary and two hot standbys
(read replica gateways, KIP-392) against the primary alone, in one run: ``python -m bench.replicas
[--quick]`` (or ``make bench ONLY=replicas``).

One primary and two streaming standbys (``tests.replication.cluster``'s nodes), four gateways on
them: nodes 0 and 3 of the primary (they lead the partitions), node 1 a read replica on the first
standby in rack r1, node 2 one on the second in rack r2. A topic of four partitions is written by
a transactional producer. Each window, four confluent-kafka consumers in read_committed, each
assigned one partition, bootstrapped at node 0, read the log round and round (back to its start at
its end):

- ``primary``: the consumers send no rack: they fetch from the leaders, two gateways reading the
  primary;
- ``replicas``: the consumers are in racks r1 and r2: the leaders send them to the read replicas,
  two gateways reading the standbys.

The two alternate window by window (the order swapped each round) and the medians are compared.
Each window also counts the read transactions each standby ran, which shows where the reads went.
Everything (three PostgreSQL servers, four gateways, the consumers) shares this machine: the
figure says what moving the reads off the primary gives here, not on separate hosts.
Writes bench/results/replicas.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from app.storage.embedded import DATABASE
from tests.kafka.conftest import GatewayProcess
from tests.replication.cluster import REPLICATION_USER, Node
from tests.support import wait_until

TOPIC = "bench-replicas"
PARTITIONS = 4
CONSUMERS = 4
VALUE = b"x" * 200
RACKS = {1: "r1", 2: "r2"}
RESULTS = Path(__file__).parent / "results" / "replicas.json"
ENV = {"TXLOG_KAFKA_NODE_LEASE_MS": "3000"}


def start_nodes(root: Path, standbys: int) -> tuple[Node, list[Node]]:
    primary = Node(root / "primary", "primary")
    primary.init_primary()
    primary.start_server()
    with primary.connect("postgres") as conn:
        conn.execute(f"CREATE ROLE {REPLICATION_USER} WITH REPLICATION LOGIN")
        conn.execute(f'CREATE DATABASE "{DATABASE}"')
    nodes = []
    for i in range(1, standbys + 1):
        standby = Node(root / f"standby{i}", f"standby{i}")
        standby.init_standby(primary, slot=f"bench_standby{i}", application_name=f"standby{i}")
        standby.start_server()
        nodes.append(standby)
    wait_until(
        lambda: primary.query("SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'") == [(standbys,)],
        timeout=60,
        interval=0.2,
        message="the standbys streaming",
    )
    return primary, nodes


def load(bootstrap: str, per_partition: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "bench-replicas", "linger.ms": 20})
    producer.init_transactions(30)
    for start in range(0, per_partition, 5_000):
        producer.begin_transaction()
        for n in range(start, min(start + 5_000, per_partition)):
            for p in range(PARTITIONS):
                producer.produce(TOPIC, VALUE, partition=p)
            if n % 1000 == 0:
                producer.poll(0)
        producer.commit_transaction(60)


class Reader(threading.Thread):
    """One consumer of one partition, reading it round and round until told to stop."""

    def __init__(self, bootstrap: str, partition: int, end: int, rack: str | None) -> None:
        super().__init__(daemon=True)
        from confluent_kafka import Consumer, TopicPartition

        config: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-replicas",  # offsets never committed: assign() alone
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
        }
        if rack:
            config["client.rack"] = rack
        self.tp = TopicPartition
        self.partition, self.end = partition, end
        self.consumer = Consumer(config)
        self.consumer.assign([TopicPartition(TOPIC, partition, 0)])
        self.count = 0
        self.started = threading.Event()
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                msgs = self.consumer.consume(500, 0.5)
                if not msgs:
                    continue
                self.started.set()
                self.count += len(msgs)
                if msgs[-1].offset() + 1 >= self.end:
                    self.consumer.seek(self.tp(TOPIC, self.partition, 0))
        finally:
            self.consumer.close()


def standby_reads(standbys: list[Node]) -> list[int]:
    return [int(s.query("SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (DATABASE,))[0][0]) for s in standbys]


def window(bootstrap: str, end: int, racked: bool, seconds: float, standbys: list[Node]) -> dict[str, Any]:
    readers = [Reader(bootstrap, p, end, RACKS[1 + p % 2] if racked else None) for p in range(CONSUMERS)]
    for r in readers:
        r.start()
    for r in readers:
        if not r.started.wait(30):
            raise RuntimeError(f"no records for partition {r.partition} in 30 s")
    time.sleep(1.0)  # warm-up: every consumer on the broker it settles on
    before, reads_before = sum(r.count for r in readers), standby_reads(standbys)
    began = time.perf_counter()
    time.sleep(seconds)
    records = sum(r.count for r in readers) - before
    elapsed = time.perf_counter() - began
    reads = [a - b for a, b in zip(standby_reads(standbys), reads_before)]
    for r in readers:
        r.stop.set()
    for r in readers:
        r.join(30)
    return {"rate": records / elapsed, "standby_reads": reads}


def run(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(prog="python -m bench.replicas")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--window", type=float, default=None)
    ap.add_argument("--records", type=int, default=None, help="records per partition")
    args = ap.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 5)
    seconds = args.window or (4.0 if args.quick else 8.0)
    per_partition = args.records or (10_000 if args.quick else 40_000)
    with tempfile.TemporaryDirectory(prefix="txlog-bench-replicas-") as d:
        root = Path(d)
        primary, standbys = start_nodes(root, 2)
        gateways: list[GatewayProcess] = []
        try:
            url = primary.admin_url(DATABASE)
            gateways.append(GatewayProcess(url, env=ENV, log_path=root / "gw0.log", node_id=0).start())
            for node_id, standby in zip((1, 2), standbys):
                env = {**ENV, "TXLOG_REPLICA_DATABASE_URL": standby.admin_url(DATABASE), "TXLOG_KAFKA_RACK": RACKS[node_id]}
                gateways.append(GatewayProcess(url, env=env, log_path=root / f"gw{node_id}.log", node_id=node_id).start())
            gateways.append(GatewayProcess(url, env=ENV, log_path=root / "gw3.log", node_id=3).start())
            bootstrap = gateways[0].bootstrap
            from confluent_kafka.admin import AdminClient, NewTopic

            admin = AdminClient({"bootstrap.servers": bootstrap})
            wait_until(lambda: len(admin.list_topics(timeout=5).brokers) == 4, timeout=30, message="four gateways listed")
            admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(timeout=30)
            load(bootstrap, per_partition)
            wait_until(
                lambda: (
                    primary.query("SELECT bool_and(replay_lsn >= pg_current_wal_lsn()) FROM pg_stat_replication") == [(True,)]
                ),
                timeout=60,
                message="the standbys caught up",
            )
            # Each partition: the records, and a commit marker per transaction, the last one last:
            # a consumer past the last record has read the log round.
            end = per_partition + (per_partition + 4_999) // 5_000 - 1
            windows: dict[str, list[dict[str, Any]]] = {"primary": [], "replicas": []}
            for n in range(rounds):
                order = ("primary", "replicas") if n % 2 == 0 else ("replicas", "primary")
                for name in order:
                    w = window(bootstrap, end, name == "replicas", seconds, standbys)
                    windows[name].append(w)
                    print(f"round {n + 1} {name:9s} {w['rate']:10.0f} records/s  standby reads {w['standby_reads']}", flush=True)
        finally:
            for g in reversed(gateways):
                g.stop()
            for s in standbys:
                s.destroy_quietly()
            primary.destroy_quietly()
    medians = {name: statistics.median(w["rate"] for w in ws) for name, ws in windows.items()}
    ratio = medians["replicas"] / medians["primary"]
    result = {
        "rounds": rounds,
        "window_s": seconds,
        "records_per_partition": per_partition,
        "partitions": PARTITIONS,
        "consumers": CONSUMERS,
        "value_bytes": len(VALUE),
        "windows": windows,
        "median_records_per_s": medians,
        "replicas_over_primary": ratio,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    summary = (
        f"replicas: read_committed {medians['replicas']:.0f} records/s with two standbys, "
        f"{medians['primary']:.0f} on the primary alone ({ratio:.2f}x)"
    )
    print(summary)
    return summary


if __name__ == "__main__":
    run()
