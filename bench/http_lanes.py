"""The HTTP API's lanes: produce (plain, idempotent, transactional), fetch, and a share group's
acquisitions.

The HTTP clients are lean on purpose: ``http.client`` with keep-alive, a batch's JSON encoded once
per lane with only the producer id, epoch and sequence spliced in per request, and a produce
answer's status checked without decoding its body. A fetch answer is decoded (orjson) since its
``next_offset`` drives the next request. The client CPU per 1000 rows is reported beside every
figure, so a load generator that became the bottleneck shows.
"""

from __future__ import annotations

import http.client
import time
import uuid

import orjson

from bench.lanes import BATCH, PAGE, Lane, batch_keys, batch_values


def records_json() -> bytes:
    return orjson.dumps([{"key": k.decode(), "value": v.decode()} for k, v in zip(batch_keys(), batch_values())])


class Http:
    """One keep-alive HTTP/1.1 connection."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.conn = http.client.HTTPConnection(host, int(port), timeout=120)

    def call(self, method: str, path: str, body: bytes | None = None) -> bytes:
        headers = {"content-type": "application/json"} if body is not None else {}
        self.conn.request(method, path, body=body, headers=headers)
        resp = self.conn.getresponse()
        data = resp.read()
        if resp.status not in (200, 201):
            raise RuntimeError(f"{method} {path}: HTTP {resp.status}: {data[:500]!r}")
        return data

    def close(self) -> None:
        self.conn.close()


class ProduceRunner:
    """Plain, idempotent or transactional produce of one pre-encoded batch, over and over."""

    def __init__(self, lane: Lane) -> None:
        self.lane = lane
        self.http = Http(lane.target)
        self.path = f"/v1/topics/{lane.topic}/partitions/{lane.partition}/records"
        self.latencies: list[tuple[float, float]] = []
        self.offset = 0
        self.empty = 0
        self.open_batches = 0
        self.seq = 0
        head = b'{"encoding":"utf8","records":' + records_json()
        if lane.mode == "plain":
            self.plain = head + b"}"
            return
        self.head = head + b',"producer_id":'
        self.tail = b"}"
        init = b"{}"
        if lane.mode in ("transactional", "committed"):
            tid = orjson.dumps(lane.transactional_id)
            self.tail = b',"transactional_id":' + tid + (b',"commit":true}' if lane.mode == "committed" else b"}")
            init = b'{"transactional_id":' + tid + b"}"
        out = orjson.loads(self.http.call("POST", "/v1/producers", init))
        self.pid, self.epoch = out["producer_id"], out["producer_epoch"]

    def step(self) -> int:
        if self.lane.mode == "plain":
            self.http.call("POST", self.path, self.plain)
            return BATCH
        ids = b'%d,"producer_epoch":%d,"base_sequence":%d' % (self.pid, self.epoch, self.seq)
        answer = self.http.call("POST", self.path, self.head + ids + self.tail)
        if self.lane.mode == "committed":  # the batch committed its transaction: the next one's epoch
            ended = orjson.loads(answer)["transaction"]
            self.pid, self.epoch = ended["producer_id"], ended["producer_epoch"]
            return BATCH
        self.seq += BATCH
        if self.lane.mode == "transactional":
            self.open_batches += 1
            if self.open_batches >= self.lane.commit_every:
                self._commit()
        return BATCH

    def _commit(self) -> None:
        body = b'{"producer_id":%d,"producer_epoch":%d,"result":"commit"}' % (self.pid, self.epoch)
        started = time.monotonic()
        out = orjson.loads(self.http.call("POST", f"/v1/transactions/{self.lane.transactional_id}/end", body))
        done = time.monotonic()
        self.latencies.append((done, (done - started) * 1000))
        self.pid, self.epoch, self.seq, self.open_batches = out["producer_id"], out["producer_epoch"], 0, 0

    def close(self) -> None:
        if self.open_batches:  # never leave a transaction open: it would hold the last stable offset
            self._commit()
        self.http.close()


class FetchRunner:
    """Pages of 1000 records from ``offset``, following ``next_offset``, wrapping to the lane's
    ``start`` (or the log start, if later)."""

    def __init__(self, lane: Lane) -> None:
        self.http = Http(lane.target)
        self.offset = lane.offset
        self.bound = "last_stable_offset" if lane.mode == "read_committed" else "high_watermark"
        self.start, self.end = lane.start, lane.end
        self.path = (
            f"/v1/topics/{lane.topic}/partitions/{lane.partition}/records"
            f"?max_records={PAGE}&max_bytes=16777216&isolation_level={lane.mode}&offset="
        )
        self.latencies: list[tuple[float, float]] = []
        self.empty = 0

    def step(self) -> int:
        doc = orjson.loads(self.http.call("GET", self.path + str(self.offset)))
        n = len(doc["records"])
        nxt = doc["next_offset"]
        wrap = nxt >= doc[self.bound] or (self.end and nxt >= self.end)
        self.offset = max(doc["log_start_offset"], self.start) if wrap else nxt
        return n

    def close(self) -> None:
        self.http.close()


class ShareAcquireRunner:
    """A share group's member over HTTP, consuming as a share consumer does: each acquisition
    (``POST /v1/share-groups/{group}/acquire``, up to a batch of the lane's topic, its partitions
    taken from a random one) carries the acceptance of the batch before it (a range per run
    acquired), as Kafka's ShareFetch carries acknowledgements: one request per batch, a
    partition both accepted and read in one database transaction. Counted: records accepted
    (the answer's ``acknowledgements``); the last batch is accepted when the runner closes."""

    def __init__(self, lane: Lane) -> None:
        self.http = Http(lane.target)
        self.member = str(uuid.uuid4())
        self.acquire_path = f"/v1/share-groups/{lane.group}/acquire"
        self.ack_path = f"/v1/share-groups/{lane.group}/acknowledge"
        self.acquire_head = orjson.dumps(
            {"member_id": self.member, "topic": lane.topic, "max_records": BATCH, "wait_ms": 0, "encoding": "utf8"}
        )[:-1]
        self.pending: list[dict] = []  # the acceptance of the last batch, sent with the next acquisition
        self.latencies: list[tuple[float, float]] = []
        self.offset = 0
        self.empty = 0

    def step(self) -> int:
        body = self.acquire_head
        if self.pending:
            body += b',"acknowledgements":' + orjson.dumps(self.pending)
        doc = orjson.loads(self.http.call("POST", self.acquire_path, body + b"}"))
        accepted = sum(p["accepted"] for p in doc.get("acknowledgements") or () if p["error"] is None)
        self.pending = [
            {
                "topic": p["topic"],
                "partition": p["partition"],
                "first_offset": a["first_offset"],
                "last_offset": a["last_offset"],
                "type": "accept",
            }
            for p in doc["partitions"]
            for a in p["acquired"]
        ]
        if not accepted and not self.pending:
            self.empty += 1
        return accepted

    def close(self) -> None:
        if self.pending:
            body = orjson.dumps({"member_id": self.member, "acknowledgements": self.pending})
            self.http.call("POST", self.ack_path, body)
        self.http.close()
