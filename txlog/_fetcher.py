"""How ``Consumer`` fetches its partitions and finds where each starts.

Each assigned partition is fetched by its own long-poll request (``wait_ms`` at most
``fetch.wait.max.ms`` and never past ``poll``'s timeout), always from the previous answer's
``next_offset``, so markers and skipped aborted records are stepped over; one page per partition is
fetched ahead while the application works through the last. A partition starts at the group's
committed offset (asked with ``require_stable`` when reading committed records, and asked again
while a transaction still holds offsets of the group pending) or else where ``auto.offset.reset``
says.
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor

from txlog import _timing
from txlog._http import Transport, segment
from txlog.errors import KafkaError, KafkaException
from txlog.message import OFFSET_BEGINNING, TIMESTAMP_CREATE_TIME, Message, TopicPartition, unb64


class Fetch:
    """One assigned partition: where the next fetch starts, records fetched and not yet handed out,
    the fetch on its way."""

    __slots__ = ("fetch_offset", "reset", "buffer", "future", "future_offset", "paused", "stored", "eof_at", "retry_at")

    def __init__(self) -> None:
        self.fetch_offset: int | None = None  # None: to be found (committed offset or reset)
        self.reset: int | None = None  # OFFSET_BEGINNING / OFFSET_END when a reset is due
        self.buffer: deque[Message] = deque()
        self.future: Future | None = None
        self.future_offset = -1
        self.paused = False
        self.stored: int | None = None  # the offset ``commit()`` commits
        self.eof_at: int | None = None
        self.retry_at = 0.0

    def position(self) -> int | None:
        return self.buffer[0].offset() if self.buffer else self.fetch_offset


class Fetcher:
    """The fetching half of ``Consumer``: long polls started and taken in, and the start of each
    partition (its committed offset, or a reset). ``Consumer.__init__`` sets every attribute below."""

    _group_id: str | None
    _read_committed: bool
    _reset: int | None
    _partition_eof: bool
    _max_bytes: int
    _max_records: int
    _request_timeout_s: float
    _backoff_s: float
    _transport: Transport
    _pool: ThreadPoolExecutor
    _fetches: dict[TopicPartition, Fetch]
    _events: deque[Message]

    # --- fetching -------------------------------------------------------------------------------

    def _start_fetches(self, wait_ms: int) -> None:
        now = time.monotonic()
        for tp, f in self._fetches.items():
            if f.future is not None or f.buffer or f.paused or f.fetch_offset is None or f.retry_at > now:
                continue
            f.future_offset = f.fetch_offset
            f.future = self._pool.submit(self._fetch, tp, f.fetch_offset, wait_ms)

    def _fetch(self, tp: TopicPartition, offset: int, wait_ms: int) -> dict:
        params = {
            "offset": offset,
            "max_records": self._max_records,
            "max_bytes": self._max_bytes,
            "isolation_level": "read_committed" if self._read_committed else "read_uncommitted",
            "encoding": "base64",
            "wait_ms": wait_ms,
        }
        return self._transport.get(
            f"/v1/topics/{segment(tp.topic)}/partitions/{tp.partition}/records",
            params,
            timeout_s=self._request_timeout_s + wait_ms / 1000,
        )

    def _harvest(self) -> None:
        """Take in the fetches that came back; an answer for an offset no longer wanted (after a
        seek or a new assignment) is dropped."""
        for tp, f in self._fetches.items():
            fut = f.future
            if fut is None or not fut.done():
                continue
            f.future = None
            if f.fetch_offset != f.future_offset or f.buffer:
                continue
            try:
                page = fut.result()
            except KafkaException as exc:
                self._fetch_failed(tp, f, exc.args[0])
                continue
            for r in page["records"]:
                headers = [(h["key"], unb64(h["value"])) for h in r.get("header_list") or ()]
                f.buffer.append(
                    Message(
                        tp.topic,
                        tp.partition,
                        r["offset"],
                        unb64(r["key"]),
                        unb64(r["value"]),
                        headers,
                        (TIMESTAMP_CREATE_TIME, r["timestamp_ms"]),
                    )
                )
            f.fetch_offset = page["next_offset"]
            end = page["last_stable_offset"] if self._read_committed else page["high_watermark"]
            if self._partition_eof and not f.buffer and f.fetch_offset >= end and f.eof_at != f.fetch_offset:
                f.eof_at = f.fetch_offset
                self._events.append(
                    Message(
                        tp.topic,
                        tp.partition,
                        f.fetch_offset,
                        error=KafkaError(
                            KafkaError._PARTITION_EOF,
                            f"Fetch from {tp.topic} [{tp.partition}] reached end at offset {f.fetch_offset}",
                        ),
                    )
                )

    def _fetch_failed(self, tp: TopicPartition, f: Fetch, err: KafkaError) -> None:
        if err.code() == KafkaError.OFFSET_OUT_OF_RANGE:
            if self._reset is None:
                f.retry_at = time.monotonic() + 1.0
                self._events.append(
                    Message(
                        tp.topic,
                        tp.partition,
                        f.fetch_offset,
                        error=KafkaError(
                            KafkaError._AUTO_OFFSET_RESET,
                            f"Fetch from {tp.topic} [{tp.partition}] at offset {f.fetch_offset} "
                            f"failed: {err.str()}; auto.offset.reset is error",
                        ),
                    )
                )
                return
            f.fetch_offset, f.reset = None, self._reset
            return
        f.retry_at = time.monotonic() + (self._backoff_s if err.retriable() else 1.0)
        if not err.retriable():
            self._events.append(Message(tp.topic, tp.partition, f.fetch_offset, error=err))

    # --- where each partition starts ------------------------------------------------------------

    def _resolve(self, deadline: float | None) -> None:
        """Find the start of partitions that have none: the committed offset, else a reset."""
        unknown = [
            tp for tp, f in self._fetches.items() if f.fetch_offset is None and f.reset is None and f.retry_at <= time.monotonic()
        ]
        if unknown:
            committed: dict[TopicPartition, int] = {}
            if self._group_id is not None:
                try:
                    found = self._committed_offsets(deadline)
                except KafkaException as exc:
                    self._events.append(Message(error=exc.args[0]))
                    for tp in unknown:
                        self._fetches[tp].retry_at = time.monotonic() + 1.0
                    return
                if found is None:  # still unstable: ask again at the next poll
                    return
                committed = found
            for tp in unknown:
                f = self._fetches[tp]
                if tp in committed:
                    f.fetch_offset = committed[tp]
                elif self._reset is not None:
                    f.reset = self._reset
                else:
                    f.retry_at = time.monotonic() + 1.0
                    self._events.append(
                        Message(
                            tp.topic,
                            tp.partition,
                            error=KafkaError(
                                KafkaError._AUTO_OFFSET_RESET,
                                f"{tp.topic} [{tp.partition}]: no committed offset and auto.offset.reset is error",
                            ),
                        )
                    )
        to_reset: dict[str, list[TopicPartition]] = {}
        for tp, f in self._fetches.items():
            if f.reset is not None and f.retry_at <= time.monotonic():
                to_reset.setdefault(tp.topic, []).append(tp)
        for topic, tps in to_reset.items():
            try:
                marks = self._watermarks(topic)
            except KafkaException as exc:
                if not exc.args[0].retriable():
                    self._events.append(Message(topic, None, None, error=exc.args[0]))
                for tp in tps:
                    self._fetches[tp].retry_at = time.monotonic() + 1.0
                continue
            for tp in tps:
                f = self._fetches[tp]
                low, high, stable = marks.get(tp.partition, (0, 0, 0))
                end = stable if self._read_committed else high
                f.fetch_offset = low if f.reset == OFFSET_BEGINNING else end
                f.reset = None

    def _committed_offsets(self, deadline: float | None) -> dict[TopicPartition, int] | None:
        """The group's committed offsets, asked again while a transaction holds some pending
        (UNSTABLE_OFFSET_COMMIT) and time remains; ``None`` if time ran out."""
        params = {"require_stable": "true"} if self._read_committed else None
        attempt = 0
        while True:
            try:
                answer = self._transport.get(f"/v1/groups/{segment(self._group_id)}/offsets", params)  # type: ignore[arg-type]  # asked only with a group.id
                return {TopicPartition(o["topic"], o["partition"]): o["offset"] for o in answer["offsets"]}
            except KafkaException as exc:
                if not exc.args[0].retriable():
                    raise
            attempt += 1
            delay = _timing.backoff(attempt, self._backoff_s, 1.0)
            if deadline is not None and time.monotonic() + delay > deadline:
                return None
            time.sleep(delay)

    def _watermarks(self, topic: str) -> dict[int, tuple[int, int, int]]:
        answer = self._transport.get(f"/v1/topics/{segment(topic)}")
        return {
            p["partition"]: (p["log_start_offset"], p["high_watermark"], p["last_stable_offset"]) for p in answer["partitions"]
        }
