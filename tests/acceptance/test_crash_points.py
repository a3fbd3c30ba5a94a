"""Real server processes that die (as with ``kill -9``) at the worst lines: inside EndTxn's database
transaction — the decision, the markers, the offsets and the completion written, none of it
committed — right after that transaction committed, before the answer, and right after a produce
committed, before its answer. A new server on the same database finishes the work; the client's
retry gets the answer it would have had."""

from __future__ import annotations

import httpx
import psycopg
import pytest

from tests.support import ServerProcess, wait_until

TOPIC = "points"
TID = "crashing-producer"
FAST_SWEEPER = {"TXLOG_TRANSACTION_ABORT_CHECK_INTERVAL_MS": "200"}


def dying_server(db_url: str, point: str, tmp_path) -> ServerProcess:  # type: ignore[no-untyped-def]
    return ServerProcess(db_url, env={"TXLOG_CRASH_AT": point}, log_path=tmp_path / f"{point}.log").start()


def died(server: ServerProcess) -> None:
    assert server.proc is not None
    assert server.proc.wait(timeout=30) == 137, "the server should have died at its crash point"


def sql(db_url: str, query: str, *params: object) -> list[tuple]:
    with psycopg.connect(db_url) as conn:
        return conn.execute(query, params).fetchall()


def transaction_row(db_url: str) -> tuple:
    (row,) = sql(
        db_url, "SELECT state, producer_id, producer_epoch FROM txlog.transaction_state WHERE transactional_id = %s", TID
    )
    return row


def states_recorded(db_url: str) -> list[str]:
    return [
        s
        for (s,) in sql(db_url, "SELECT to_state FROM txlog.transaction_events WHERE transactional_id = %s ORDER BY version", TID)
    ]


def fetch(client: httpx.Client, partition: int, isolation: str = "read_committed") -> dict:
    r = client.get(f"/v1/topics/{TOPIC}/partitions/{partition}/records", params={"isolation_level": isolation})
    assert r.status_code == 200, r.text
    return r.json()


def open_transaction(api: httpx.Client, timeout_ms: int | None = None) -> dict:
    """A transaction with a record on each of three partitions and a group offset; its producer."""
    assert api.post("/v1/topics", json={"name": TOPIC, "partitions": 3}).status_code == 201
    assert api.post("/v1/topics", json={"name": "in", "partitions": 1}).status_code == 201
    init = {"transactional_id": TID} | ({"transaction_timeout_ms": timeout_ms} if timeout_ms else {})
    producer = api.post("/v1/producers", json=init).json()
    ident = {"producer_id": producer["producer_id"], "producer_epoch": producer["producer_epoch"]}
    for partition in range(3):
        r = api.post(
            f"/v1/topics/{TOPIC}/partitions/{partition}/records",
            json={**ident, "transactional_id": TID, "base_sequence": 0, "records": [{"value": f"v{partition}"}]},
        )
        assert r.status_code == 200, r.text
    offsets = {**ident, "group_id": "g", "offsets": [{"topic": "in", "partition": 0, "offset": 42}]}
    assert api.post(f"/v1/transactions/{TID}/offsets", json=offsets).status_code == 200
    return ident


def assert_ended(api: httpx.Client, result: str) -> None:
    """Every partition carries its marker and shows the records as ``result`` says; the group
    offset is applied or dropped."""
    for partition in range(3):
        committed = fetch(api, partition)
        assert [rec["value"] for rec in committed["records"]] == ([f"v{partition}"] if result == "commit" else [])
        # one data record and one marker, on every partition
        assert (committed["high_watermark"], committed["last_stable_offset"], committed["next_offset"]) == (2, 2, 2)
    group = api.get("/v1/groups/g/offsets", params={"require_stable": "true"}).json()["offsets"]
    assert [o["offset"] for o in group] == ([42] if result == "commit" else [])


@pytest.mark.parametrize("result", ["commit", "abort"])
def test_a_server_dying_inside_end_txn_leaves_the_transaction_ongoing_and_the_retry_ends_it(db_url, tmp_path, result):  # type: ignore[no-untyped-def]
    server = dying_server(db_url, "end_txn_uncommitted", tmp_path)
    with server.client() as api:
        ident = open_transaction(api)
        end = {**ident, "result": result}
        with pytest.raises(httpx.TransportError):
            api.post(f"/v1/transactions/{TID}/end", json=end)
    died(server)

    # Everything EndTxn wrote went with its database transaction: the transaction is Ongoing at
    # its epoch, no decision recorded, no marker, nothing visible, no offsets.
    assert transaction_row(db_url) == ("Ongoing", ident["producer_id"], ident["producer_epoch"])
    assert states_recorded(db_url)[-1] == "Ongoing" and not {"PrepareCommit", "PrepareAbort"} & set(states_recorded(db_url))
    assert sql(db_url, "SELECT count(*) FROM txlog.committed_records") == [(0,)]
    assert sql(db_url, "SELECT sum(high_watermark) FROM txlog.partition_status WHERE topic = %s", TOPIC) == [(3,)]
    assert sql(db_url, "SELECT count(*) FROM txlog.group_offsets") == [(0,)]

    with ServerProcess(db_url, env=FAST_SWEEPER, log_path=tmp_path / "after.log") as after, after.client() as api:
        # The client sends its EndTxn again, as a Kafka producer does after a lost answer: this
        # time it is taken, and answered with the next transaction's epoch.
        r = api.post(f"/v1/transactions/{TID}/end", json=end)
        assert r.status_code == 200, r.text
        done = "CompleteCommit" if result == "commit" else "CompleteAbort"
        assert r.json() == {"state": done, "producer_id": ident["producer_id"], "producer_epoch": ident["producer_epoch"] + 1}
        assert transaction_row(db_url)[0] == done
        # the history reads as Kafka's log does: the decision, then its completion
        prepared = "PrepareCommit" if result == "commit" else "PrepareAbort"
        assert states_recorded(db_url)[-3:] == ["Ongoing", prepared, done]
        assert_ended(api, result)

        # The next transaction runs at the new epoch, sequences from 0.
        r = api.post(
            f"/v1/topics/{TOPIC}/partitions/0/records",
            json={
                "producer_id": ident["producer_id"],
                "producer_epoch": ident["producer_epoch"] + 1,
                "transactional_id": TID,
                "base_sequence": 0,
                "records": [{"value": "next"}],
            },
        )
        assert r.status_code == 200 and r.json()["base_offset"] == 2, r.text


