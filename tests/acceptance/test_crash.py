"""Crash test: real ``txlog serve`` processes are killed with SIGKILL at random moments while client
threads run transactions over HTTP across three partitions; each round a new server starts on the
same database. Clients behave as Kafka's producer does: a request whose answer was lost is sent
again as it was (same producer id, epoch and sequence) to the restarted server; a fenced producer
starts over with InitProducerId.

Afterwards, once the sweeper has ended every transaction left open: each transaction's records
are visible on all its partitions or on none, every commit answered 200 is visible, nothing of an
aborted (or never committed) transaction is visible, no record was appended twice, offsets are dense."""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx
import psycopg
import pytest

from tests.support import ServerProcess, wait_until

TOPIC = "crash"
PARTITIONS = 3
CLIENTS = 4
ROUNDS = int(os.environ.get("TXLOG_CRASH_ROUNDS", "4"))  # servers killed; `make chaos` kills 12
ENV = {"TXLOG_TRANSACTION_ABORT_CHECK_INTERVAL_MS": "200"}


@dataclass
class Txn:
    client: int
    n: int
    values: dict[int, list[str]] = field(default_factory=dict)  # partition -> values sent
    decision: str | None = None  # what the client asked EndTxn for, if it got that far
    acknowledged: bool = False  # EndTxn answered 200
    answer: str | None = None  # the error code that ended it otherwise


class Cluster:
    """The current server; replaced by the main thread after each kill."""

    def __init__(self, db_url: str, log_dir) -> None:  # type: ignore[no-untyped-def]
        self.db_url = db_url
        self.log_dir = log_dir
        self.server: ServerProcess | None = None
        self.generation = 0
        self.stopping = threading.Event()
        self.resent: Counter[str] = Counter()  # requests sent again after a lost answer, by kind

    def start(self) -> None:
        self.generation += 1
        self.server = ServerProcess(self.db_url, env=ENV, log_path=self.log_dir / f"server-{self.generation}.log").start()

    def kill(self) -> None:
        assert self.server is not None
        self.server.kill()

    @property
    def url(self) -> str:
        assert self.server is not None
        return self.server.url


class Unavailable(Exception):
    pass


