"""A frozen host cannot freeze the log. Every process of one ``txlog serve`` stops (SIGSTOP, as a
stalled VM stops) while its clients are in the middle of transactions: either at its stop point,
one of its requests holding a transaction row and a partition's append lock
(``TXLOG_STOP_AT=produce_locked``), or at whatever moment a SIGSTOP from outside finds its two
workers. A second server on the same database:

- appends to the same partitions: a lock wait is answered 503 REQUEST_TIMED_OUT (retriable) and
  the retry succeeds once PostgreSQL ends the frozen session (idle-in-transaction timeout), never
  a hang;
- aborts the frozen server's open transactions when they time out (its own sweeper), so the last
  stable offset reaches the high watermark on every partition — all within (transaction timeout
  + 30 s) of the freeze; read_committed readers never see an aborted record.

Then the frozen server resumes (SIGCONT): its late requests get clean answers (PRODUCER_FENCED
with the reason, or a retriable 503 for the request whose session the database ended, never a
500), it serves new transactions, and nothing acknowledged is lost. (A request that reached an idle
keep-alive connection during the freeze may find it closed on resume — uvicorn's keep-alive timer
fires first — and is sent again on a new connection, as any HTTP client does.)

``make chaos`` runs this a few times over."""

from __future__ import annotations

import signal
import threading
import time

import httpx
import psycopg
import pytest

from app.errors import ErrorCode
from tests.support import ServerProcess, wait_until

TIMEOUT_MS = 6_000  # transaction timeout
ENV = {
    "TXLOG_DEFAULT_TRANSACTION_TIMEOUT_MS": str(TIMEOUT_MS),
    "TXLOG_TRANSACTION_ABORT_CHECK_INTERVAL_MS": "300",
    "TXLOG_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS": "4000",
    "TXLOG_DB_LOCK_TIMEOUT_MS": "500",
}
BOUND_S = TIMEOUT_MS / 1000 + 30  # from the freeze: appends answered, transactions aborted, LSO = HW
TOPIC = "frozen"
PARTITIONS = 3
HELD = 3  # transactions the test opens through the first server and leaves open
CLIENTS = 4
# The stop point: the first server freezes at a produce, holding its locks, once its held
# transactions are open (HELD * PARTITIONS produces come first).
STOP_AT = f"produce_locked:{HELD * PARTITIONS + 3}"
OPEN_STATES = {"Ongoing", "PrepareCommit", "PrepareAbort"}
KNOWN_CODES = {c.name for c in ErrorCode} - {ErrorCode.UNKNOWN_SERVER_ERROR.name}


