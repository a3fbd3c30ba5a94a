"""A share group (KIP-932's queue on the log) under faults: every committed record settled once, by an
acknowledgement the server took or by archiving with its reason; nothing aborted ever delivered.

Two Kafka gateways (``txlog kafka``) and two HTTP servers (``txlog serve``) share one PostgreSQL
database: a fresh one of the run's server, cloned from the migrated template (no fault here stops
PostgreSQL, so the test needs no server of its own to start and migrate).
Worker processes (``tests/chaos/share_worker.py``) consume one topic of several partitions through
ONE share group, some with confluent-kafka's ShareConsumer through the gateways, some with txlog's
ShareConsumer over HTTP. Each decides from a record's value and delivery count alone: most are
accepted, some released at their first delivery (accepted at the next), some rejected, and some are
poison, released at every delivery until the delivery-count limit archives them. A transactional
producer writes the records, a quarter of its transactions aborted; the group reads
read_committed with a short record lock and a small delivery-count limit.

Meanwhile workers are killed with ``kill -9`` (and started again), frozen with SIGSTOP for longer
than the record lock (then SIGCONT: what they acknowledge late must be refused), and a gateway or
an HTTP server is killed with ``kill -9`` and started again on its port.

The contract checked is share groups' at-least-once delivery: a record may be delivered, and
processed, more than once — its holder killed or frozen before its acknowledgement reached the
server, its lock expired, or the answer to its acknowledgement lost — and each redelivery counts one
more delivery. What counts is the acknowledgement the server took, never the processing. So, for
every committed record, with "settled" meaning that the server will never deliver it again:

- **accepted exactly once** means that exactly one ACCEPT of it was taken by the server (a worker
  was told so, or — its answer lost to a kill — it was the last delivery's and nothing delivered
  the record again), and that no delivery came after it; a REJECT likewise archives it (reason:
  rejected). Never an ACCEPT and a REJECT, never two taken;
- otherwise it was **archived at the delivery-count limit**: its last delivery was the limit's
  (released then, or its lock expired) — always the case of a poison record;
- an acknowledgement the server refused (a frozen worker's, after its lock expired) counts for
  nothing: the record was delivered again or archived at the limit;
- no delivery beyond the limit; no record of an aborted transaction (nor a control record) ever
  acquired, by any member; and when the run ends every share partition's start offset is at the
  log's end with nothing in flight.

A worker killed after processing a record but before the server took its acknowledgement (or
frozen until its lock expired) processed it for nothing: the record comes back once the lock
expires, one delivery more, and is processed again — at least once, never "exactly once"
processing. Redeliveries, records processed again, refused and unanswered acknowledgements are
counted and printed as information, not failures. An acknowledgement of records another member
settled meanwhile is refused too (INVALID_RECORD_STATE): answered as taken, its worker would
believe that its decision was the record's fate.

Deliveries are read from the database, not only from the workers: the test adds a trigger on
``txlog.share_in_flight`` recording every row written (each acquisition writes its records as
Acquired, with the member, the lock deadline and the delivery count), since the share partition's
state keeps nothing of a record once its start offset moved past it.

``TXLOG_SHARE_CHAOS_SECONDS`` sets how long faults are injected (``make chaos`` runs longer) and
``TXLOG_SHARE_CHAOS_SEED`` replays a run's faults; a failing run prints its seed.
"""

from __future__ import annotations

import contextlib
import json
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
from typing import Any

import httpx
import psycopg
import pytest

from tests.chaos.share_worker import ACCEPT, REJECT, RELEASE, decide, kind_of
from tests.kafka.conftest import GatewayProcess
from tests.support import ROOT, ServerProcess, wait_while_progressing

pytestmark = pytest.mark.slow

SECONDS = float(os.environ.get("TXLOG_SHARE_CHAOS_SECONDS", "10"))
SEED = int(os.environ.get("TXLOG_SHARE_CHAOS_SEED", str(random.randrange(1 << 30))))
TOPIC, GROUP = "jobs", "workers"
PARTITIONS = 3
LOCK_MS = 2_500  # share.record.lock.duration.ms
LIMIT = 3  # share.delivery.count.limit
KAFKA_WORKERS, HTTP_WORKERS = 2, 2
TRANSACTION_RECORDS = 6
ENV = {
    "TXLOG_SHARE_MIN_RECORD_LOCK_DURATION_MS": "1000",
    "TXLOG_KAFKA_NODE_LEASE_MS": "3000",
    "TXLOG_TRANSACTION_ABORT_CHECK_INTERVAL_MS": "300",
}

