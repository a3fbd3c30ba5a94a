"""Losing the PostgreSQL primary under transactional load, with a synchronous and with an
asynchronous streaming standby.

A real ``txlog serve --workers 2`` reaches both nodes through one multi-host URL
(``target_session_attrs=read-write``). Transactional producers (raw HTTP, so every acknowledgement
is on record) produce and commit or abort without pause. The replication link then stalls (the
primary's WAL sender is frozen, as a congested network or a slow standby disk would hold it), the
primary's host dies (``kill -9`` of every process of it), and the standby is promoted. The
producers retry what was not answered and carry on; txlog is not restarted.

- Synchronous standby (RocketMQ's synchronous double write, Kafka's ``acks=all`` with
  ``min.insync.replicas=2``): during the stall commits wait for the standby instead of being
  acknowledged, so nothing acknowledged is lost: every acknowledged record of every acknowledged
  commit is on the new primary, exactly once, at its acknowledged offset.
- Asynchronous standby (RocketMQ's asynchronous replication, Kafka's ``acks=1`` or an unclean
  leader election): what was acknowledged during the stall and had not left the primary is gone.
  The test prints that loss window and checks that what survived is consistent: no aborted record
  visible, every transaction all or nothing, offsets dense, nothing left hanging, and the loss is
  each producer's latest commits, never a hole.
"""

from __future__ import annotations

import collections
import os
import random
import signal
import threading
import time
from dataclasses import dataclass, field

import httpx
import pytest

from tests.replication.cluster import Pair, replicated_pair
from tests.support import ServerProcess, wait_until

TOPIC = "ledger"
PARTITIONS = 3
PRODUCERS = 4
BATCH = 3  # records per produce request
BATCHES_PER_TXN = 2
TXN_TIMEOUT_MS = 10_000

SERVER_ENV = {"TXLOG_TRANSACTION_ABORT_CHECK_INTERVAL_MS": "500"}


@dataclass
class Txn:
    """One transaction as its producer saw it."""

    tid: str
    number: int
    sent: dict[str, int] = field(default_factory=dict)  # value -> partition, for every record sent
    acked: dict[str, tuple[int, int]] = field(default_factory=dict)  # value -> (partition, offset) answered 200
    requested: str | None = None  # "commit" / "abort" once EndTxn was sent
    outcome: str = "open"  # committed / aborted (EndTxn answered 200), failed (refused), unknown (EndTxn refused)
    phase: str = ""  # the test's phase when the outcome was acknowledged
    answered_at: float = 0.0  # monotonic time of that answer


class Phase:
    def __init__(self) -> None:
        self.name = "before"


