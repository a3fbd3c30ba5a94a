"""Many producers at once against one partition of a two-worker ``txlog serve``: offsets stay dense,
unique and in acknowledgement order, readers never see a hole, and metrics add up across workers."""

from __future__ import annotations

import random
import threading

import pytest

from tests.support import ServerProcess

THREADS = 16
REQUESTS_PER_THREAD = 25


@pytest.fixture
def two_workers(db_url, tmp_path):  # type: ignore[no-untyped-def]
    with ServerProcess(db_url, workers=2, log_path=tmp_path / "server.log") as server:
        yield server


def test_concurrent_producers_get_dense_unique_offsets(two_workers, topic_name):
    server = two_workers
    with server.client() as api:
        assert api.post("/v1/topics", json={"name": topic_name, "partitions": 1}).status_code == 201
    url = f"/v1/topics/{topic_name}/partitions/0/records"

    acks: list[tuple[int, int, list[str]]] = []
    bases_by_thread: dict[int, list[int]] = {n: [] for n in range(THREADS)}
    failures: list[str] = []
    lock = threading.Lock()
    done = threading.Event()

    def producer(n: int) -> None:
        rng = random.Random(n)
        with server.client() as api:
            for r in range(REQUESTS_PER_THREAD):
                values = [f"p{n}-r{r}-{i}" for i in range(rng.randint(1, 5))]
                resp = api.post(url, json={"records": [{"key": f"p{n}", "value": v} for v in values]})
                with lock:
                    if resp.status_code != 200:
                        failures.append(resp.text)
                        continue
                    body = resp.json()
                    acks.append((body["base_offset"], body["last_offset"], values))
                    bases_by_thread[n].append(body["base_offset"])

    seen_while_producing: list[int] = []
    reader_errors: list[str] = []

    def tailing_reader() -> None:
        """Follows next_offset while the producers run: every answer starts where it asked and has no
        hole, so a reader never sees offset N+1 committed before offset N."""
        offset = 0
        with server.client() as api:
            while True:
                finished = done.is_set()
                body = api.get(url, params={"offset": offset, "max_records": 37, "wait_ms": 200}).json()
                offsets = [r["offset"] for r in body["records"]]
                if offsets and offsets != list(range(offset, offset + len(offsets))):
                    reader_errors.append(f"asked {offset}, got {offsets}")
                    return
                seen_while_producing.extend(offsets)
                offset = body["next_offset"]
                if finished and offset == body["high_watermark"]:
                    return

    reader = threading.Thread(target=tailing_reader)
    reader.start()
    threads = [threading.Thread(target=producer, args=(n,)) for n in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    done.set()
    reader.join(60)

    assert not failures, failures[:3]
    assert not any(t.is_alive() for t in threads) and not reader.is_alive()
    assert len(acks) == THREADS * REQUESTS_PER_THREAD
    total = sum(len(values) for _, _, values in acks)

    # the acknowledged ranges tile 0..total-1 exactly: no gap, no overlap
    ranges = sorted((base, last) for base, last, _ in acks)
    assert ranges[0][0] == 0 and ranges[-1][1] == total - 1
    for (_, last), (base, _) in zip(ranges, ranges[1:]):
        assert base == last + 1
    for base, last, values in acks:
        assert last - base + 1 == len(values)

    # the log holds exactly those records, each request's records at its offsets, in order
    log: dict[int, str] = {}
    with server.client() as api:
        offset = 0
        while True:
            body = api.get(url, params={"offset": offset, "max_records": 500}).json()
            assert body["high_watermark"] == total
            if not body["records"]:
                break
            for r in body["records"]:
                assert r["offset"] not in log
                log[r["offset"]] = r["value"]
            offset = body["next_offset"]
    assert sorted(log) == list(range(total))
    for base, last, values in acks:
        assert [log[o] for o in range(base, last + 1)] == values

    assert not reader_errors, reader_errors
    assert seen_while_producing == list(range(total))

    # each producer thread's requests were appended in the order it sent them
    for n, bases in bases_by_thread.items():
        assert bases == sorted(bases), n

    # /metrics adds up both workers' counters (Prometheus multiprocess mode), whichever worker answers
    for _ in range(10):
        with server.client() as api:  # a new connection each time, so both workers get to answer
            text = api.get("/metrics").text
            appended = [
                line
                for line in text.splitlines()
                if line.startswith("txlog_records_appended_total{") and f'topic="{topic_name}"' in line
            ]
            assert len(appended) == 1, appended
            assert float(appended[0].rsplit(" ", 1)[1]) == total
            requests = [
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("txlog_http_requests_total{")
                and 'method="POST"' in line
                and 'route="/v1/topics/{topic}/partitions/{partition}/records"' in line
                and 'status="200"' in line
            ]
            assert sum(requests) >= THREADS * REQUESTS_PER_THREAD