# Every row the server writes to txlog.share_in_flight, kept: the deliveries as the database saw them.
AUDIT = """
CREATE SCHEMA share_audit;
CREATE TABLE share_audit.in_flight (
    id bigserial PRIMARY KEY, group_id text, topic text, partition int, first_offset bigint, last_offset bigint,
    state smallint, member_id text, lock_deadline_ms bigint, delivery_count int, at timestamptz DEFAULT clock_timestamp()
);
CREATE FUNCTION share_audit.keep() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO share_audit.in_flight (group_id, topic, partition, first_offset, last_offset, state, member_id,
                                       lock_deadline_ms, delivery_count)
    VALUES (NEW.group_id, NEW.topic, NEW.partition, NEW.first_offset, NEW.last_offset, NEW.state, NEW.member_id,
            NEW.lock_deadline_ms, NEW.delivery_count);
    RETURN NULL;
END $$;
CREATE TRIGGER keep AFTER INSERT OR UPDATE ON txlog.share_in_flight FOR EACH ROW EXECUTE FUNCTION share_audit.keep();
"""
ACQUIRED = 1


def kind_for(n: int) -> str:
    """The kind of the ``n``-th value: accept mostly, then release-once, reject and poison."""
    r = n % 20
    return "poison" if r == 7 else "reject" if r in (3, 13) else "release-once" if r in (1, 5, 11, 17) else "accept"


# --- the processes --------------------------------------------------------------------------------


class Worker:
    """One worker process, started again after each kill; its log is kept across its lives."""

    def __init__(self, name: str, way: str, address: str, log_dir: Path) -> None:
        self.name, self.way, self.address = name, way, address
        self.log_path = log_dir / f"{name}.jsonl"
        self.out_path = log_dir / f"{name}.out"
        self.proc: subprocess.Popen[bytes] | None = None
        self.lives = 0
        self.killed = False
        self.crashes: list[str] = []  # each time it ended other than by a kill

    def note_crash(self) -> None:
        """If its process ended other than by a kill, say so (once)."""
        if self.proc is not None and not self.killed and self.proc.poll() is not None:
            self.crashes.append(f"exit {self.proc.returncode}: {self.output()[-1000:]}")
            self.killed = True

    def start(self) -> None:
        self.note_crash()
        self.lives += 1
        self.killed = False
        with open(self.out_path, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.chaos.share_worker", self.way, self.address, GROUP, TOPIC, str(self.log_path)],
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            assert self.proc is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def wait_stopped(self) -> float:
        """Wait until SIGSTOP has stopped the process (state T); the time then."""
        assert self.proc is not None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and self.alive():
            with contextlib.suppress(OSError):
                stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
                if stat[stat.rindex(")") + 2] in "Tt":
                    break
            time.sleep(0.001)
        return time.time()

    def kill(self) -> None:
        if self.proc is not None:
            self.killed = self.killed or self.proc.poll() is None
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGKILL)
            self.proc.wait(30)

    def output(self) -> str:
        return self.out_path.read_text(errors="replace")[-2000:] if self.out_path.exists() else ""


@dataclass
class Produced:
    """What the producer was told of its transactions."""

    committed: list[str] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)  # a commit or abort that raised: the log decides
    errors: Counter = field(default_factory=Counter)


class Load:
    """A transactional producer writing ``<n>:<kind>`` values through the gateways, a quarter of its
    transactions aborted, until stopped."""

    def __init__(self, bootstrap: str, rng: random.Random) -> None:
        self.bootstrap = bootstrap
        self.rng = random.Random(rng.random())
        self.stop = threading.Event()
        self.produced = Produced()
        self.failure: list[str] = []
        self.thread = threading.Thread(target=self._guarded, daemon=True, name="share-producer")

    def _guarded(self) -> None:
        try:
            self._run()
        except Exception as exc:  # the test fails with it
            self.failure.append(repr(exc))

    def _producer(self) -> Any:
        from confluent_kafka import Producer

        p = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "transactional.id": "share-chaos-producer",
                "linger.ms": 5,
                "metadata.recovery.strategy": "none",
                "transaction.timeout.ms": 20_000,
            }
        )
        p.init_transactions(60)
        return p

    def _run(self) -> None:
        from confluent_kafka import KafkaException

        p, n = self._producer(), 0
        while not self.stop.is_set():
            values = [f"{n + i}:{kind_for(n + i)}" for i in range(TRANSACTION_RECORDS)]
            n += TRANSACTION_RECORDS
            abort = self.rng.random() < 0.25
            try:
                p.begin_transaction()
                for i, v in enumerate(values):
                    p.produce(TOPIC, v.encode(), partition=(n + i) % PARTITIONS)
                if abort:
                    p.abort_transaction(30)
                    self.produced.aborted += values
                else:
                    p.commit_transaction(30)
                    self.produced.committed += values
            except KafkaException as exc:
                error = exc.args[0]
                self.produced.errors[error.name()] += 1
                self.produced.unknown += values
                if error.fatal():
                    p = self._producer()
                elif error.txn_requires_abort():
                    with contextlib.suppress(KafkaException):
                        p.abort_transaction(30)
                else:  # retriable: the transaction's end is unknown; the next init fences it
                    p = self._producer()
            time.sleep(0.05)