class TransactionalLoad(threading.Thread):
    """A transactional producer over raw HTTP: InitProducerId, BATCHES_PER_TXN idempotent batches on
    random partitions, then EndTxn (a quarter of them aborts). Anything answered retriable (503 while
    the database is away, CONCURRENT_TRANSACTIONS) is sent again unchanged, so a batch keeps its
    sequence and an EndTxn its epoch; anything refused starts over with a new InitProducerId."""

    def __init__(self, server: ServerProcess, tid: str, phase: Phase, stop: threading.Event, seed: int) -> None:
        super().__init__(name=tid, daemon=True)
        self.http = server.client(timeout=60)
        self.tid = tid
        self.phase = phase
        self.stop = stop
        self.rng = random.Random(seed)
        self.txns: list[Txn] = []
        self.refusals: collections.Counter[str] = collections.Counter()  # non-retriable errors, "code (phase)"
        self.retries = 0
        self.transport_errors = 0
        self.failure: BaseException | None = None
        self.producer_id = self.epoch = -1
        self.sequences: dict[int, int] = {}

    def run(self) -> None:
        try:
            self.init()
            while not self.stop.is_set():
                self.transaction()
        except BaseException as exc:  # reported by the test
            self.failure = exc
        finally:
            self.http.close()

    def call(self, path: str, body: dict) -> httpx.Response:
        deadline = time.monotonic() + 90
        while True:
            try:
                r = self.http.post(path, json=body)
            except httpx.TransportError:  # txlog itself never went away: counted, then retried
                self.transport_errors += 1
                r = None
            if r is not None and (r.status_code == 200 or not r.json()["error"]["retriable"]):
                return r
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.tid}: no answer but retriable ones for 90 s on {path}")
            self.retries += 1
            time.sleep(0.05)

    def init(self) -> None:
        r = self.call("/v1/producers", {"transactional_id": self.tid, "transaction_timeout_ms": TXN_TIMEOUT_MS})
        assert r.status_code == 200, r.text
        self.producer_id, self.epoch = r.json()["producer_id"], r.json()["producer_epoch"]
        self.sequences = {}

    def refused(self, r: httpx.Response) -> None:
        self.refusals[f"{r.json()['error']['code']} ({self.phase.name})"] += 1
        self.init()

    def transaction(self) -> None:
        txn = Txn(self.tid, len(self.txns))
        self.txns.append(txn)
        for b in range(BATCHES_PER_TXN):
            partition = self.rng.randrange(PARTITIONS)
            values = [f"{self.tid}/{txn.number}/{b}/{i}" for i in range(BATCH)]
            txn.sent.update((v, partition) for v in values)
            r = self.call(
                f"/v1/topics/{TOPIC}/partitions/{partition}/records",
                {
                    "transactional_id": self.tid,
                    "producer_id": self.producer_id,
                    "producer_epoch": self.epoch,
                    "base_sequence": self.sequences.get(partition, 0),
                    "records": [{"value": v} for v in values],
                },
            )
            if r.status_code != 200:
                txn.outcome, txn.phase = "failed", self.phase.name
                return self.refused(r)
            base = r.json()["base_offset"]
            txn.acked.update((v, (partition, base + i)) for i, v in enumerate(values))
            self.sequences[partition] = self.sequences.get(partition, 0) + BATCH
        txn.requested = "abort" if self.rng.random() < 0.25 else "commit"
        r = self.call(
            f"/v1/transactions/{self.tid}/end",
            {"producer_id": self.producer_id, "producer_epoch": self.epoch, "result": txn.requested},
        )
        if r.status_code != 200:
            txn.outcome, txn.phase = "unknown", self.phase.name
            return self.refused(r)
        txn.outcome = "committed" if txn.requested == "commit" else "aborted"
        txn.phase, txn.answered_at = self.phase.name, time.monotonic()
        self.producer_id, self.epoch = r.json()["producer_id"], r.json()["producer_epoch"]
        self.sequences = {}


class IdempotentLoad(TransactionalLoad):
    """An idempotent producer without transactions: each acknowledged batch counts as committed.
    Refused batches (the database it talks to may have forgotten its last sequences) start over
    with a new producer id."""

    def init(self) -> None:
        r = self.call("/v1/producers", {"transactional_id": None})
        assert r.status_code == 200, r.text
        self.producer_id, self.epoch = r.json()["producer_id"], r.json()["producer_epoch"]
        self.sequences = {}

    def transaction(self) -> None:
        txn = Txn(self.tid, len(self.txns))
        self.txns.append(txn)
        partition = self.rng.randrange(PARTITIONS)
        values = [f"{self.tid}/{txn.number}/0/{i}" for i in range(BATCH)]
        txn.sent.update((v, partition) for v in values)
        r = self.call(
            f"/v1/topics/{TOPIC}/partitions/{partition}/records",
            {
                "producer_id": self.producer_id,
                "producer_epoch": self.epoch,
                "base_sequence": self.sequences.get(partition, 0),
                "records": [{"value": v} for v in values],
            },
        )
        if r.status_code != 200:
            txn.outcome, txn.phase = "failed", self.phase.name
            return self.refused(r)
        base = r.json()["base_offset"]
        txn.acked.update((v, (partition, base + i)) for i, v in enumerate(values))
        self.sequences[partition] = self.sequences.get(partition, 0) + BATCH
        txn.outcome, txn.phase, txn.answered_at = "committed", self.phase.name, time.monotonic()
        time.sleep(0.02)


def commits(loads: list[TransactionalLoad], phase: str | None = None) -> list[Txn]:
    return [t for load in loads for t in load.txns if t.outcome == "committed" and phase in (None, t.phase)]


