"""The fault suite: txlog's promises checked under every fault at once.

Two server hosts (``txlog serve --workers 2`` each) share one PostgreSQL. Under load:
- idempotent producers (the Python client) write numbered records to ``in``, one of them through
  a proxy that loses answers;
- a consume-transform-produce process (``examples/consume_transform_produce.py``) reads ``in``
  read_committed and writes each record upper-cased to ``out`` in transactions that also commit
  its group's offsets, through another lossy proxy;
- a read_committed consumer follows ``out``;
- beside them, the Kafka doors (``kafka_doors.py``): two ``txlog kafka`` gateways on the same
  database, confluent-kafka and kafka-python idempotent producers (confluent-kafka through lossy
  proxies), a transactional copier of each library and read_committed consumers of both.

Meanwhile the suite injects faults (``Faults``: one function per kind, ``Faults.add`` plugs in
another; the gateways' faults on a schedule of their own, in the same window): ``kill -9`` of a worker, of a whole server and of a gateway (restarted on its ports),
SIGSTOP pauses of a server and of a gateway, an immediate PostgreSQL restart, the transforming
process killed with ``kill -9`` mid-transaction (and started again), and a zombie: a second
transforming process with the same transactional id, which fences the first. After each fault
every Kafka producer must deliver again.

When the faults stop, the checker (``checker.py``) counts the anomalies Jepsen's Kafka workload
names over every client's history, HTTP and Kafka alike, against the log read_committed; the run
prints the load, the faults with their times and each count, and every count must be 0. Then an
independent check of the HTTP load reads the log over SQL and HTTP and verifies:
every acknowledged record present exactly once and nothing written twice; per-producer order;
dense offsets; every input record transformed exactly once in ``out`` as read_committed, and
nothing else (no aborted or never-committed record, not even part of a transaction); the group's
offsets at the end of ``in``; the consumer never went backwards and never skipped a committed
record; the last stable offset caught up with the high watermark.

With ``TXLOG_CHAOS_HA=1`` (a run of its own under ``make chaos``) the database is a Patroni cluster
of a primary and its synchronous standby (``patroni_faults.py``), every process given both nodes in
one URL; PostgreSQL's faults are then its failover (the leader's PostgreSQL killed with ``kill -9``
or frozen past Patroni's TTL) and a restart of the leader by Patroni, in place of the one server's
immediate restart, and the run prints each failover's times.

``TXLOG_CHAOS_SECONDS`` sets how long faults are injected and ``TXLOG_CHAOS_PRODUCE_PAUSE_S`` the
load (``make chaos`` runs longer and heavier; the suite's own run is bounded); a failing run
prints its ``TXLOG_CHAOS_SEED`` to replay the same faults."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import httpx
import psycopg
import pytest

from app.storage import migrate
from app.storage.embedded import DATABASE, EmbeddedPostgres
from tests.chaos import checker
from tests.chaos.checker import Copier as CopierHistory
from tests.chaos.checker import History, Poll
from tests.chaos.database_restarts import ACKS, quiet_clients  # noqa: F401 — the fixture, used below
from tests.chaos.kafka_doors import KafkaDoors
from tests.chaos.patroni_faults import PatroniFaults
from tests.client.proxy import LossyProxy
from tests.kafka.conftest import GatewayProcess
from tests.replication.patroni_cluster import PatroniCluster, have_patroni
from tests.support import ROOT, ServerProcess, TxlogProcess, destroy_embedded, wait_until, wait_while_progressing
from txlog import Consumer, KafkaException, Producer, TopicPartition

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("quiet_clients")]

SECONDS = float(os.environ.get("TXLOG_CHAOS_SECONDS", "20"))
# Each producer sends 20 records, then pauses this long: 0.3 s is about 65 records/s each. The
# suite's run keeps the load light: what the producers and the transforming process fall behind by
# during the faults is drained after them, before the checks, and grows with the load; `make chaos`
# loads heavier (0.03 s).
PRODUCE_PAUSE_S = float(os.environ.get("TXLOG_CHAOS_PRODUCE_PAUSE_S", "0.3"))
SEED = int(os.environ.get("TXLOG_CHAOS_SEED", str(random.randrange(1 << 30))))
# The database a Patroni cluster (tests/chaos/patroni_faults.py) that fails over among the faults.
HA = os.environ.get("TXLOG_CHAOS_HA") == "1"
PARTITIONS = 3
PRODUCERS = 3
GROUP = "upper"
TID = "upper-0"
ENV = {"TXLOG_TRANSACTION_ABORT_CHECK_INTERVAL_MS": "300", "TXLOG_DB_LOCK_TIMEOUT_MS": "3000"}


@dataclass
class ProducerLog:
    """What one idempotent producer was told: its acknowledged values, in the order it produced them."""

    name: str
    produced: list[str] = field(default_factory=list)
    acked: dict[str, tuple[int, int]] = field(default_factory=dict)  # value -> (partition, offset)
    failed: list[str] = field(default_factory=list)
    errors: Counter = field(default_factory=Counter)  # why records failed
    fatal: list[str] = field(default_factory=list)  # the current producer's fatal error
    replaced: list[str] = field(default_factory=list)  # every fatal error that replaced a producer


class Load:
    def __init__(self, hosts: list[ServerProcess], lossy_url: str) -> None:
        self.hosts = hosts
        self.lossy_url = lossy_url
        self.stop = threading.Event()  # the producers
        self.stop_following = threading.Event()  # the read_committed consumer
        self.logs: list[ProducerLog] = []
        self.threads: list[threading.Thread] = []
        self.seen: dict[int, list[tuple[int, str]]] = defaultdict(list)  # out partition -> (offset, source)
        self.polls: list[Poll] = []  # the follower's, in poll order (one session: assigned once)
        self.consumer_problems: list[str] = []

    def start(self) -> None:
        for i in range(PRODUCERS):
            url = self.lossy_url if i == 0 else self.hosts[i % len(self.hosts)].url
            log = ProducerLog(f"p{i}")
            self.logs.append(log)
            self.threads.append(threading.Thread(target=self._produce, args=(log, url), daemon=True))
        self.threads.append(threading.Thread(target=self._consume, args=(self.hosts[-1].url,), daemon=True))
        for t in self.threads:
            t.start()

    def _produce(self, log: ProducerLog, url: str) -> None:
        n = 0
        while not self.stop.is_set():
            # A producer whose error is fatal is replaced, as an application would do.
            producer = Producer(
                {
                    "url": url,
                    "enable.idempotence": True,
                    "linger.ms": 5,
                    "message.timeout.ms": 120_000,
                    "request.timeout.ms": 5000,
                }
            )

            def report(err, msg) -> None:  # type: ignore[no-untyped-def]
                value = msg.value().decode()
                if err is None:
                    log.acked[value] = (msg.partition(), msg.offset())
                else:
                    log.failed.append(value)
                    log.errors[err.name()] += 1
                    if err.fatal():
                        log.fatal.append(str(err))

            try:
                while not self.stop.is_set() and not log.fatal:
                    for _ in range(20):
                        value = f"{log.name}-{n}"
                        producer.produce("in", value.encode(), key=f"k{n % 17}".encode(), on_delivery=report)
                        log.produced.append(value)
                        n += 1
                    producer.poll(0)
                    time.sleep(PRODUCE_PAUSE_S)
            except KafkaException as exc:  # refused at once: the producer has failed fatally
                log.fatal.append(str(exc))
            finally:
                producer.flush(120)
                producer.close()
            log.replaced.extend(log.fatal)
            log.fatal.clear()

    def _consume(self, url: str) -> None:
        consumer = Consumer(
            {
                "url": url,
                "group.id": "follower",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
        consumer.assign([TopicPartition("out", p, 0) for p in range(PARTITIONS)])
        try:
            while not self.stop_following.is_set():
                msg = consumer.poll(0.5)
                if msg is None or msg.error() is not None:
                    continue
                source = dict(msg.headers() or []).get("source", b"").decode()
                self.seen[msg.partition()].append((msg.offset(), source))
                self.polls.append(Poll("out", msg.partition(), msg.offset(), msg.value().decode()))
        except Exception as exc:  # noqa: BLE001 — the checker reports it
            self.consumer_problems.append(repr(exc))
        finally:
            consumer.close()


class Transformer:
    """The consume-transform-produce process: started, killed and started again."""

    def __init__(self, url: str, log_dir: Path) -> None:
        self.url = url
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[bytes]] = []
        self.started = 0

    def spawn(self) -> subprocess.Popen[bytes]:
        self.started += 1
        out = open(self.log_dir / f"transformer-{self.started}.log", "wb")
        proc = subprocess.Popen(
            [
                sys.executable,
                "examples/consume_transform_produce.py",
                "--url",
                self.url,
                "--input",
                "in",
                "--output",
                "out",
                "--group",
                GROUP,
                "--transactional-id",
                TID,
                "--batch",
                "100",
            ],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def live(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.procs if p.poll() is None]

    def kill_all(self) -> None:
        for p in self.live():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(30)


def worker_pids(host: ServerProcess) -> list[int]:
    """The uvicorn workers of a host (the processes its supervisor spawned)."""
    assert host.proc is not None
    pids = []
    for pid in host.processes():
        with contextlib.suppress(OSError):
            if pid != host.proc.pid and b"multiprocessing.spawn" in Path(f"/proc/{pid}/cmdline").read_bytes():
                pids.append(pid)
    return pids


def ready(host: ServerProcess) -> bool:
    try:
        return httpx.get(host.url + "/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


class Faults:
    """The fault schedule. A fault kind is one function that injects it, waits for it to pass and
    says what it did (or None when there was nothing to do); ``add`` plugs in another kind. Each
    kind runs once, in a random order, then kinds at random until the time is up; after each fault
    every server and gateway is ready again before the next. Given ``gateways``, the schedule is
    the Kafka doors' (their gateways killed and frozen), run beside the servers' and the
    database's in the same window. A failover of the database between
    PostgreSQL's replicas is such a kind: ``faults.add("fail over PostgreSQL", ...)``, the servers
    and gateways then given the replicas' URL (``host=a,b target_session_attrs=read-write``) in
    place of the one server's, its restart a fault of the cluster's leader."""

    def __init__(
        self,
        pg: EmbeddedPostgres | None,
        hosts: list[ServerProcess],
        transformer: Transformer,
        rng: random.Random,
        gateways: list[GatewayProcess] | None = None,
        started: float | None = None,
    ) -> None:
        self.pg = pg
        self.hosts = hosts
        self.gateways = gateways or []
        self.transformer = transformer
        self.rng = rng
        self.started = started if started is not None else time.monotonic()
        self.injected: list[tuple[float, str]] = []  # (seconds since the start, what)
        self.kinds: dict[str, Callable[[], str | None]] = {
            "kill a worker": self.kill_worker,
            "kill a server": lambda: self.kill_one(self.hosts, lambda host: f"server :{host.port}"),
            "pause a server": self.pause_host,
            "restart PostgreSQL": self.restart_postgres,
            "kill the transformer": self.kill_transformer,
            "zombie": self.zombie,
        }
        if pg is None:  # a cluster's database faults are its own (``add``)
            del self.kinds["restart PostgreSQL"]
        if self.gateways:
            self.kinds = {
                "kill a gateway": lambda: self.kill_one(self.gateways, lambda gateway: f"Kafka gateway {gateway.node_id}"),
                "pause a gateway": self.pause_gateway,
            }

    def add(self, kind: str, inject: Callable[[], str | None]) -> None:
        """Another fault kind: ``inject`` does it and returns once it is over, saying what it did."""
        self.kinds[kind] = inject

    def start_again(self, process: TxlogProcess) -> None:
        """Start a killed server or gateway again. It checks the database's schema before it
        serves, and on a cluster that may be failing over meanwhile it waits for a node that
        accepts writes (TXLOG_STARTUP_DATABASE_WAIT_MS), as a running one rides the failover out."""
        process.start(timeout=120)

    def kill_worker(self) -> str | None:
        host = self.rng.choice(self.hosts)
        pids = worker_pids(host)
        if not pids:
            return None
        os.kill(self.rng.choice(pids), signal.SIGKILL)
        return f"kill -9 a worker of :{host.port}"

    def kill_one(self, processes: Sequence[TxlogProcess], label: Callable[[Any], str]) -> str:
        """``kill -9`` one of ``processes`` (a server's whole process group, or a gateway), then
        start it again on its ports; ``label`` names it in the schedule."""
        process = self.rng.choice(processes)
        process.kill()
        time.sleep(self.rng.uniform(0.2, 1.5))
        self.start_again(process)
        return f"kill -9 {label(process)}, restarted"

    def pause_host(self) -> str:
        host = self.rng.choice(self.hosts)
        host.signal_group(signal.SIGSTOP)
        pause = self.rng.uniform(1, 4)
        time.sleep(pause)
        host.signal_group(signal.SIGCONT)
        return f"SIGSTOP server :{host.port} for {pause:.1f} s"

    def restart_postgres(self) -> str:
        assert self.pg is not None
        self.pg.kill()  # pg_ctl stop -m immediate: no checkpoint, crash recovery on start
        time.sleep(self.rng.uniform(0.2, 1.0))
        self.pg.start()
        return "PostgreSQL restarted in immediate mode"

    def kill_transformer(self) -> str:
        self.transformer.kill_all()
        self.transformer.spawn()
        return "kill -9 the transforming process mid-transaction, started again"

    def zombie(self) -> str:
        """A second instance with the same transactional id: it fences the first, which must stop
        without writing anything more."""
        older = self.transformer.live()
        self.transformer.spawn()
        return f"a second transforming process with the same transactional id ({len(older)} fenced)"

    def pause_gateway(self) -> str:
        gateway = self.rng.choice(self.gateways)
        gateway.signal_group(signal.SIGSTOP)
        pause = self.rng.uniform(1, 4)
        time.sleep(pause)
        gateway.signal_group(signal.SIGCONT)
        return f"SIGSTOP Kafka gateway {gateway.node_id} for {pause:.1f} s"

    def run(self, seconds: float, after_each: Callable[[float], None] = lambda _since: None) -> None:
        """Faults for ``seconds``; ``after_each(since)`` waits for the clients to work again after each."""
        kinds = list(self.kinds)
        deadline = time.monotonic() + seconds
        order = kinds[:]  # every kind once, then at random
        self.rng.shuffle(order)
        while order or time.monotonic() < deadline:  # every kind at least once, however short the run
            kind = order.pop() if order else self.rng.choice(kinds)
            at = time.monotonic() - self.started
            what = self.kinds[kind]()
            over = time.monotonic()
            wait_until(
                lambda: all(g.ready() for g in self.gateways) if self.gateways else all(ready(h) for h in self.hosts),
                60,
                0.2,
                "servers and gateways ready after a fault",
            )
            after_each(over)
            if what is not None:
                self.injected.append(
                    (
                        at,
                        f"{what} (over after {over - self.started - at:.1f} s, clients working again {time.monotonic() - over:.1f} s later)",
                    )
                )
            time.sleep(self.rng.uniform(1.0, 3.0))


def fetch_all(url: str, topic: str, partition: int, isolation: str) -> list[dict]:
    """Every record of a partition as a reader at ``isolation`` sees it, following next_offset."""
    out: list[dict] = []
    offset = 0
    with httpx.Client(base_url=url, timeout=30) as c:
        while True:
            r = c.get(
                f"/v1/topics/{topic}/partitions/{partition}/records",
                params={"offset": offset, "max_records": 1000, "isolation_level": isolation, "encoding": "utf8"},
            )
            r.raise_for_status()
            page = r.json()
            out.extend(page["records"])
            if page["next_offset"] == offset:
                return out
            offset = page["next_offset"]


def test_nothing_acknowledged_is_lost_and_nothing_aborted_is_read_under_faults(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    print(f"\nfault suite: seed {SEED}, faults for {SECONDS:.0f} s{', PostgreSQL under Patroni' if HA else ''}")
    if HA and not have_patroni():
        pytest.skip("TXLOG_CHAOS_HA needs patroni and etcd (scripts/system-deps.sh installs them)")
    pg: EmbeddedPostgres | None = None
    cluster: PatroniCluster | None = None
    if HA:
        cluster = PatroniCluster(tmp_path / "cluster")
    else:
        pg = EmbeddedPostgres(tmp_path / "pg")
        pg.start()
    patroni: PatroniFaults | None = None
    hosts: list[ServerProcess] = []
    transformer: Transformer | None = None
    load: Load | None = None
    doors: KafkaDoors | None = None
    began = time.monotonic()
    phases: list[str] = []

    def mark(what: str) -> None:
        phases.append(f"{time.monotonic() - began:6.1f} s  {what}")

    try:
        if cluster is not None:
            cluster.start()
            leader, _standby = cluster.healthy()
            migrate.upgrade(leader.admin_url(DATABASE))
            db_url = cluster.url
        else:
            assert pg is not None
            migrate.upgrade(pg.url)
            db_url = pg.url
        hosts = [ServerProcess(db_url, workers=2, env=ENV, log_path=tmp_path / f"server-{i}.log") for i in range(2)]
        doors = KafkaDoors(db_url, tmp_path, SECONDS, SEED)
        start_together([*hosts, *doors.gateways])
        with httpx.Client(base_url=hosts[0].url, timeout=30) as api:
            for topic in ("in", "out"):
                assert api.post("/v1/topics", json={"name": topic, "partitions": PARTITIONS}).status_code == 201
        with (
            LossyProxy(hosts[0].port, drop_answer=0.05, seed=SEED) as producer_proxy,
            LossyProxy(hosts[1].port, drop_answer=0.05, seed=SEED + 1) as transformer_proxy,
        ):
            doors.start()
            load = Load(hosts, producer_proxy.url)
            transformer = Transformer(transformer_proxy.url, tmp_path)
            transformer.spawn()
            load.start()
            doors.wait_delivering(0, 90)
            mark("every client working")
            faults = Faults(pg, hosts, transformer, rng)
            if cluster is not None:
                patroni = PatroniFaults(cluster, random.Random(SEED + 2), doors.wait_delivering)
                for kind, inject in patroni.kinds().items():
                    faults.add(kind, inject)
            kafka_faults = Faults(pg, hosts, transformer, random.Random(SEED + 1), doors.gateways, faults.started)
            try:
                with ThreadPoolExecutor(1) as lane:
                    kafka_run = lane.submit(kafka_faults.run, SECONDS, lambda since: doors.wait_delivering(since, 90))
                    faults.run(SECONDS, lambda since: doors.wait_delivering(since, 90))
                    kafka_run.result()
                injected = sorted(faults.injected + kafka_faults.injected)
                mark("the faults over")

                # Faults stop. The producers finish; the copiers and the transforming process drain
                # their inputs.
                load.stop.set()
                doors.stop_producers()
                doors.release_tail()
                mark("the Kafka producers finished, the copiers' last input written")
                for t in load.threads[:PRODUCERS]:
                    t.join(180)
                    assert not t.is_alive(), "a producer did not finish"
                mark("the HTTP producers finished")
                url = hosts[0].url
                with httpx.Client(base_url=url, timeout=30) as api:

                    def group_offsets(group: str, topic: str) -> dict[int, int]:
                        offsets = api.get(f"/v1/groups/{group}/offsets").json()["offsets"]
                        return {o["partition"]: o["offset"] for o in offsets if o["topic"] == topic}

                    doors.wait_copied(lambda: [group_offsets(f"copier-{c.name}", c.input) for c in doors.copiers])
                    mark("the Kafka copiers done")
                    if not transformer.live():
                        transformer.spawn()
                    in_end = {}
                    for p in range(PARTITIONS):
                        in_end[p] = api.get("/v1/topics/in").json()["partitions"][p]["high_watermark"]

                    def undrained() -> int:
                        got = group_offsets(GROUP, "in")
                        return sum(max(0, in_end[p] - got.get(p, 0)) for p in range(PARTITIONS))

                    # The backlog left when the faults stop depends on the load and the machine (under
                    # `make chaos` it can be 10^5 records): wait while the transforming process works
                    # through it, and fail if it stops.
                    wait_while_progressing(undrained, 90, 0.5, "the transforming process consuming all of its input")
                    mark("the transforming process done")
                    transformer.kill_all()
                    answers_lost = producer_proxy.dropped_answers + transformer_proxy.dropped_answers
                    kafka_answers_lost = sum(p.dropped_answers for p in doors.proxies)

                    def stable() -> bool:
                        topics = [t["name"] for t in api.get("/v1/topics").json()["topics"]]
                        parts = [p for t in topics for p in api.get(f"/v1/topics/{t}").json()["partitions"]]
                        return all(p["last_stable_offset"] == p["high_watermark"] for p in parts)

                    wait_until(stable, 60, 0.5, "the last stable offset to catch up with the high watermark")
                    committed_out = {p: fetch_all(url, "out", p, "read_committed") for p in range(PARTITIONS)}
                    final, aborted = read_log(db_url)
                    history = History(
                        acked={
                            **{log.name: {v: ("in", p, o) for v, (p, o) in log.acked.items()} for log in load.logs},
                            **{a.name: {v: (ACKS, p, o) for v, (p, o) in a.acked.items()} for a in doors.load.producers.values()},
                        },
                        produced={
                            **{log.name: len(log.produced) for log in load.logs},
                            **{a.name: len(a.acked) + len(a.failed) for a in doors.load.producers.values()},
                        },
                        copiers=[
                            CopierHistory(
                                "upper (HTTP)",
                                "in",
                                "out",
                                group_offsets(GROUP, "in"),
                                lambda _p, _o, v: v.upper(),
                                *transactions(db_url, TID),
                            ),
                            *doors.copier_histories(group_offsets, lambda tid: transactions(db_url, tid)),
                        ],
                        aborted=aborted,
                        log=final,
                        faults=injected,
                        followed={"http follower": {"out"}, **{f"kafka {name}": set(doors.followed) for name in doors.polls}},
                    )

                    def read_everything() -> int:
                        """What the consumers still have to read."""
                        behind = 0
                        for consumer, topics in history.followed.items():
                            polls = load.polls if consumer == "http follower" else doors.polls[consumer.removeprefix("kafka ")]
                            places = {(p.topic, p.partition, p.offset) for p in polls}
                            behind += sum(
                                1
                                for (t, p), records in final.items()
                                if t in topics
                                for o, _ in records
                                if (t, p, o) not in places
                            )
                        return behind

                    wait_while_progressing(read_everything, 60, 0.5, "every consumer to read every committed record")
                    mark("every consumer at the end")
                load.stop_following.set()
                load.threads[-1].join(30)
                doors.stop_consumers()
                history.polls = {"http follower": [load.polls], **{f"kafka {n}": [p] for n, p in doors.polls.items()}}
                result = checker.check(history)
                print("phases:\n" + "\n".join(phases))
                print(checker.summary(history, result))
                if patroni is not None:
                    print(patroni.summary())
                print(
                    f"answers lost by the proxies: {answers_lost} HTTP, {kafka_answers_lost} Kafka; "
                    f"{transformer.started} transforming processes; {'; '.join(doors.restarts) or 'no copier started again'}"
                )
                assert result.ok(), f"anomalies (seed {SEED}):\n{result.report()}"
                checked = check(db_url, url, load, in_end, committed_out)
            except AssertionError as exc:
                raise AssertionError(
                    f"{exc}\nTXLOG_CHAOS_SEED={SEED}\nphases:\n"
                    + "\n".join(phases)
                    + "\nfaults:\n"
                    + "\n".join(f"{t:6.1f} s  {w}" for t, w in sorted(faults.injected + kafka_faults.injected))
                    + f"\n{doors.diagnosis()}"
                    + (f"\n{cluster.logs()}" if cluster is not None else "")
                ) from None
        print(
            f"HTTP load: {sum(len(l.acked) for l in load.logs)} records acknowledged to 'in' by {PRODUCERS} idempotent producers "
            f"(+{sum(len(l.failed) for l in load.logs)} failed: {sum((l.errors for l in load.logs), Counter())}, producers replaced after {[f for l in load.logs for f in l.replaced][:3]}), {checked['transactions']} transactions committed by "
            f"{transformer.started} transforming processes, {checked['read']} records followed read_committed"
        )
        print("invariants held: " + "; ".join(checked["invariants"]))
    finally:
        if load is not None:
            load.stop.set()
            load.stop_following.set()
        if doors is not None:
            doors.consumers_stop.set()
            doors.close()
        if transformer is not None:
            transformer.kill_all()
        for h in hosts:
            with contextlib.suppress(Exception):
                h.signal_group(signal.SIGCONT)
            h.kill()
        if pg is not None:
            destroy_embedded(pg)
        if cluster is not None:
            cluster.stop()


def start_together(processes: list[TxlogProcess]) -> None:
    """Start every process at once and wait for each to be ready (one after the other, a loaded
    machine takes a minute)."""
    with ThreadPoolExecutor(len(processes)) as pool:
        for started in [pool.submit(p.start) for p in processes]:
            started.result()


def read_log(db_url: str) -> tuple[dict[tuple[str, int], list[tuple[int, str]]], set[tuple[str, int, int]]]:
    """Every topic's log as read_committed (every transaction ended), and its aborted records."""
    final: dict[tuple[str, int], list[tuple[int, str]]] = defaultdict(list)
    with psycopg.connect(db_url) as conn:
        for topic, partition, offset, value in conn.execute(
            "SELECT topic, partition, \"offset\", convert_from(value, 'UTF8') FROM txlog.committed_records "
            'ORDER BY topic, partition, "offset"'
        ):
            final[(topic, partition)].append((offset, value))
        aborted = {
            (t, p, o)
            for t, p, o in conn.execute(
                'SELECT topic, partition, "offset" FROM txlog.log_records WHERE aborted AND control_type IS NULL'
            )
        }
    return dict(final), aborted


def transactions(db_url: str, transactional_id: str) -> tuple[int, int]:
    """How many transactions of ``transactional_id`` committed, and how many aborted."""
    with psycopg.connect(db_url) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE to_state = 'CompleteCommit'), count(*) FILTER (WHERE to_state = 'CompleteAbort') "
            "FROM txlog.transaction_events WHERE transactional_id = %s",
            (transactional_id,),
        ).fetchone()
    assert row is not None
    return row[0], row[1]