def wait_for_intents(w: Worker, timeout: float) -> list[dict]:
    """Watch ``w``'s log until it ends with acknowledgement intents (a batch decided, its
    acknowledgements not sent yet: the worker is processing it): those intents, or [] if it never
    did within ``timeout`` (nothing to consume, or the worker not running)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            with open(w.log_path, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - 65_536))
                lines = f.read().decode(errors="replace").split("\n")
            if lines and lines[-1] == "":  # complete lines only
                tail = []
                for line in reversed(lines[:-1]):
                    with contextlib.suppress(ValueError):
                        entry = json.loads(line)
                        if entry.get("e") == "ack":
                            tail.append(entry)
                            continue
                    break
                if tail:
                    return tail[::-1]
        time.sleep(0.005)
    return []


class Faults:
    def __init__(
        self, workers: list[Worker], gateways: list[GatewayProcess], servers: list[ServerProcess], rng: random.Random
    ) -> None:
        self.workers, self.gateways, self.servers, self.rng = workers, gateways, servers, rng
        self.injected: list[str] = []
        # each worker frozen: its name, the intents it had logged and not yet sent, when it was stopped
        self.frozen: list[tuple[str, list[dict], float]] = []

    def kill_worker(self) -> None:
        w = self.rng.choice(self.workers)
        w.kill()
        time.sleep(self.rng.uniform(0.1, 1.0))
        w.start()
        self.injected.append(f"kill -9 {w.name}, restarted")

    def freeze_worker(self) -> None:
        """Frozen mid-batch — its decisions logged, its acknowledgements not sent — for longer than
        the records' lock: they go to others, and what it acknowledges on waking must be refused."""
        w = self.rng.choice(self.workers)
        pending = wait_for_intents(w, 10)
        w.signal(signal.SIGSTOP)
        stopped = w.wait_stopped()  # from here on, whatever it does it does after waking
        pause = LOCK_MS / 1000 + self.rng.uniform(1.0, 2.0)
        time.sleep(pause)
        w.signal(signal.SIGCONT)
        self.frozen.append((w.name, pending, stopped))
        self.injected.append(f"SIGSTOP {w.name} for {pause:.1f} s{' mid-batch' if pending else ''}")

    def kill_gateway(self) -> None:
        g = self.rng.choice(self.gateways)
        g.stop(signal.SIGKILL)
        time.sleep(self.rng.uniform(0.2, 1.0))
        g.start()
        self.injected.append(f"kill -9 gateway {g.node_id}, restarted")

    def kill_server(self) -> None:
        s = self.rng.choice(self.servers)
        s.kill()
        time.sleep(self.rng.uniform(0.2, 1.0))
        s.start()
        self.injected.append(f"kill -9 HTTP server :{s.port}, restarted")

    def run(self, seconds: float) -> None:
        actions = [self.kill_worker, self.freeze_worker, self.kill_gateway, self.kill_server]
        order = actions[:]
        self.rng.shuffle(order)
        deadline = time.monotonic() + seconds
        while order or time.monotonic() < deadline:  # every kind at least once, however short the run
            (order.pop() if order else self.rng.choice(actions))()
            time.sleep(self.rng.uniform(0.5, 1.5))


# --- the test -------------------------------------------------------------------------------------