def read_committed(api: httpx.Client) -> dict[str, tuple[int, int]]:
    """Every record a read_committed consumer sees, value -> (partition, offset); no value twice."""
    seen: dict[str, tuple[int, int]] = {}
    for partition in range(PARTITIONS):
        offset = 0
        while True:
            r = api.get(
                f"/v1/topics/{TOPIC}/partitions/{partition}/records",
                params={"offset": offset, "max_records": 1000, "isolation_level": "read_committed"},
            )
            assert r.status_code == 200, r.text
            body = r.json()
            for rec in body["records"]:
                assert rec["value"] not in seen, f"{rec['value']} seen twice"
                seen[rec["value"]] = (partition, rec["offset"])
            if body["next_offset"] >= body["last_stable_offset"]:
                break
            offset = body["next_offset"]
    return seen


def run_failover(pair: Pair, tmp_path) -> dict:  # type: ignore[no-untyped-def]
    """The load, the stall, the primary's death and the promotion; then every check that holds for
    both kinds of standby. Returns what the caller asserts or reports."""
    phase, stop = Phase(), threading.Event()
    with (
        ServerProcess(pair.url, workers=2, env=SERVER_ENV, log_path=tmp_path / "server.log") as server,
        server.client(timeout=60) as api,
    ):
        assert api.post("/v1/topics", json={"name": TOPIC, "partitions": PARTITIONS}).status_code == 201
        processes = set(server.processes())
        loads = [TransactionalLoad(server, f"ledger-{i}", phase, stop, seed=i) for i in range(PRODUCERS)]
        loads.append(IdempotentLoad(server, "idempotent", phase, stop, seed=PRODUCERS))
        for load in loads:
            load.start()
        wait_until(lambda: len(commits(loads, "before")) >= 20, timeout=30, message="commits before the stall")

        # The replication link stalls.
        walsender = pair.primary.walsender_pid()
        os.kill(walsender, signal.SIGSTOP)
        phase.name = "stall"
        if pair.synchronous:  # commits now wait for the standby: see one waiting (a waiting commit
            # keeps its partitions' row locks, so the other producers may queue behind it on those
            # locks rather than in SyncRep: an EndTxn over every partition leaves one waiter alone)
            wait_until(
                lambda: pair.primary.query("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'")[0][0] >= 1,
                timeout=30,
                message="commits waiting for the synchronous standby",
            )
        else:  # commits go on being acknowledged by the primary alone
            wait_until(lambda: len(commits(loads, "stall")) >= 10, timeout=30, message="commits during the stall")
        primary_lsn = pair.primary.wal_lsn()

        # The primary's host dies; the standby is promoted.
        pair.primary.kill9()
        phase.name = "failover"
        killed_at = time.monotonic()
        standby_lsn = pair.standby.received_lsn()
        pair.standby.promote()
        promoted_at = time.monotonic()
        phase.name = "after"
        wait_until(
            lambda: all(sum(t.outcome == "committed" and t.phase == "after" for t in load.txns) >= 3 for load in loads),
            timeout=60,
            message="every producer committing on the new primary",
        )
        stop.set()
        for load in loads:
            load.join(60)
            assert not load.is_alive()
            assert load.failure is None, f"{load.tid}: {load.failure!r}"

        # txlog found the new primary by itself: the same processes, now connected to node2.
        assert server.proc is not None and server.proc.poll() is None
        assert set(server.processes()) == processes, "a txlog process was restarted"
        assert not pair.standby.is_in_recovery()
        assert pair.standby.query("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'txlog'")[0][0] >= 1

        # Nothing hangs: transactions lost with the old primary are aborted (by the producers'
        # InitProducerId, else by their timeout), so the last stable offset reaches the end.
        def settled() -> bool:
            parts = api.get(f"/v1/topics/{TOPIC}").json()["partitions"]
            return all(p["last_stable_offset"] == p["high_watermark"] for p in parts)

        wait_until(settled, timeout=TXN_TIMEOUT_MS / 1000 + 20, interval=0.2, message="every transaction ended")
        visible = read_committed(api)

    # The same through SQL on the new primary; offsets dense, control records included.
    with pair.standby.connect() as conn:
        rows = conn.execute(
            "SELECT convert_from(value, 'UTF8'), partition, \"offset\" FROM txlog.committed_records WHERE topic = %s", (TOPIC,)
        ).fetchall()
        assert {v: (p, o) for v, p, o in rows} == visible and len(rows) == len(visible)
        in_log = dict(
            conn.execute(
                "SELECT convert_from(value, 'UTF8'), partition FROM txlog.records WHERE topic = %s AND control_type IS NULL",
                (TOPIC,),
            ).fetchall()
        )
        for partition, count, last, high_watermark in conn.execute(
            'SELECT r.partition, count(*), max(r."offset"), p.next_offset FROM txlog.records r '
            "JOIN txlog.partitions p USING (topic, partition) WHERE r.topic = %s GROUP BY r.partition, p.next_offset",
            (TOPIC,),
        ).fetchall():
            assert count == last + 1 == high_watermark, f"partition {partition}: offsets not dense"

    txns = [t for load in loads for t in load.txns]
    sent = {v for t in txns for v in t.sent}
    assert set(visible) <= sent, "a record nobody sent"
    lost: list[Txn] = []
    for t in txns:
        shown = {v: visible[v] for v in t.sent if v in visible}
        logged = {v for v in t.sent if v in in_log}
        if t.outcome == "aborted":
            assert not shown, f"{t.tid} #{t.number}: records of an aborted transaction are visible"
        if (
            shown
        ):  # all of the transaction or nothing: every record of it in the log, each acknowledged one where it was acknowledged
            assert set(shown) == logged, f"{t.tid} #{t.number}: part of a transaction is visible"
            assert set(t.acked) <= set(shown), f"{t.tid} #{t.number}: acknowledged records missing"
            assert all(shown[v] == t.acked[v] for v in t.acked), f"{t.tid} #{t.number}: moved from its acknowledged offset"
        elif t.outcome == "committed":
            lost.append(t)

    return {
        "loads": loads,
        "lost": lost,
        "unreplicated_wal_bytes": primary_lsn - standby_lsn,
        "promotion_s": promoted_at - killed_at,
        "first_commit_after_s": min(t.answered_at for t in commits(loads, "after")) - killed_at,
    }