def check(db_url: str, url: str, load: Load, in_end: dict[int, int], committed_out: dict[int, list[dict]]) -> dict:
    invariants: list[str] = []
    with psycopg.connect(db_url) as conn:
        rows = conn.execute(
            "SELECT topic, partition, \"offset\", convert_from(value, 'UTF8'), producer_id, sequence, control_type "
            "FROM txlog.records WHERE topic IN ('in', 'out') ORDER BY topic, partition, \"offset\""
        ).fetchall()
        status = {
            (t, p): (ls, hw)
            for t, p, ls, hw in conn.execute(
                "SELECT topic, partition, log_start_offset, high_watermark FROM txlog.partition_status"
            )
        }
        transactions = conn.execute(
            "SELECT count(*) FROM txlog.transaction_events WHERE transactional_id = %s AND to_state = 'CompleteCommit'", (TID,)
        ).fetchone()[0]

    # Dense offsets: every offset from the log start to the high watermark is there, once.
    by_partition: dict[tuple[str, int], list[int]] = defaultdict(list)
    for topic, partition, offset, *_ in rows:
        by_partition[(topic, partition)].append(offset)
    for key, (log_start, hw) in status.items():
        if key[0] in ("in", "out"):
            assert by_partition.get(key, []) == list(range(log_start, hw)), f"offsets of {key} are not dense"
    invariants.append("dense offsets")

    # Every acknowledged record exactly once, where it was acknowledged; nothing written twice.
    data_in = [(p, o, v) for t, p, o, v, _pid, _seq, ct in rows if t == "in" and ct is None]
    where: dict[str, tuple[int, int]] = {}
    for p, o, v in data_in:
        assert v not in where, f"{v} appended twice: at {where[v]} and {(p, o)}"
        where[v] = (p, o)
    produced = {v for log in load.logs for v in log.produced}
    assert set(where) <= produced, "records nobody produced"
    for log in load.logs:
        for value, at in log.acked.items():
            assert where.get(value) == at, f"acknowledged {value} at {at}, found at {where.get(value)}"
    invariants.append("every acknowledged record present exactly once, nothing duplicated")

    # Per-producer order: within a partition, a producer's records are in the order it produced them.
    for log in load.logs:
        rank = {v: i for i, v in enumerate(log.produced)}
        per_partition: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for v in log.produced:
            if v in where:
                p, o = where[v]
                per_partition[p].append((o, rank[v]))
        for p, pairs in per_partition.items():
            ranks = [r for _, r in sorted(pairs)]
            assert ranks == sorted(ranks), f"{log.name}'s records out of order on in-{p}"
    invariants.append("per-producer order")

    # The output as read_committed: each input record transformed exactly once, nothing else.
    sources: dict[str, str] = {}
    for records in committed_out.values():
        for r in records:
            source = r["headers"].get("source")
            assert source not in sources, f"input {source} transformed twice"
            sources[source] = r["value"]
    expected = {f"in:{p}:{o}": v.upper() for p, o, v in data_in}
    assert sources == expected, (
        f"output differs from the input: missing {len(expected.keys() - sources.keys())}, "
        f"unexpected {len(sources.keys() - expected.keys())}"
    )
    invariants.append("each input transformed exactly once in the read_committed output, nothing aborted or partial visible")

    # The group's offsets at the end of the input, matching the output.
    with httpx.Client(base_url=url, timeout=30) as api:
        got = {
            o["partition"]: o["offset"] for o in api.get(f"/v1/groups/{GROUP}/offsets").json()["offsets"] if o["topic"] == "in"
        }
    assert got == {p: in_end[p] for p in range(PARTITIONS)}, (got, in_end)
    invariants.append("group offsets match the outputs")

    # The follower: never backwards, never past a committed record.
    assert not load.consumer_problems, load.consumer_problems
    read = 0
    for p in range(PARTITIONS):
        seen = load.seen[p]
        offsets = [o for o, _ in seen]
        assert offsets == sorted(set(offsets)), f"the read_committed consumer went backwards or repeated on out-{p}"
        final = [(r["offset"], r["headers"].get("source")) for r in committed_out[p]]
        assert seen == final[: len(seen)], f"the read_committed consumer skipped or saw something else on out-{p}"
        read += len(seen)
    invariants.append("the read_committed consumer never went backwards nor skipped a committed record")
    invariants.append("last stable offset caught up with the high watermark")
    return {"invariants": invariants, "transactions": transactions, "read": read}