def test_share_group_settles_every_committed_record_once_under_faults(db_url: str, tmp_path: Path) -> None:
    rng = random.Random(SEED)
    print(f"\nshare group faults: seed {SEED}, faults for {SECONDS:.0f} s")
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(AUDIT)
    gateways = [GatewayProcess(db_url, env=ENV, log_path=tmp_path / f"gateway-{n}.log", node_id=n) for n in (1, 2)]
    servers = [ServerProcess(db_url, env=ENV, log_path=tmp_path / f"server-{n}.log") for n in (1, 2)]
    with contextlib.ExitStack() as stack:
        for process in (*gateways, *servers):
            stack.callback(lambda p=process: p.kill() if isinstance(p, ServerProcess) else p.stop(signal.SIGKILL))
        with ThreadPoolExecutor(4) as starting:  # each waits until it serves: together, not in turn
            list(starting.map(lambda p: p.start(), (*gateways, *servers)))
        bootstrap = ",".join(g.bootstrap for g in gateways)
        with httpx.Client(base_url=servers[0].url, timeout=30) as api:
            assert api.post("/v1/topics", json={"name": TOPIC, "partitions": PARTITIONS}).status_code == 201
            configs = {
                "share.auto.offset.reset": "earliest",
                "share.isolation.level": "read_committed",
                "share.record.lock.duration.ms": str(LOCK_MS),
                "share.delivery.count.limit": str(LIMIT),
            }
            answer = api.patch(f"/v1/share-groups/{GROUP}/configs", json={"configs": configs})
            assert answer.status_code == 200, answer.text
        workers = [Worker(f"kafka-{i}", "kafka", bootstrap, tmp_path) for i in range(KAFKA_WORKERS)] + [
            Worker(f"http-{i}", "http", servers[i % len(servers)].url, tmp_path) for i in range(HTTP_WORKERS)
        ]
        for w in workers:
            stack.callback(w.kill)
            w.start()
        load = Load(bootstrap, rng)
        stack.callback(load.stop.set)
        load.thread.start()

        faults = Faults(workers, gateways, servers, rng)
        started = time.monotonic()
        faults.run(SECONDS)
        load.stop.set()
        load.thread.join(120)
        assert not load.thread.is_alive() and not load.failure, f"the producer: {load.failure}"
        for w in workers:  # every worker running, none frozen, while the group drains
            w.signal(signal.SIGCONT)
            if not w.alive():
                w.start()

        def unsettled() -> int:
            with psycopg.connect(db_url) as conn:
                return unsettled_records(conn)

        try:
            wait_while_progressing(unsettled, 60, 0.5, "every share partition's records settled")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{diagnosis(workers, gateways, servers, faults)}") from None
        drained = time.monotonic() - started
        for w in workers:
            w.note_crash()
            w.kill()
        crashes = [f"WORKER ENDED: {w.name}, {crash}" for w in workers for crash in w.crashes]
        with psycopg.connect(db_url) as conn:
            state = read_state(conn)
    report = check(state, [w.name for w in workers], [read_log(w.log_path) for w in workers], load.produced, faults.frozen)
    print(
        f"load: {len(load.produced.committed)} records committed, {len(load.produced.aborted)} aborted, "
        f"{len(load.produced.unknown)} of transactions whose end the producer was not told ({dict(load.produced.errors)})"
    )
    print("faults: " + "; ".join(faults.injected))
    print(f"workers: {', '.join(f'{w.name} ({w.lives} lives)' for w in workers)}; drained {drained:.0f} s after the start")
    print("information: " + "; ".join(f"{k}: {v}" for k, v in report.information.items()))
    anomalies = crashes + report.anomalies
    assert not anomalies, f"{len(anomalies)} anomalies (seed {SEED}):\n" + "\n".join(anomalies[:60])
    print("invariants held: " + "; ".join(report.invariants))


def diagnosis(workers: list[Worker], gateways: list[GatewayProcess], servers: list[ServerProcess], faults: Faults) -> str:
    return "\n".join(
        [f"seed {SEED}; faults: {'; '.join(faults.injected)}"]
        + [f"--- {w.name} (alive {w.alive()}):\n{w.output()}" for w in workers]
        + [f"--- gateway {g.node_id}:\n{g.log()[-2000:]}" for g in gateways]
        + [f"--- server :{s.port}:\n{s.log_path.read_text(errors='replace')[-2000:] if s.log_path else ''}" for s in servers]
    )


# --- the state read back --------------------------------------------------------------------------


def unsettled_records(conn: psycopg.Connection) -> int:
    """Records not yet done for the group: the log's end (past every transaction: the high
    watermark once none is open) less each share partition's start offset, plus the records in
    flight."""
    rows = conn.execute(
        "SELECT s.partition, s.high_watermark, s.open_transactions, coalesce(p.start_offset, 0) "
        "FROM txlog.partition_status s LEFT JOIN txlog.share_partitions p "
        "ON p.topic = s.topic AND p.partition = s.partition AND p.group_id = %s WHERE s.topic = %s",
        (GROUP, TOPIC),
    ).fetchall()
    in_flight = conn.execute(
        "SELECT coalesce(sum(records), 0) FROM txlog.share_in_flight_records WHERE group_id = %s AND topic = %s", (GROUP, TOPIC)
    ).fetchone()
    assert in_flight is not None
    return sum(max(0, hw - start) + open_transactions for _, hw, open_transactions, start in rows) + int(in_flight[0])