def report(kind: str, result: dict) -> str:
    loads = result["loads"]
    lost = result["lost"]
    by_phase = collections.Counter(t.phase for t in commits(loads))
    refusals = sum((load.refusals for load in loads), collections.Counter())
    lines = [
        f"{kind} standby: commits acknowledged before the stall {by_phase['before']}, during it {by_phase['stall']}, "
        f"in the failover {by_phase['failover']}, after it {by_phase['after']}",
        f"  acknowledged commits lost: {len(lost)} ({sum(len(t.acked) for t in lost)} acknowledged records), "
        f"{len([t for t in lost if t.phase == 'stall'])} of them acknowledged during the stall",
        f"  WAL the standby had not received when the primary died: {result['unreplicated_wal_bytes']} bytes",
        f"  promotion took {result['promotion_s']:.2f} s, first commit on the new primary "
        f"{result['first_commit_after_s']:.2f} s after the primary died; retried requests {sum(l.retries for l in loads)}, "
        f"transport errors {sum(l.transport_errors for l in loads)}",
        f"  refused and restarted with InitProducerId: {dict(refusals) or 'none'}",
    ]
    text = "\n".join(lines)
    print("\n" + text)
    return text


@pytest.mark.slow
def test_primary_loss_with_synchronous_standby_loses_nothing_acknowledged(tmp_path):
    with replicated_pair(tmp_path / "pg", synchronous=True) as pair:
        result = run_failover(pair, tmp_path)
    report("synchronous", result)
    assert result["lost"] == [], "an acknowledged commit is missing on the new primary"


@pytest.mark.slow
def test_primary_loss_with_asynchronous_standby_reports_its_loss_window(tmp_path):
    with replicated_pair(tmp_path / "pg", synchronous=False) as pair:
        result = run_failover(pair, tmp_path)
    report("asynchronous", result)
    # The standby holds a prefix of the primary's WAL: what is gone is each producer's latest
    # commits before the primary died, never one followed by a commit of its that survived.
    for load in result["loads"]:
        before = [t for t in load.txns if t.outcome == "committed" and t.phase in ("before", "stall")]
        gone = [t in result["lost"] for t in before]
        assert gone == sorted(gone), f"{load.tid}: a hole in what survived: {gone}"