def request(cluster: Cluster, kind: str, method: str, path: str, body: dict | None = None) -> httpx.Response:
    """Send until an answer comes: a lost connection or a 503 is retried (on the restarted server),
    the same request each time."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            r = httpx.request(method, cluster.url + path, json=body, timeout=10)
        except httpx.HTTPError:
            cluster.resent[kind] += 1
            time.sleep(0.05)
            continue
        if r.status_code == 503 or (r.status_code == 409 and r.json()["error"]["code"] == "CONCURRENT_TRANSACTIONS"):
            time.sleep(0.05)
            continue
        return r
    raise Unavailable(f"{method} {path}: no answer for 60 s")


def run_client(cluster: Cluster, client: int, txns: list[Txn], failures: list[str]) -> None:
    rng = random.Random(client)
    tid = f"crash-client-{client}"
    try:
        producer: dict | None = None
        n = 0
        while not cluster.stopping.is_set():
            if producer is None:
                r = request(cluster, "init", "POST", "/v1/producers", {"transactional_id": tid, "transaction_timeout_ms": 2000})
                assert r.status_code == 200, r.text
                producer = r.json()
            txn = Txn(client, n)
            txns.append(txn)
            n += 1
            ident = {"producer_id": producer["producer_id"], "producer_epoch": producer["producer_epoch"]}
            fenced = False
            for partition in rng.sample(range(PARTITIONS), rng.randint(2, 3)):
                values = [f"c{client}-t{txn.n}-p{partition}-{k}" for k in range(rng.randint(1, 3))]
                body = {
                    **ident,
                    "transactional_id": tid,
                    "base_sequence": 0,
                    "records": [{"key": tid, "value": v} for v in values],
                }
                txn.values[partition] = values
                r = request(cluster, "produce", "POST", f"/v1/topics/{TOPIC}/partitions/{partition}/records", body)
                if r.status_code != 200:
                    # fenced: the transaction timed out while the server was down; start over
                    assert r.json()["error"]["code"] in ("PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH"), r.text
                    txn.answer = r.json()["error"]["code"]
                    fenced = True
                    break
            if fenced:
                producer = None
                continue
            txn.decision = "commit" if rng.random() < 0.7 else "abort"
            r = request(cluster, "end", "POST", f"/v1/transactions/{tid}/end", {**ident, "result": txn.decision})
            if r.status_code == 200:
                txn.acknowledged = True
                expected = "CompleteCommit" if txn.decision == "commit" else "CompleteAbort"
                assert r.json()["state"] == expected, r.text
                producer = {"producer_id": r.json()["producer_id"], "producer_epoch": r.json()["producer_epoch"]}
            else:
                error = r.json()["error"]
                assert error["code"] in ("PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH"), r.text
                txn.answer = f"{error['code']}:{error.get('reason')}"
                producer = None
    except Exception as exc:  # reported by the test, with the client's number
        failures.append(f"client {client}: {exc!r}")


def sql(db_url: str, query: str, *params: object) -> list[tuple]:
    with psycopg.connect(db_url) as conn:
        return conn.execute(query, params).fetchall()


@pytest.mark.slow
def test_transactions_survive_kill_9_at_random_moments(db_url, tmp_path):
    rng = random.Random(20261122)
    cluster = Cluster(db_url, tmp_path)
    cluster.start()
    try:
        r = httpx.post(cluster.url + "/v1/topics", json={"name": TOPIC, "partitions": PARTITIONS}, timeout=10)
        assert r.status_code == 201, r.text
        txns: list[Txn] = []
        failures: list[str] = []
        threads = [threading.Thread(target=run_client, args=(cluster, c, txns, failures)) for c in range(CLIENTS)]
        for t in threads:
            t.start()
        for _ in range(ROUNDS):
            time.sleep(rng.uniform(0.5, 2.0))
            cluster.kill()
            time.sleep(rng.uniform(0.0, 2.5))  # down for longer than a transaction's timeout, at times
            cluster.start()
        # the last server serves every client again before they stop
        ended = sum(t.acknowledged for t in txns)
        wait_until(lambda: sum(t.acknowledged for t in txns) >= ended + 2 * CLIENTS, timeout=60, message="clients to resume")
        cluster.stopping.set()
        for t in threads:
            t.join(timeout=90)
        assert not any(t.is_alive() for t in threads)
        assert failures == []

        # the sweeper ends whatever the clients left open (timed out after 2 s)
        wait_until(
            lambda: (
                sql(
                    db_url, "SELECT count(*) FROM txlog.transactions WHERE state IN ('Ongoing', 'PrepareCommit', 'PrepareAbort')"
                )[0][0]
                == 0
            ),
            timeout=30,
            interval=0.2,
            message="every transaction to end",
        )
        # a read_committed consumer over HTTP sees what the committed_records view holds
        for partition in range(PARTITIONS):
            seen, offset = [], 0
            while True:
                got = httpx.get(
                    f"{cluster.url}/v1/topics/{TOPIC}/partitions/{partition}/records",
                    params={"offset": offset, "max_records": 50, "isolation_level": "read_committed"},
                    timeout=10,
                ).json()
                seen += [(r["offset"], r["value"]) for r in got["records"]]
                offset = got["next_offset"]
                if offset >= got["last_stable_offset"]:
                    break
            view = sql(
                db_url,
                "SELECT \"offset\", convert_from(value, 'UTF8') FROM txlog.committed_records WHERE topic = %s AND partition = %s ORDER BY 1",
                TOPIC,
                partition,
            )
            assert seen == [tuple(r) for r in view]
    finally:
        cluster.kill()

    outcomes = Counter((t.decision, t.acknowledged, t.answer) for t in txns)
    print(f"{len(txns)} transactions; outcomes {dict(outcomes)}; resent {dict(cluster.resent)}")
    assert len(txns) >= 20, len(txns)
    acknowledged_commits = [t for t in txns if t.acknowledged and t.decision == "commit"]
    assert len(acknowledged_commits) >= 5
    assert sum(cluster.resent.values()) >= ROUNDS // 2, cluster.resent  # the kills interrupted requests

    visible = Counter(
        v for (v,) in sql(db_url, "SELECT convert_from(value, 'UTF8') FROM txlog.committed_records WHERE topic = %s", TOPIC)
    )
    appended = Counter(
        v
        for (v,) in sql(
            db_url, "SELECT convert_from(value, 'UTF8') FROM txlog.records WHERE topic = %s AND control_type IS NULL", TOPIC
        )
    )
    assert all(c == 1 for c in appended.values()), [v for v, c in appended.items() if c > 1]  # no batch twice
    assert all(c == 1 for c in visible.values())

    sent = set()
    for t in txns:
        values = [v for vs in t.values.values() for v in vs]
        sent.update(values)
        shown = [v for v in values if v in visible]
        if t.acknowledged and t.decision == "commit":
            assert shown == values, t
        elif (
            t.decision != "commit" or t.answer == "PRODUCER_FENCED:timed_out"
        ):  # aborted, or never asked to commit: never visible
            assert shown == [], t
        else:  # a commit whose answer was lost or refused: all or nothing
            assert shown in ([], values), t
    assert set(visible) <= sent

    for partition in range(PARTITIONS):
        offsets = [
            o
            for (o,) in sql(
                db_url,
                'SELECT "offset" FROM txlog.records WHERE topic = %s AND partition = %s ORDER BY "offset"',
                TOPIC,
                partition,
            )
        ]
        assert offsets == list(range(len(offsets)))
        ((hw, lso, open_txns),) = sql(
            db_url,
            "SELECT high_watermark, last_stable_offset, open_transactions FROM txlog.partition_status WHERE topic = %s AND partition = %s",
            TOPIC,
            partition,
        )
        assert hw == lso == len(offsets) and open_txns == 0