@dataclass
class State:
    """What the database says at the end."""

    records: dict[tuple[int, int], tuple[str | None, bool, bool]]  # (partition, offset) -> (value, control, aborted)
    partitions: dict[int, tuple[int, int, int]]  # partition -> (share start offset, high watermark, last stable offset)
    in_flight: list[tuple]  # txlog.share_in_flight_records rows left
    # (partition, offset) -> each acquisition: (epoch s written, member, lock deadline ms, delivery count), in order
    deliveries: dict[tuple[int, int], list[tuple[float, str, int, int]]]


def read_state(conn: psycopg.Connection) -> State:
    records = {
        (p, o): (None if v is None else bytes(v).decode(), control is not None, aborted)
        for p, o, v, control, aborted in conn.execute(
            'SELECT partition, "offset", value, control_type, aborted FROM txlog.log_records WHERE topic = %s', (TOPIC,)
        )
    }
    partitions = {
        p: (start, hw, lso)
        for p, start, hw, lso in conn.execute(
            "SELECT s.partition, p.start_offset, s.high_watermark, s.last_stable_offset FROM txlog.partition_status s "
            "JOIN txlog.share_partitions p ON p.topic = s.topic AND p.partition = s.partition AND p.group_id = %s "
            "WHERE s.topic = %s",
            (GROUP, TOPIC),
        )
    }
    in_flight = conn.execute(
        "SELECT partition, first_offset, last_offset, state, delivery_count, lock_holder FROM txlog.share_in_flight_records "
        "WHERE group_id = %s AND topic = %s",
        (GROUP, TOPIC),
    ).fetchall()
    deliveries: dict[tuple[int, int], list[tuple[float, str, int, int]]] = defaultdict(list)
    seen: set[tuple[int, int, str, int, int]] = set()
    for at, p, first, last, member, deadline, count in conn.execute(
        "SELECT extract(epoch FROM at)::float8, partition, first_offset, last_offset, member_id, lock_deadline_ms, delivery_count "
        "FROM share_audit.in_flight WHERE group_id = %s AND topic = %s AND state = %s ORDER BY id",
        (GROUP, TOPIC, ACQUIRED),
    ):
        for o in range(first, last + 1):
            # An acquisition is one (member, lock deadline, count): rows rewritten when a range is
            # split or merged carry the same, and are the same delivery.
            if (p, o, member, deadline, count) not in seen:
                seen.add((p, o, member, deadline, count))
                deliveries[(p, o)].append((at, member, deadline, count))
    return State(records, partitions, in_flight, dict(deliveries))