def test_an_end_txn_that_died_and_is_never_retried_is_aborted_at_the_timeout(db_url, tmp_path):  # type: ignore[no-untyped-def]
    server = dying_server(db_url, "end_txn_uncommitted", tmp_path)
    with server.client() as api:
        ident = open_transaction(api, timeout_ms=3000)
        end = {**ident, "result": "commit"}
        with pytest.raises(httpx.TransportError):
            api.post(f"/v1/transactions/{TID}/end", json=end)
    died(server)
    assert transaction_row(db_url)[0] == "Ongoing"

    with ServerProcess(db_url, env=FAST_SWEEPER, log_path=tmp_path / "after.log") as after, after.client() as api:
        # Nobody asks again: at its timeout the sweeper aborts it, as any transaction whose
        # producer went away; its producer is fenced.
        wait_until(lambda: transaction_row(db_url)[0] == "CompleteAbort", timeout=30, interval=0.1, message="the timeout abort")
        assert sql(
            db_url,
            "SELECT to_state, reason FROM txlog.transaction_events WHERE transactional_id = %s ORDER BY version DESC LIMIT 2",
            TID,
        ) == [("CompleteAbort", "timed_out"), ("PrepareAbort", "timed_out")]
        assert_ended(api, "abort")
        # The commit comes too late now: fenced, and told why.
        r = api.post(f"/v1/transactions/{TID}/end", json=end)
        assert r.status_code == 409 and r.json()["error"]["code"] == "PRODUCER_FENCED", r.text
        assert r.json()["error"]["reason"] == "timed_out"


def test_an_end_txn_whose_answer_was_lost_is_answered_again(db_url, tmp_path):  # type: ignore[no-untyped-def]
    server = dying_server(db_url, "end_txn_committed", tmp_path)
    with server.client() as api:
        ident = open_transaction(api)
        end = {**ident, "result": "commit"}
        with pytest.raises(httpx.TransportError):
            api.post(f"/v1/transactions/{TID}/end", json=end)
    died(server)
    assert transaction_row(db_url) == ("CompleteCommit", ident["producer_id"], ident["producer_epoch"] + 1)

    with ServerProcess(db_url, log_path=tmp_path / "after.log") as after, after.client() as api:
        # The retry is recognised as the transaction that ended: the same answer, nothing recorded.
        recorded = states_recorded(db_url)
        r = api.post(f"/v1/transactions/{TID}/end", json=end)
        assert r.status_code == 200, r.text
        assert r.json() == {
            "state": "CompleteCommit",
            "producer_id": ident["producer_id"],
            "producer_epoch": ident["producer_epoch"] + 1,
        }
        assert states_recorded(db_url) == recorded
        assert recorded[-2:] == ["PrepareCommit", "CompleteCommit"]
        assert_ended(api, "commit")


def test_a_produce_whose_answer_was_lost_is_appended_once(db_url, tmp_path):  # type: ignore[no-untyped-def]
    with ServerProcess(db_url, log_path=tmp_path / "setup.log") as setup, setup.client() as api:
        assert api.post("/v1/topics", json={"name": TOPIC, "partitions": 1}).status_code == 201
        producer = api.post("/v1/producers", json={}).json()
    batch = {
        "producer_id": producer["producer_id"],
        "producer_epoch": 0,
        "base_sequence": 0,
        "records": [{"key": "k", "value": "once"}, {"key": "k", "value": "twice?"}],
    }

    server = dying_server(db_url, "produce_appended", tmp_path)
    with server.client() as api, pytest.raises(httpx.TransportError):
        api.post(f"/v1/topics/{TOPIC}/partitions/0/records", json=batch)
    died(server)

    with ServerProcess(db_url, log_path=tmp_path / "after.log") as after, after.client() as api:
        # The append committed before the process died; the retry is recognised as the same batch.
        r = api.post(f"/v1/topics/{TOPIC}/partitions/0/records", json=batch)
        assert r.status_code == 200, r.text
        assert (r.json()["base_offset"], r.json()["last_offset"], r.json()["duplicate"]) == (0, 1, True)
        log = fetch(api, 0, "read_uncommitted")
        assert [rec["value"] for rec in log["records"]] == ["once", "twice?"]
        assert log["high_watermark"] == 2
