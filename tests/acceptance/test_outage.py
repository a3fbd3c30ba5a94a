"""The database goes away under a running ``txlog serve`` and comes back: while it is away every
request answers 503 COORDINATOR_NOT_AVAILABLE (retriable, with Retry-After) quickly; afterwards the
same server process works again and no acknowledged record is missing."""

from __future__ import annotations

import threading
import time

import httpx

from tests.support import ServerProcess, wait_until


def assert_unavailable(r: httpx.Response) -> None:
    assert r.status_code == 503, r.text
    assert r.headers["retry-after"].isdigit() and int(r.headers["retry-after"]) >= 1
    err = r.json()["error"]
    assert err["code"] == "COORDINATOR_NOT_AVAILABLE"
    assert err["retriable"] is True
    assert err["message"]


def test_database_outage_and_recovery(own_postgres, tmp_path):
    pg = own_postgres
    topic = "outage"
    url = f"/v1/topics/{topic}/partitions/0/records"
    with ServerProcess(
        pg.url, env={"TXLOG_TRANSACTION_ABORT_CHECK_INTERVAL_MS": "300"}, log_path=tmp_path / "server.log"
    ) as server:
        with server.client(timeout=15) as api:
            assert api.post("/v1/topics", json={"name": topic, "partitions": 2}).status_code == 201
            tid = "outage-tx"
            p = api.post("/v1/producers", json={"transactional_id": tid}).json()

            acked: dict[int, str] = {}  # offset -> value, for every 200 answer
            answers: list[int] = []
            stop = threading.Event()

            def background_producer() -> None:
                """Keeps producing through the outage; only 200 and 503 are acceptable answers."""
                i = 0
                with server.client(timeout=15) as c:
                    while not stop.is_set():
                        value = f"bg-{i}"
                        i += 1
                        try:
                            r = c.post(url, json={"records": [{"value": value}]})
                        except httpx.TransportError as exc:  # never: the server must answer
                            answers.append(-1)
                            raise AssertionError(f"no answer: {exc!r}") from exc
                        answers.append(r.status_code)
                        if r.status_code == 200:
                            acked[r.json()["base_offset"]] = value
                        else:
                            assert_unavailable(r)
                        stop.wait(0.01)

            for i in range(5):
                acked[api.post(url, json={"records": [{"value": f"before-{i}"}]}).json()["base_offset"]] = f"before-{i}"
            producer = threading.Thread(target=background_producer)
            producer.start()
            wait_until(lambda: len(answers) >= 5, message="background producer running")

            # a long poll waiting at the high watermark when the database goes away still answers
            poll: dict = {}

            def long_poll() -> None:
                with server.client(timeout=20) as c:
                    start = time.monotonic()
                    poll["response"] = c.get(f"/v1/topics/{topic}/partitions/1/records", params={"offset": 0, "wait_ms": 3000})
                    poll["elapsed"] = time.monotonic() - start

            poller = threading.Thread(target=long_poll)
            poller.start()
            poller.join(0.3)
            assert poller.is_alive(), "the long poll on the empty partition should be waiting"

            pg.kill()  # immediate shutdown: connections drop without a goodbye
            assert not pg.is_running()
            during = len(answers)

            requests = [
                ("POST", url, {"records": [{"value": "during"}]}),
                ("POST", f"/v1/topics/{topic}/records", {"records": [{"key": "k", "value": "during"}]}),
                ("GET", url, None),
                ("GET", f"/v1/topics/{topic}", None),
                ("GET", "/v1/topics", None),
                ("POST", "/v1/topics", {"name": "created-during-outage"}),
                ("POST", "/v1/groups/g/offsets", {"offsets": [{"topic": topic, "partition": 0, "offset": 1}]}),
                ("GET", "/v1/groups/g/offsets", None),
                ("POST", "/v1/producers", {"transactional_id": tid}),
                ("GET", f"/v1/transactions/{tid}", None),
                ("POST", f"/v1/transactions/{tid}/end", {**p, "result": "commit"}),
                ("GET", "/v1/transactions", None),
            ]
            for _ in range(2):  # the first round meets dead pooled connections, the second refused connects
                for method, path, body in requests:
                    start = time.monotonic()
                    r = api.request(method, path, json=body)
                    assert time.monotonic() - start < 5, (method, path)
                    assert_unavailable(r)
            ready = api.get("/readyz")
            assert_unavailable(ready)
            assert api.get("/healthz").status_code == 200

            poller.join(15)
            assert not poller.is_alive()
            assert poll["elapsed"] < 10
            if poll["response"].status_code == 200:  # timed out with nothing, or woken and then refused
                assert poll["response"].json()["records"] == []
            else:
                assert_unavailable(poll["response"])
            wait_until(lambda: len(answers) >= during + 5, message="background producer answered during the outage")
            assert 503 in answers[during:]

            pg.start()  # the same port, the same data
            wait_until(lambda: api.get("/readyz").status_code == 200, timeout=30, message="ready again")
            wait_until(
                lambda: api.post(url, json={"records": [{"value": "after"}]}).status_code == 200,
                timeout=15,
                message="produce works again",
            )
            n_before = len(answers)
            wait_until(lambda: 200 in answers[n_before:], timeout=15, message="background producer succeeds again")
            stop.set()
            producer.join(30)
            assert not producer.is_alive()
            assert -1 not in answers and set(answers) <= {200, 503}

            # the same process serves everything again
            assert api.get(f"/v1/topics/{topic}").status_code == 200
            assert api.post("/v1/topics", json={"name": "created-after-outage"}).status_code == 201
            assert api.get(f"/v1/transactions/{tid}").json()["state"] == "Empty"
            assert (
                api.post("/v1/groups/g/offsets", json={"offsets": [{"topic": topic, "partition": 0, "offset": 1}]}).status_code
                == 200
            )

            # long polls are woken by appends again once the server's LISTEN connection is back
            def long_poll_is_woken() -> bool:
                quiet = f"/v1/topics/{topic}/partitions/1/records"
                hw = api.get(quiet).json()["high_watermark"]
                woken: dict = {}

                def poll_once() -> None:
                    with server.client(timeout=20) as c:
                        start = time.monotonic()
                        woken["records"] = c.get(quiet, params={"offset": hw, "wait_ms": 5000}).json()["records"]
                        woken["elapsed"] = time.monotonic() - start

                t = threading.Thread(target=poll_once)
                t.start()
                t.join(0.3)
                api.post(quiet, json={"records": [{"value": "wake"}]})
                t.join(15)
                return bool(woken["records"]) and woken["elapsed"] < 3

            wait_until(long_poll_is_woken, timeout=40, interval=0.1, message="long polls woken after recovery")

            # every acknowledged record is in the log at its acknowledged offset; offsets stay dense
            log: dict[int, str] = {}
            offset = 0
            while True:
                body = api.get(url, params={"offset": offset, "max_records": 1000}).json()
                if not body["records"]:
                    break
                log.update({r["offset"]: r["value"] for r in body["records"]})
                offset = body["next_offset"]
            assert sorted(log) == list(range(len(log)))
            missing = {o: v for o, v in acked.items() if log.get(o) != v}
            assert not missing, missing