def read_log(path: Path) -> list[dict]:
    """A worker's log. A line cut short by a kill -9 mid-write is dropped: an intent cut so was
    never sent (the worker died writing it), a result cut so counts as unanswered."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        if line:
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
    return out


# --- the checker ----------------------------------------------------------------------------------


def clock(epoch_s: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(epoch_s)) + f".{int(epoch_s * 1000) % 1000:03d}"


@dataclass
class Report:
    anomalies: list[str] = field(default_factory=list)
    invariants: list[str] = field(default_factory=list)
    information: dict[str, Any] = field(default_factory=dict)


def check(
    state: State, names: list[str], logs: list[list[dict]], produced: Produced, frozen: list[tuple[str, list[dict], float]]
) -> Report:
    """Every committed record settled once, as the module's docstring defines it; each anomaly
    named, with the record (partition@offset 'value') and what happened to it. ``logs`` are the
    workers' logs, ``names`` their names (``kafka-…`` or ``http-…``), ``frozen`` each worker frozen
    mid-batch with the acknowledgements it had decided but not sent, and when it was stopped."""
    report = Report()
    bad = report.anomalies

    def name(key: tuple[int, int]) -> str:
        value = state.records.get(key, (None, False, False))[0]
        return f"{TOPIC}-{key[0]}@{key[1]} {value!r}"

    def history(key: tuple[int, int]) -> str:
        got = [f"w{w}:{e['e']}(dc={e['dc']}{',' + e['t'] if 't' in e else ''}{',' + e['r'] if 'r' in e else ''} {clock(e['ts'])})"
               for w, e in by_record.get(key, [])]  # fmt: skip
        acquired = [
            f"dc={c} by {m[:8]} {clock(at)} locked to {clock(deadline / 1000)}"
            for at, m, deadline, c in state.deliveries.get(key, [])
        ]
        return f"deliveries in the database: {acquired or 'none'}; in the workers' logs: {got or 'none'}"

    committed = {k for k, (v, control, aborted) in state.records.items() if not control and not aborted}
    aborted = {k for k, (v, control, aborted) in state.records.items() if not control and aborted}
    controls = {k for k, (v, control, _) in state.records.items() if control}

    # The producer's view agrees with the log's.
    committed_values = {state.records[k][0] for k in committed}
    for v in produced.committed:
        if v not in committed_values:
            bad.append(f"COMMIT LOST: {v!r} was in a transaction whose commit was acknowledged, not committed in the log")
    for v in produced.aborted:
        if v in committed_values:
            bad.append(f"ABORT IGNORED: {v!r} was in a transaction aborted, committed in the log")
    report.invariants.append("the log's committed and aborted records are the producer's")

    # The end state: every share partition past the log's end, nothing in flight.
    for p, (start, hw, lso) in sorted(state.partitions.items()):
        if not start == hw == lso:
            bad.append(f"NOT SETTLED: {TOPIC}-{p}'s share start offset {start}, high watermark {hw}, last stable offset {lso}")
    if set(state.partitions) != set(range(PARTITIONS)):
        bad.append(f"NOT SETTLED: share partitions {sorted(state.partitions)} of {PARTITIONS}")
    for row in state.in_flight:
        bad.append(f"LEFT IN FLIGHT: {row}")
    report.invariants.append("every share partition's start offset at the log's end, nothing in flight")

    # The workers' logs, by record.
    by_record: dict[tuple[int, int], list[tuple[int, dict]]] = defaultdict(list)
    for w, entries in enumerate(logs):
        for e in entries:
            if e["e"] in ("got", "ack", "res"):
                key = (e["p"], e["o"])
                by_record[key].append((w, e))
                if e["e"] == "got" and (key not in state.records or state.records[key][0] != e["v"]):
                    bad.append(
                        f"NOT IN THE LOG: worker {w} was given {e['v']!r} at {TOPIC}-{key[0]}@{key[1]}, which holds {name(key)}"
                    )

    # Nothing aborted, no control record, ever acquired; no delivery beyond the limit.
    for key in sorted(aborted | controls):
        if state.deliveries.get(key) or any(e["e"] == "got" for _, e in by_record.get(key, [])):
            what = "an aborted transaction's record" if key in aborted else "a control record"
            bad.append(f"ABORTED DELIVERED: {name(key)} is {what}, yet was acquired: {history(key)}")
    for key, acquired in sorted(state.deliveries.items()):
        over = [c for *_, c in acquired if c > LIMIT] + [e["dc"] for _, e in by_record.get(key, []) if e["dc"] > LIMIT]
        if over:
            bad.append(f"OVER THE LIMIT: {name(key)} delivered with count {max(over)} > {LIMIT}: {history(key)}")
    report.invariants.append(f"no aborted or control record acquired; no delivery count above {LIMIT}")

    fates: Counter = Counter()
    redelivered = processed_again = unanswered_count = 0
    for key in sorted(committed):
        value = state.records[key][0]
        assert value is not None
        entries = [e for _, e in by_record.get(key, [])]
        acquired = state.deliveries.get(key, [])
        taken = [e for e in entries if e["e"] == "res" and e["r"] == "ok" and e["t"] in (ACCEPT, REJECT)]
        answered = {(e["pid"], e["dc"], e["t"]) for e in entries if e["e"] == "res"}
        unanswered = [e for e in entries if e["e"] == "ack" and (e["pid"], e["dc"], e["t"]) not in answered]
        lost_answers = [e for e in entries if e["e"] == "res" and e["r"] == "unknown"] + unanswered
        unanswered_count += len(lost_answers)
        redelivered += max(0, len(acquired) - 1)
        processed_again += max(0, sum(1 for e in entries if e["e"] == "got") - 1)
        for e in entries:
            if e["e"] == "ack" and e["t"] != decide(value, e["dc"]):
                bad.append(f"WRONG DECISION: {name(key)} at delivery {e['dc']} acknowledged {e['t']}: {history(key)}")
        if not acquired:
            bad.append(f"LOST: {name(key)} is committed and settled but was never acquired: {history(key)}")
            continue
        last_count = acquired[-1][3]
        if len(taken) > 1:
            kinds = " and ".join(f"{e['t']} at delivery {e['dc']}" for e in taken)
            bad.append(f"ACKNOWLEDGED TWICE: {name(key)}: the server took {kinds}: {history(key)}")
            continue
        if taken:
            t = taken[0]
            if t["dc"] != last_count or any(e["e"] == "got" and e["dc"] > t["dc"] for e in entries):
                bad.append(
                    f"DELIVERED AFTER ITS ACKNOWLEDGEMENT: {name(key)}: the server took {t['t']} at delivery {t['dc']}, "
                    f"then delivered it again: {history(key)}"
                )
            if kind_of(value) == "poison":
                bad.append(f"POISON SETTLED BY AN ACKNOWLEDGEMENT: {name(key)}: {history(key)}")
            fates["accepted" if t["t"] == ACCEPT else "archived: rejected"] += 1
            continue
        # No acknowledgement the server was seen to take: archived at the limit, or taken by one
        # whose answer was lost (then it was the last delivery's: nothing came after it).
        final_lost = [e for e in lost_answers if e["dc"] == last_count and e["t"] in (ACCEPT, REJECT)]
        if last_count >= LIMIT:
            if final_lost:
                fates["accepted or rejected unanswered, or archived at the limit"] += 1
            else:
                fates["archived: delivery limit" + (" (poison)" if kind_of(value) == "poison" else " (faults)")] += 1
            continue
        if kind_of(value) == "poison":
            bad.append(
                f"POISON NOT ARCHIVED BY THE LIMIT: {name(key)} settled after {last_count} deliveries of {LIMIT}: {history(key)}"
            )
            continue
        if final_lost:
            fates[f"{final_lost[0]['t']}ed, its answer lost"] += 1
            continue
        refused = [e for e in entries if e["e"] == "res" and e["r"] == "refused" and e["dc"] == last_count]
        if refused:
            bad.append(
                f"REFUSED ACKNOWLEDGEMENT COUNTED: {name(key)}: its last delivery ({last_count}) was acknowledged "
                f"{refused[0]['t']}, refused by the server, yet the record was settled and never delivered again: {history(key)}"
            )
        else:
            bad.append(
                f"LOST: {name(key)} settled after delivery {last_count} of {LIMIT} with no acknowledgement the server "
                f"took or may have taken: {history(key)}"
            )
    report.invariants.append(
        "every committed record accepted once or archived with its reason (rejected, delivery limit), never both, "
        "never twice, never lost; refused acknowledgements counted for nothing; poison archived at the limit"
    )
    # A worker frozen mid-batch past the lock that sent its acknowledgements once it woke (its
    # "send" written after it was stopped) sent them late: each refused (or unanswered, a server
    # killed meanwhile), never taken. Sent before the stop, they were in time.
    late: Counter = Counter()
    same = ("pid", "p", "o", "dc", "t")
    for worker, pending, stopped in frozen:
        entries = logs[names.index(worker)]
        last = pending[-1]
        at = next((i for i, e in enumerate(entries) if e["e"] == "ack" and all(e[k] == last[k] for k in same)), None)
        sent = next((e for e in entries[at or 0 :] if e["e"] == "send" and e["pid"] == last["pid"]), None)
        if at is None or sent is None or sent["ts"] < stopped:
            late["sent before the stop, or never"] += len(pending)
            continue
        for intent in pending:
            results = [e for e in entries if e["e"] == "res" and all(e[k] == intent[k] for k in same)]
            for e in results:
                late[e["r"]] += 1
                if e["r"] == "ok":
                    key = (e["p"], e["o"])
                    bad.append(
                        f"LATE ACKNOWLEDGEMENT TAKEN: {worker} decided {e['t']} of {name(key)} at delivery {e['dc']}, was "
                        f"frozen past its lock before sending it, and the server took it: {history(key)}"
                    )
    report.invariants.append("the acknowledgements of a worker frozen past its lock refused")

    # Both ways in took part: each kind of worker had acknowledgements taken.
    for way in ("kafka", "http"):
        taken_by = sum(
            1 for w, entries in zip(names, logs) if w.startswith(way) for e in entries if e["e"] == "res" and e["r"] == "ok"
        )
        if not taken_by:
            bad.append(f"IDLE: no {way} worker had an acknowledgement taken")
    report.invariants.append("the Kafka and the HTTP workers both consumed")
    every = [e for entries in logs for e in entries]
    report.information = {
        "records settled": dict(fates),
        "redeliveries (database)": redelivered,
        "records processed again (at least once)": processed_again,
        "acknowledgements refused": sum(1 for e in every if e["e"] == "res" and e["r"] == "refused"),
        "acknowledgements of workers frozen mid-batch": dict(late),
        "acknowledgements unanswered (the answer lost, or the worker killed first)": unanswered_count,
        "releases taken": sum(1 for e in every if e["e"] == "res" and e["r"] == "ok" and e["t"] == RELEASE),
        "worker errors": sum(1 for e in every if e["e"] == "error"),
        "acknowledgements taken per worker": {
            w: sum(1 for e in entries if e["e"] == "res" and e["r"] == "ok") for w, entries in zip(names, logs)
        },
    }
    if not committed:
        bad.append("NOTHING COMMITTED: the run checked nothing")
    return report


def test_the_checker_names_each_record_and_what_happened_to_it() -> None:
    """The checker over a made-up end state: a record accepted twice, one lost, one of an aborted
    transaction delivered, a poison record settled short of the limit, a frozen worker's late
    acknowledgement taken — each reported by name, with the record and its history."""

    def entries(worker_pid: int, p: int, o: int, value: str, dc: int, t: str, result: str) -> list[dict]:
        base = {"p": p, "o": o, "v": value, "dc": dc, "pid": worker_pid, "ts": float(o)}
        return [
            {"e": "got", **base},
            {"e": "ack", **base, "t": t},
            {"e": "send", "pid": worker_pid, "ts": 10.0 + o},
            {"e": "res", **base, "t": t, "r": result, "err": None},
        ]

    state = State(
        records={
            (0, 0): ("0:accept", False, False),
            (0, 1): ("2:accept", False, False),
            (0, 2): ("4:accept", False, True),
            (0, 3): (None, True, False),
            (0, 4): ("7:poison", False, False),
            (0, 5): ("8:accept", False, False),
        },
        partitions={0: (6, 6, 6), 1: (0, 0, 0), 2: (0, 0, 0)},
        in_flight=[],
        deliveries={
            (0, 0): [(0.0, "m1", 1_000, 1), (1.0, "m2", 2_000, 2)],
            (0, 1): [(0.0, "m1", 1_000, 1)],
            (0, 2): [(0.0, "m1", 1_000, 1)],
            (0, 4): [(0.0, "m2", 1_000, 1)],
            (0, 5): [(0.0, "m1", 1_000, 1)],
        },
    )
    kafka = entries(1, 0, 0, "0:accept", 1, ACCEPT, "ok") + entries(1, 0, 5, "8:accept", 1, ACCEPT, "ok")
    http = entries(2, 0, 0, "0:accept", 2, ACCEPT, "ok")
    # frozen after deciding offset 5 (sent at 15 once it woke) and, before that, after sending offset 0's
    frozen = [("kafka-0", [e for e in kafka if e["e"] == "ack" and e["o"] == 5], 14.0)]
    frozen.append(("kafka-0", [e for e in kafka if e["e"] == "ack" and e["o"] == 0], 11.0))
    report = check(state, ["kafka-0", "http-0"], [kafka, http], Produced(committed=["0:accept"]), frozen)
    found = {a.split(":")[0]: a for a in report.anomalies}
    assert set(found) == {
        "ACKNOWLEDGED TWICE",
        "LOST",
        "ABORTED DELIVERED",
        "POISON NOT ARCHIVED BY THE LIMIT",
        "LATE ACKNOWLEDGEMENT TAKEN",
    }, report.anomalies
    assert "jobs-0@0 '0:accept': the server took accept at delivery 1 and accept at delivery 2" in found["ACKNOWLEDGED TWICE"]
    assert "jobs-0@1 '2:accept' settled after delivery 1 of 3" in found["LOST"]
    assert "jobs-0@2 '4:accept' is an aborted transaction's record" in found["ABORTED DELIVERED"]
    assert "kafka-0 decided accept of jobs-0@5 '8:accept'" in found["LATE ACKNOWLEDGEMENT TAKEN"]
    # the same records settled once each: nothing to report but that the HTTP worker took no part
    settled = State(
        {k: state.records[k] for k in ((0, 0), (0, 3), (0, 5))},
        state.partitions,
        [],
        {(0, 0): [(0.0, "m1", 1_000, 1)], (0, 5): [(0.0, "m1", 1_000, 1)]},
    )
    report = check(settled, ["kafka-0", "http-0"], [kafka, []], Produced(), [])
    assert report.anomalies == ["IDLE: no http worker had an acknowledgement taken"], report.anomalies
