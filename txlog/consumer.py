"""``Consumer``: confluent-kafka's consumer over txlog's HTTP API.

``subscribe`` assigns every partition of the topics (no group rebalancing).

Fetching, and where each partition starts, are ``txlog._fetcher``'s: ``Consumer`` is built on it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from typing import Any, Callable

from txlog import _config, _timing
from txlog._config import INT32_MAX, Spec
from txlog._fetcher import Fetch, Fetcher
from txlog._http import Transport, segment
from txlog.errors import KafkaError, KafkaException
from txlog.message import OFFSET_BEGINNING, OFFSET_END, OFFSET_INVALID, OFFSET_STORED, Message, TopicPartition

_SPECS = {
    "url": Spec("str"),
    "token": Spec("str"),
    "group.id": Spec("str"),
    "isolation.level": Spec("str", "read_committed", choices=("read_committed", "read_uncommitted")),
    "enable.auto.commit": Spec("bool", True),
    "auto.commit.interval.ms": Spec("int", 5000, 0, 86_400_000),
    "enable.auto.offset.store": Spec("bool", True),
    "auto.offset.reset": Spec(
        "str", "largest", choices=("smallest", "earliest", "beginning", "largest", "latest", "end", "error")
    ),
    "enable.partition.eof": Spec("bool", False),
    "fetch.wait.max.ms": Spec("int", 500, 0, 60_000),
    "max.partition.fetch.bytes": Spec("int", 1_048_576, 1, INT32_MAX),
    "max.poll.records": Spec("int", 500, 1, 100_000),
    "request.timeout.ms": Spec("int", 30_000, 1, 900_000),
    "retry.backoff.ms": Spec("int", 100, 1, 300_000),
    "on_commit": Spec("any"),
    "error_cb": Spec("any"),
}
_ALIASES = {
    "bootstrap.servers": "url",
    "metadata.broker.list": "url",
    "auto.commit.enable": "enable.auto.commit",
    "fetch.message.max.bytes": "max.partition.fetch.bytes",
}
_EARLIEST = ("smallest", "earliest", "beginning")


class ConsumerGroupMetadata:
    """What ``send_offsets_to_transaction`` needs to know of the consumer: its group."""

    __slots__ = ("group_id",)

    def __init__(self, group_id: str) -> None:
        self.group_id = group_id

    def __repr__(self) -> str:
        return f"ConsumerGroupMetadata(group_id={self.group_id!r})"


class Consumer(Fetcher):
    """confluent-kafka's ``Consumer``. ``isolation.level`` defaults to ``read_committed`` and
    ``auto.offset.reset`` to ``latest``, as librdkafka's."""

    def __init__(self, config: dict | None = None, **kwargs: Any) -> None:
        conf = dict(config or {})
        conf.update(kwargs)
        conf.update(conf.pop("default.topic.config", None) or {})
        values, _ = _config.read(conf, _SPECS, _ALIASES)
        for name in ("on_commit", "error_cb"):
            if values[name] is not None and not callable(values[name]):
                raise _config.invalid(f'Invalid value for configuration property "{name}": expected a callable')
        self._group_id: str | None = values["group.id"] or None
        self._read_committed = values["isolation.level"] == "read_committed"
        self._auto_commit_s: float | None = values["auto.commit.interval.ms"] / 1000 if values["enable.auto.commit"] else None
        self._auto_store: bool = values["enable.auto.offset.store"]
        reset = values["auto.offset.reset"]
        self._reset: int | None = OFFSET_BEGINNING if reset in _EARLIEST else None if reset == "error" else OFFSET_END
        self._partition_eof: bool = values["enable.partition.eof"]
        self._wait_max_ms: int = values["fetch.wait.max.ms"]
        self._max_bytes: int = values["max.partition.fetch.bytes"]
        self._max_records: int = values["max.poll.records"]
        self._request_timeout_s: float = values["request.timeout.ms"] / 1000
        self._backoff_s: float = values["retry.backoff.ms"] / 1000
        self._on_commit: Callable | None = values["on_commit"]
        self._error_cb: Callable | None = values["error_cb"]
        self._transport = Transport(values["url"], values["token"], timeout_s=self._request_timeout_s)
        self._pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="txlog-consumer-fetch")

        self._lock = threading.RLock()
        self._fetches: dict[TopicPartition, Fetch] = {}
        self._order: list[TopicPartition] = []  # handed out in turn
        self._next = 0
        self._events: deque[Message] = deque()  # errors and end-of-partition events, handed out first
        self._subscription: list[str] | None = None
        self._subscribed_topics: set[str] = set()
        self._on_assign: Callable | None = None
        self._on_revoke: Callable | None = None
        self._assigned_in_callback = False
        self._last_commit: dict[TopicPartition, int] = {}
        self._next_auto_commit = time.monotonic() + (self._auto_commit_s or 0)
        self._metadata_retry_at = 0.0
        self._closed = False

    # --- assignment ---------------------------------------------------------------------------

    def assign(self, partitions: list[TopicPartition]) -> None:
        """Consume exactly these partitions, each from its given offset (or ``OFFSET_BEGINNING`` /
        ``OFFSET_END``), else from the group's committed offset, else ``auto.offset.reset``."""
        with self._lock:
            self._check_open()
            self._assigned_in_callback = True
            self._fetches = {}
            self._add(partitions)

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        with self._lock:
            self._check_open()
            self._assigned_in_callback = True
            self._add([tp for tp in partitions if _tp(tp) not in self._fetches])

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        with self._lock:
            self._check_open()
            for tp in partitions:
                self._fetches.pop(_tp(tp), None)
            self._order = list(self._fetches)

    def unassign(self) -> None:
        with self._lock:
            self._check_open()
            self._fetches = {}
            self._order = []

    def assignment(self) -> list[TopicPartition]:
        with self._lock:
            self._check_open()
            return [TopicPartition(tp.topic, tp.partition) for tp in self._fetches]

    def _add(self, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            key = _tp(tp)
            f = Fetch()
            self._place(f, tp.offset)
            self._fetches[key] = f
        self._order = list(self._fetches)

    def _place(self, f: Fetch, offset: int) -> None:
        f.buffer.clear()
        f.eof_at = None
        if offset >= 0:
            f.fetch_offset, f.reset = offset, None
        elif offset in (OFFSET_BEGINNING, OFFSET_END):
            f.fetch_offset, f.reset = None, offset
        else:
            f.fetch_offset, f.reset = None, None

    def subscribe(
        self,
        topics: list[str],
        on_assign: Callable | None = None,
        on_revoke: Callable | None = None,
        on_lost: Callable | None = None,
    ) -> None:
        """Consume every partition of ``topics``; the assignment happens in the next ``poll``,
        which first calls ``on_assign(consumer, partitions)`` (it may set their offsets)."""
        if isinstance(topics, str):
            raise TypeError("subscribe() expects a list of topics")
        if any(t.startswith("^") for t in topics):
            raise KafkaException(KafkaError(KafkaError._INVALID_ARG, "Regex subscriptions are not supported"))
        with self._lock:
            self._check_open()
            self._subscription = list(topics)
            self._subscribed_topics = set()
            self._on_assign, self._on_revoke = on_assign, on_revoke
            self._fetches = {}
            self._order = []

    def unsubscribe(self) -> None:
        with self._lock:
            self._check_open()
            if self._on_revoke is not None and self._fetches:
                self._on_revoke(self, self.assignment())
            self._subscription = None
            self._subscribed_topics = set()
            self._fetches = {}
            self._order = []

    def _follow_subscription(self) -> None:
        """Assign the partitions of subscribed topics not assigned yet."""
        if self._subscription is None or time.monotonic() < self._metadata_retry_at:
            return
        new: list[TopicPartition] = []
        for topic in self._subscription:
            if topic in self._subscribed_topics:
                continue
            try:
                answer = self._transport.get(f"/v1/topics/{segment(topic)}")
            except KafkaException as exc:
                self._metadata_retry_at = time.monotonic() + 1.0
                if not exc.args[0].retriable():
                    self._events.append(Message(topic, None, None, error=exc.args[0]))
                continue
            self._subscribed_topics.add(topic)
            new += [TopicPartition(topic, p["partition"]) for p in answer["partitions"]]
        if not new:
            return
        if self._on_assign is not None:
            self._assigned_in_callback = False
            self._on_assign(self, new)
            if self._assigned_in_callback:
                return
        self._add(new)

    # --- consuming ----------------------------------------------------------------------------

    def poll(self, timeout: float | None = None) -> Message | None:
        """The next record (or event: a ``Message`` whose ``error()`` is set), waiting up to
        ``timeout`` seconds (``None`` or negative: no limit); ``None`` when none came in time."""
        deadline = _timing.deadline(timeout)
        while True:
            with self._lock:
                self._check_open()
                self._follow_subscription()
                msg = self._take()
                if msg is None:
                    self._harvest()
                    msg = self._take()
                if msg is not None:
                    self._maybe_auto_commit()
                    return msg
                self._resolve(deadline)
                remaining = _timing.remaining(deadline)
                wait_ms = _timing.wait_ms(self._wait_max_ms, remaining)
                self._start_fetches(wait_ms)
                pending = [f.future for f in self._fetches.values() if f.future is not None]
                self._maybe_auto_commit()
            if remaining is not None and remaining <= 0:
                return None
            if pending:
                wait(pending, timeout=remaining, return_when=FIRST_COMPLETED)
            else:
                time.sleep(min(remaining if remaining is not None else 0.1, 0.1))

    def consume(self, num_messages: int = 1, timeout: float | None = -1) -> list[Message]:
        """Up to ``num_messages`` records, waiting up to ``timeout`` seconds for them all."""
        if num_messages < 1:
            raise ValueError("num_messages must be >= 1")
        deadline = _timing.deadline(timeout)
        out: list[Message] = []
        while len(out) < num_messages:
            remaining = _timing.remaining(deadline)
            msg = self.poll(remaining)
            if msg is None:
                break
            out.append(msg)
        return out

    def _take(self) -> Message | None:
        if self._events:
            return self._events.popleft()
        n = len(self._order)
        for i in range(n):
            tp = self._order[(self._next + i) % n]
            f = self._fetches.get(tp)
            if f is not None and f.buffer and not f.paused:
                self._next = (self._next + i + 1) % n
                msg = f.buffer.popleft()
                if self._auto_store:
                    f.stored = msg.offset() + 1  # type: ignore[operator]  # a fetched record has an offset
                return msg
        return None

    # --- positions and offsets ------------------------------------------------------------------

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """The offset of the next record to be handed out for each partition (``OFFSET_INVALID``
        when not known yet)."""
        with self._lock:
            self._check_open()
            out = []
            for tp in partitions:
                f = self._fetches.get(_tp(tp))
                pos = f.position() if f is not None else None
                out.append(TopicPartition(tp.topic, tp.partition, OFFSET_INVALID if pos is None else pos))
            return out

    def seek(self, partition: TopicPartition) -> None:
        """Continue ``partition`` (assigned) from its offset (or ``OFFSET_BEGINNING``/``OFFSET_END``)."""
        with self._lock:
            self._check_open()
            f = self._fetches.get(_tp(partition))
            if f is None:
                raise KafkaException(
                    KafkaError(
                        KafkaError._UNKNOWN_PARTITION, f"seek(): {partition.topic} [{partition.partition}] is not assigned"
                    )
                )
            if partition.offset in (OFFSET_STORED, OFFSET_INVALID):
                raise KafkaException(KafkaError(KafkaError._INVALID_ARG, "seek(): invalid offset"))
            self._place(f, partition.offset)
            f.retry_at = 0.0

    def pause(self, partitions: list[TopicPartition]) -> None:
        with self._lock:
            for tp in partitions:
                f = self._fetches.get(_tp(tp))
                if f is not None:
                    f.paused = True

    def resume(self, partitions: list[TopicPartition]) -> None:
        with self._lock:
            for tp in partitions:
                f = self._fetches.get(_tp(tp))
                if f is not None:
                    f.paused = False

    def store_offsets(self, message: Message | None = None, offsets: list[TopicPartition] | None = None) -> None:
        """Set the offsets ``commit()`` (and auto commit) will commit: the message's offset + 1, or
        the given ones."""
        with self._lock:
            self._check_open()
            if message is not None:
                offsets = [TopicPartition(message.topic(), message.partition(), message.offset() + 1)]  # type: ignore[arg-type, operator]  # a consumed message has all three
            for tp in offsets or []:
                f = self._fetches.get(_tp(tp))
                if f is None:
                    raise KafkaException(
                        KafkaError(KafkaError._UNKNOWN_PARTITION, f"{tp.topic} [{tp.partition}] is not assigned")
                    )
                f.stored = tp.offset

    def commit(
        self, message: Message | None = None, offsets: list[TopicPartition] | None = None, asynchronous: bool = True
    ) -> list[TopicPartition] | None:
        """Commit the message's offset + 1, or ``offsets``, or else the stored offsets of the
        assignment (the positions of the records handed out). Synchronous commits answer the
        offsets committed."""
        with self._lock:
            self._check_open()
            if message is not None:
                offsets = [TopicPartition(message.topic(), message.partition(), message.offset() + 1)]  # type: ignore[arg-type, operator]  # a consumed message has all three
            elif offsets is None:
                offsets = [
                    TopicPartition(tp.topic, tp.partition, f.stored) for tp, f in self._fetches.items() if f.stored is not None
                ]
                if not offsets:
                    raise KafkaException(KafkaError(KafkaError._NO_OFFSET, "Local: No offset stored"))
            try:
                committed = self._commit(offsets)
            except KafkaException as exc:
                if asynchronous and self._on_commit is not None:
                    self._on_commit(exc.args[0], offsets)
                    return None
                raise
            if self._on_commit is not None:
                self._on_commit(None, committed)
            return None if asynchronous else committed

    def _commit(self, offsets: list[TopicPartition]) -> list[TopicPartition]:
        group = self._require_group("commit")
        body = {
            "offsets": [
                {"topic": tp.topic, "partition": tp.partition, "offset": tp.offset, "metadata": tp.metadata or ""}
                for tp in offsets
            ]
        }
        answer = self._transport.post(f"/v1/groups/{segment(group)}/offsets", body)
        out = [TopicPartition(o["topic"], o["partition"], o["offset"], o["metadata"] or None) for o in answer["offsets"]]
        for tp in out:
            self._last_commit[tp] = tp.offset
        return out

    def _maybe_auto_commit(self, force: bool = False) -> None:
        if self._auto_commit_s is None or self._group_id is None:
            return
        now = time.monotonic()
        if not force and now < self._next_auto_commit:
            return
        self._next_auto_commit = now + self._auto_commit_s
        changed = [
            TopicPartition(tp.topic, tp.partition, f.stored)
            for tp, f in self._fetches.items()
            if f.stored is not None and self._last_commit.get(tp) != f.stored
        ]
        if not changed:
            return
        try:
            committed = self._commit(changed)
        except KafkaException as exc:
            if self._on_commit is not None:
                self._on_commit(exc.args[0], changed)
            elif self._error_cb is not None:
                self._error_cb(exc.args[0])
            return
        if self._on_commit is not None:
            self._on_commit(None, committed)

    def committed(self, partitions: list[TopicPartition], timeout: float | None = None) -> list[TopicPartition]:
        """The group's committed offset of each partition (``OFFSET_INVALID`` when none); waits up
        to ``timeout`` seconds while a transaction holds offsets of the group pending."""
        with self._lock:
            self._check_open()
            self._require_group("committed")
        t = self._request_timeout_s if timeout is None or timeout < 0 else timeout
        found = self._committed_offsets(time.monotonic() + t)
        if found is None:
            raise KafkaException(
                KafkaError(
                    KafkaError._TIMED_OUT, "committed(): offsets of the group are still pending in a transaction", retriable=True
                )
            )
        return [TopicPartition(tp.topic, tp.partition, found.get(_tp(tp), OFFSET_INVALID)) for tp in partitions]

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float | None = None, cached: bool = False
    ) -> tuple[int, int]:
        """``(low, high)``: the partition's log start offset and high watermark."""
        marks = self._watermarks(partition.topic)
        if partition.partition not in marks:
            raise KafkaException(
                KafkaError(KafkaError._UNKNOWN_PARTITION, f"{partition.topic} [{partition.partition}] does not exist")
            )
        low, high, _ = marks[partition.partition]
        return low, high

    def consumer_group_metadata(self) -> ConsumerGroupMetadata:
        """The consumer's group, for ``Producer.send_offsets_to_transaction``."""
        return ConsumerGroupMetadata(self._require_group("consumer_group_metadata"))

    def close(self) -> None:
        """Commit the stored offsets (with auto commit) and stop."""
        with self._lock:
            if self._closed:
                return
            self._maybe_auto_commit(force=True)
            self._closed = True
            self._fetches = {}
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._transport.close()

    def _require_group(self, call: str) -> str:
        if self._group_id is None:
            raise KafkaException(KafkaError(KafkaError._INVALID_ARG, f"{call}(): group.id is not configured"))
        return self._group_id

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("Consumer closed")

    def __enter__(self) -> "Consumer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _tp(tp: TopicPartition) -> TopicPartition:
    """The key of a partition in the assignment (without its offset)."""
    return TopicPartition(tp.topic, tp.partition)
