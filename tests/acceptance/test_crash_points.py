"""Real server processes that die (as with ``kill -9``) at the two worst lines: between EndTxn's two
steps — the decision durable, no marker written — and right after a produce committed, before its
answer. A new server on the same database finishes the work; the client's retry gets the answer
it would have had."""

from __future__ import annotations

import httpx
import psycopg
import pytest

from tests.support import ServerProcess

TOPIC = "points"
TID = "crashing-producer"
FAST_SWEEPER = {"TXLOG_TRANSACTION_ABORT_CHECK_INTERVAL_MS": "200"}


def dying_server(db_url: str, point: str, tmp_path) -> ServerProcess:  # type: ignore[no-untyped-def]
    return ServerProcess(db_url, env={"TXLOG_CRASH_AT": point}, log_path=tmp_path / f"{point}.log").start()


def died(server: ServerProcess) -> None:
    assert server.proc is not None
    assert server.proc.wait(timeout=30) == 137, "the server should have died at its crash point"


def transaction_row(db_url: str) -> tuple:
    with psycopg.connect(db_url) as conn:
        return conn.execute(
            "SELECT state, producer_id, producer_epoch FROM txlog.transaction_state WHERE transactional_id = %s", (TID,)
        ).fetchone()


def fetch(client: httpx.Client, partition: int, isolation: str = "read_committed") -> dict:
    r = client.get(f"/v1/topics/{TOPIC}/partitions/{partition}/records", params={"isolation_level": isolation})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("result", ["commit", "abort"])
def test_a_server_dying_between_the_decision_and_the_markers(db_url, tmp_path, result):  # type: ignore[no-untyped-def]
    server = dying_server(db_url, "end_txn_prepared", tmp_path)
    with server.client() as api:
        assert api.post("/v1/topics", json={"name": TOPIC, "partitions": 3}).status_code == 201
        producer = api.post("/v1/producers", json={"transactional_id": TID}).json()
        ident = {"producer_id": producer["producer_id"], "producer_epoch": producer["producer_epoch"]}
        for partition in range(3):
            r = api.post(
                f"/v1/topics/{TOPIC}/partitions/{partition}/records",
                json={**ident, "transactional_id": TID, "base_sequence": 0, "records": [{"value": f"v{partition}"}]},
            )
            assert r.status_code == 200, r.text
        offsets = {**ident, "group_id": "g", "offsets": [{"topic": "in", "partition": 0, "offset": 42}]}
        assert api.post("/v1/topics", json={"name": "in", "partitions": 1}).status_code == 201
        assert api.post(f"/v1/transactions/{TID}/offsets", json=offsets).status_code == 200
        end = {**ident, "result": result}
        with pytest.raises(httpx.TransportError):
            api.post(f"/v1/transactions/{TID}/end", json=end)
    died(server)

    # The decision is durable and nothing else happened: no marker, nothing visible, no offsets.
    prepared = "PrepareCommit" if result == "commit" else "PrepareAbort"
    assert transaction_row(db_url) == (prepared, producer["producer_id"], producer["producer_epoch"])
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT count(*) FROM txlog.committed_records").fetchone() == (0,)
        assert conn.execute("SELECT sum(high_watermark) FROM txlog.partition_status WHERE topic = %s", (TOPIC,)).fetchone() == (3,)

    with ServerProcess(db_url, env=FAST_SWEEPER, log_path=tmp_path / "after.log") as after, after.client() as api:
        # The client sends its EndTxn again, as a Kafka producer does after a lost answer. Whoever
        # completes the transaction (this request or the restarted server's sweeper), it answers
        # with the decision taken and the next transaction's epoch.
        r = api.post(f"/v1/transactions/{TID}/end", json=end)
        assert r.status_code == 200, r.text
        done = "CompleteCommit" if result == "commit" else "CompleteAbort"
        assert r.json() == {"state": done, "producer_id": producer["producer_id"], "producer_epoch": producer["producer_epoch"] + 1}
        assert transaction_row(db_url)[0] == done

        for partition in range(3):
            committed = fetch(api, partition)
            assert [rec["value"] for rec in committed["records"]] == ([f"v{partition}"] if result == "commit" else [])
            # one data record and one marker, on every partition
            assert (committed["high_watermark"], committed["last_stable_offset"], committed["next_offset"]) == (2, 2, 2)
        group = api.get("/v1/groups/g/offsets", params={"require_stable": "true"}).json()["offsets"]
        assert [o["offset"] for o in group] == ([42] if result == "commit" else [])

        # The next transaction runs at the new epoch, sequences from 0.
        r = api.post(
            f"/v1/topics/{TOPIC}/partitions/0/records",
            json={"producer_id": producer["producer_id"], "producer_epoch": producer["producer_epoch"] + 1,
                  "transactional_id": TID, "base_sequence": 0, "records": [{"value": "next"}]},
        )
        assert r.status_code == 200 and r.json()["base_offset"] == 2, r.text


def test_a_produce_whose_answer_was_lost_is_appended_once(db_url, tmp_path):  # type: ignore[no-untyped-def]
    with ServerProcess(db_url, log_path=tmp_path / "setup.log") as setup, setup.client() as api:
        assert api.post("/v1/topics", json={"name": TOPIC, "partitions": 1}).status_code == 201
        producer = api.post("/v1/producers", json={}).json()
    batch = {"producer_id": producer["producer_id"], "producer_epoch": 0, "base_sequence": 0,
             "records": [{"key": "k", "value": "once"}, {"key": "k", "value": "twice?"}]}

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