class Answers:
    """Every answer the first server gave, to check that none was a 500 or unnamed."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: list[tuple[str, int, str | None]] = []
        self.transport_errors: list[str] = []

    def call(self, http: httpx.Client, path: str, body: dict) -> httpx.Response | None:
        try:
            r = http.post(path, json=body)
        except httpx.TransportError as exc:  # a connection closed under the request; never a timeout (a hang)
            assert not isinstance(exc, httpx.TimeoutException), f"{path}: {exc!r}"
            with self.lock:
                self.transport_errors.append(f"{path}: {exc!r}")
            return None
        code = None if r.status_code == 200 else r.json()["error"]["code"]
        with self.lock:
            self.seen.append((path, r.status_code, code))
        return r


def error_code(r: httpx.Response | None) -> str | None:
    return None if r is None or r.status_code == 200 else r.json()["error"]["code"]


def retriable(r: httpx.Response | None) -> bool:
    """A retriable error, or no answer because the connection closed: send it again."""
    return r is None or (r.status_code != 200 and r.json()["error"]["retriable"])


class TransactionalClient(threading.Thread):
    """A transactional producer in a loop: a batch to every partition, then commit; a retriable
    answer is retried, anything else starts over with InitProducerId. Values name the producer id
    and epoch of their transaction; ``acked`` holds the values of every commit answered 200."""

    def __init__(self, server: ServerProcess, tid: str, answers: Answers) -> None:
        super().__init__(name=tid, daemon=True)
        self.server, self.tid, self.answers = server, tid, answers
        self.stop = threading.Event()
        self.acked: set[str] = set()
        self.committed = 0
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            with self.server.client(timeout=120) as http:  # longer than any freeze: a stuck client waits
                while not self.stop.is_set():
                    self.one_producer_session(http)
        except BaseException as exc:  # reported by the test
            self.failure = exc

    def send(self, http: httpx.Client, path: str, body: dict) -> httpx.Response | None:
        for _ in range(40):
            r = self.answers.call(http, path, body)
            if not retriable(r) or self.stop.is_set():
                return r
            time.sleep(0.05)
        return r

    def one_producer_session(self, http: httpx.Client) -> None:
        r = self.send(http, "/v1/producers", {"transactional_id": self.tid})
        if r is None or r.status_code != 200:
            return
        pid, epoch = r.json()["producer_id"], r.json()["producer_epoch"]
        while not self.stop.is_set():
            values = []
            for p in range(PARTITIONS):
                value = f"{self.tid}|{pid}|{epoch}|{p}"
                r = self.send(
                    http,
                    f"/v1/topics/{TOPIC}/partitions/{p}/records",
                    {
                        "transactional_id": self.tid,
                        "producer_id": pid,
                        "producer_epoch": epoch,
                        "base_sequence": 0,
                        "records": [{"value": value}],
                    },
                )
                if r is None or r.status_code != 200:
                    return
                values.append(value)
            r = self.send(
                http, f"/v1/transactions/{self.tid}/end", {"producer_id": pid, "producer_epoch": epoch, "result": "commit"}
            )
            if r is None or r.status_code != 200:
                return
            self.acked.update(values)
            self.committed += 1
            pid, epoch = r.json()["producer_id"], r.json()["producer_epoch"]


def database_ms(db_url: str) -> int:
    with psycopg.connect(db_url) as conn:
        return conn.execute("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint").fetchone()[0]


def transaction_rows(db_url: str, tids: list[str]) -> dict[str, tuple[str, str | None]]:
    with psycopg.connect(db_url) as conn:
        rows = conn.execute(
            "SELECT transactional_id, state, fence_reason FROM txlog.transactions WHERE transactional_id = ANY(%s)", (tids,)
        ).fetchall()
    return {tid: (state, reason) for tid, state, reason in rows}


def outcomes(db_url: str) -> dict[tuple[int, int], str]:
    """(producer id, epoch) of every transaction decided so far → "commit" or "abort"."""
    with psycopg.connect(db_url) as conn:
        rows = conn.execute(
            "SELECT producer_id, producer_epoch, to_state FROM txlog.transaction_events "
            "WHERE to_state IN ('PrepareCommit', 'PrepareAbort')"
        ).fetchall()
    return {(pid, epoch): "commit" if state == "PrepareCommit" else "abort" for pid, epoch, state in rows}


def read_all(http: httpx.Client, partition: int, isolation: str) -> list[str]:
    values, offset = [], 0
    while True:
        r = http.get(
            f"/v1/topics/{TOPIC}/partitions/{partition}/records",
            params={"offset": offset, "isolation_level": isolation, "max_records": 1000},
        )
        assert r.status_code == 200, r.text
        got = r.json()
        values += [rec["value"] for rec in got["records"]]
        end = got["last_stable_offset"] if isolation == "read_committed" else got["high_watermark"]
        if got["next_offset"] >= end:
            return values
        assert got["next_offset"] > offset
        offset = got["next_offset"]


def check_the_log(http: httpx.Client, db_url: str, acked: set[str], aborted: set[str]) -> None:
    """Every transaction is all visible to read_committed (committed) or not at all (aborted or
    never decided), every acknowledged value is there once, no value of ``aborted`` is."""
    decided = outcomes(db_url)
    committed_values: list[str] = []
    for p in range(PARTITIONS):
        everything = read_all(http, p, "read_uncommitted")
        committed = read_all(http, p, "read_committed")
        committed_values += committed
        for value in everything:
            if value.startswith("plain-"):
                assert value in committed
                continue
            _, pid, epoch, _ = value.split("|")
            assert (decided.get((int(pid), int(epoch))) == "commit") == (value in committed), value
    assert len(committed_values) == len(set(committed_values))
    assert acked <= set(committed_values), sorted(acked - set(committed_values))[:5]
    assert not aborted & set(committed_values)


def stable(http: httpx.Client) -> bool:
    parts = http.get(f"/v1/topics/{TOPIC}").json()["partitions"]
    return all(p["last_stable_offset"] == p["high_watermark"] for p in parts)


@pytest.mark.slow
@pytest.mark.parametrize("freeze", ["stop_point", "sigstop"])
def test_a_frozen_server_cannot_freeze_the_log(db_url, tmp_path, freeze):  # type: ignore[no-untyped-def]
    healthy = ServerProcess(db_url, env=ENV, log_path=tmp_path / "healthy.log")
    if freeze == "stop_point":  # one worker: a stop point counts its passes per process
        frozen = ServerProcess(db_url, env={**ENV, "TXLOG_STOP_AT": STOP_AT}, log_path=tmp_path / "frozen.log")
    else:
        frozen = ServerProcess(db_url, workers=2, env=ENV, log_path=tmp_path / "frozen.log")
    answers = Answers()
    with healthy, frozen, healthy.client(timeout=20) as h, frozen.client(timeout=120) as f:
        assert h.post("/v1/topics", json={"name": TOPIC, "partitions": PARTITIONS}).status_code == 201

        # Transactions opened through the first server and left open, as its clients would be mid-way.
        held = []
        for i in range(HELD):
            tid = f"held-{i}"
            r = answers.call(f, "/v1/producers", {"transactional_id": tid})
            assert r is not None and r.status_code == 200, r
            pid, epoch = r.json()["producer_id"], r.json()["producer_epoch"]
            for p in range(PARTITIONS):
                r = answers.call(
                    f,
                    f"/v1/topics/{TOPIC}/partitions/{p}/records",
                    {
                        "transactional_id": tid,
                        "producer_id": pid,
                        "producer_epoch": epoch,
                        "base_sequence": 0,
                        "records": [{"value": f"{tid}|{pid}|{epoch}|{p}"}],
                    },
                )
                assert r is not None and r.status_code == 200, r.text
            held.append((tid, pid, epoch))
        held_values = {f"{tid}|{pid}|{epoch}|{p}" for tid, pid, epoch in held for p in range(PARTITIONS)}

        clients = [TransactionalClient(frozen, f"client-{i}", answers) for i in range(CLIENTS)]
        for c in clients:
            c.start()
        if freeze == "stop_point":
            wait_until(
                lambda: "T" in frozen.processes().values(),
                timeout=60,
                interval=0.02,
                message="the first server to stop at its stop point",
            )
        else:
            wait_until(lambda: all(c.committed for c in clients), timeout=60, interval=0.02, message="every client running")
        frozen.signal_group(signal.SIGSTOP)  # a stop point stops its process group: this is a no-op then
        frozen_at = time.monotonic()
        frozen_at_ms = database_ms(db_url)
        wait_until(lambda: set(frozen.processes().values()) == {"T"}, timeout=10, message="every process of it stopped")
        tids = [tid for tid, _, _ in held] + [c.tid for c in clients]
        assert all(state == "Ongoing" for state, _ in transaction_rows(db_url, [t for t, _, _ in held]).values())

        # 1. The second server appends to every partition: answered, never hung (the client's timeout
        # would fail the test), a lock wait refused as retriable until the frozen session is ended.
        lock_waits: list[dict] = []
        plain_acked: set[str] = set()
        append_failures: list[BaseException] = []

        def append(partition: int) -> None:
            try:
                append_until_acknowledged(partition)
            except BaseException as exc:  # reported below, by the test
                append_failures.append(exc)

        def append_until_acknowledged(partition: int) -> None:
            with healthy.client(timeout=20) as c:
                value = f"plain-{partition}"
                while True:
                    r = c.post(f"/v1/topics/{TOPIC}/partitions/{partition}/records", json={"records": [{"value": value}]})
                    if r.status_code == 200:
                        plain_acked.add(value)
                        return
                    err = r.json()["error"]
                    assert (r.status_code, err["code"], err["retriable"]) == (503, "REQUEST_TIMED_OUT", True), r.text
                    assert int(r.headers["retry-after"]) >= 1
                    lock_waits.append(err)
                    assert time.monotonic() < frozen_at + BOUND_S, "appends still refused"

        appenders = [threading.Thread(target=append, args=(p,)) for p in range(PARTITIONS)]
        for t in appenders:
            t.start()
        for t in appenders:
            t.join(BOUND_S)
        assert not append_failures, append_failures
        assert plain_acked == {f"plain-{p}" for p in range(PARTITIONS)}
        if freeze == "stop_point":
            assert lock_waits, "the append lock held by the frozen server was answered REQUEST_TIMED_OUT at least once"

        # 2. Its sweeper aborts what timed out; the last stable offset reaches the high watermark.
        def settled() -> bool:
            rows = transaction_rows(db_url, tids)
            return all(state not in OPEN_STATES for state, _ in rows.values()) and stable(h)

        wait_until(
            settled,
            timeout=frozen_at + BOUND_S - time.monotonic(),
            interval=0.2,
            message="the frozen server's transactions ended and LSO = HW everywhere",
        )
        settled_s = time.monotonic() - frozen_at
        rows = transaction_rows(db_url, [t for t, _, _ in held])
        assert all(row == ("CompleteAbort", "timed_out") for row in rows.values()), rows
        with psycopg.connect(db_url) as conn:
            aborts = conn.execute(
                "SELECT (extract(epoch FROM at) * 1000)::bigint FROM txlog.transaction_events "
                "WHERE transactional_id LIKE 'held-%%' AND to_state = 'PrepareAbort'"
            ).fetchall()
        assert len(aborts) == HELD and all(at >= frozen_at_ms for (at,) in aborts)  # by the second server
        check_the_log(h, db_url, plain_acked, held_values)
        print(
            f"\nfrozen ({freeze}): appends answered and {len(tids)} transactions settled {settled_s:.1f} s after the "
            f"freeze (bound {BOUND_S:.0f} s); {len(lock_waits)} lock waits answered REQUEST_TIMED_OUT"
        )

        # 3. The frozen server resumes: late requests of its timed-out transactions are fenced, cleanly.
        frozen.signal_group(signal.SIGCONT)
        for tid, pid, epoch in held:
            late = [
                (
                    f"/v1/topics/{TOPIC}/partitions/0/records",
                    {
                        "transactional_id": tid,
                        "producer_id": pid,
                        "producer_epoch": epoch,
                        "base_sequence": 1,
                        "records": [{"value": f"{tid}|{pid}|{epoch}|late"}],
                    },
                ),
                (f"/v1/transactions/{tid}/end", {"producer_id": pid, "producer_epoch": epoch, "result": "commit"}),
            ]
            for path, body in late:
                r = wait_until(
                    lambda: (lambda r: None if retriable(r) else r)(answers.call(f, path, body)),
                    timeout=30,
                    message=f"an answer to a late request of {tid}",
                )
                assert r.status_code == 409 and r.json()["error"]["code"] == "PRODUCER_FENCED", r.text
                assert r.json()["error"]["reason"] == "timed_out"

        # ... its clients' stuck requests are answered and they go on, and it serves new transactions.
        committed_before = {c.tid: c.committed for c in clients}
        wait_until(
            lambda: all(c.committed > committed_before[c.tid] or not c.is_alive() for c in clients),
            timeout=60,
            message="every client to commit again through the resumed server",
        )
        for c in clients:
            c.stop.set()
        for c in clients:
            c.join(150)
            assert not c.is_alive() and c.failure is None, c.failure
        assert f.get("/readyz").status_code == 200

        # No 500s, every refusal named.
        assert all(status in (200, 409, 503) for _, status, _ in answers.seen), [
            a for a in answers.seen if a[1] not in (200, 409, 503)
        ]
        assert all(code in KNOWN_CODES for _, status, code in answers.seen if status != 200)
        refused = sorted({code for _, status, code in answers.seen if status != 200})
        print(
            f"frozen ({freeze}): first server's refusals {refused}; connections closed under a request: "
            f"{len(answers.transport_errors)}"
        )

        # 4. Nothing acknowledged is lost; nothing aborted is visible.
        acked = plain_acked.union(*(c.acked for c in clients))
        wait_until(
            lambda: all(s not in OPEN_STATES for s, _ in transaction_rows(db_url, tids).values()) and stable(h),
            timeout=BOUND_S,
            interval=0.2,
            message="the clients' last transactions ended",
        )
        check_the_log(h, db_url, acked, held_values)
        assert sum(c.committed for c in clients) > 0
