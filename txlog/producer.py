"""``Producer``: confluent-kafka's producer over txlog's HTTP API.

``produce()`` only queues a record: it goes into the open batch of its partition (chosen by
Kafka's murmur2 partitioner from the key, or given), a batch is sealed when it is full or has
lingered ``linger.ms``, and a sender thread hands sealed batches to request threads, up to
``max.in.flight`` per partition. Delivery reports wait until ``poll()`` or ``flush()`` calls each
record's ``on_delivery(err, msg)``.

The sending and its delivery reports are ``txlog._sender``'s, the transactional API
``txlog._transactions``'s: ``Producer`` is built on both.
"""

from __future__ import annotations

import queue
import random
import threading
import time
from collections import deque
from typing import Any, Callable

from app.domain.partitioner import partition_for_key
from txlog import _config, _timing
from txlog._config import INT32_MAX, Spec
from txlog._http import Transport, segment
from txlog._sender import PartitionQueue, _Batch
from txlog._transactions import IN_TXN, UNINIT, Transactions, state_error
from txlog.errors import KafkaError, KafkaException
from txlog.message import TIMESTAMP_CREATE_TIME, Message, b64, to_bytes, to_headers

IDEMPOTENCE_MAX_IN_FLIGHT = 5  # what the server's 5 remembered batches per producer allow

_SPECS = {
    "url": Spec("str"),
    "token": Spec("str"),
    "transactional.id": Spec("str"),
    "enable.idempotence": Spec("bool", False),
    "acks": Spec("any", "all", choices=("all", "-1", "0", "1")),
    "retries": Spec("int", INT32_MAX, 0, INT32_MAX),
    "retry.backoff.ms": Spec("int", 100, 1, 300_000),
    "retry.backoff.max.ms": Spec("int", 1000, 1, 300_000),
    "linger.ms": Spec("float", 5, 0, 900_000),
    "batch.num.messages": Spec("int", 10_000, 1, 1_000_000),
    "batch.size": Spec("int", 1_000_000, 1, INT32_MAX),
    "max.in.flight.requests.per.connection": Spec("int", 1_000_000, 1, 1_000_000),
    "message.timeout.ms": Spec("int", 300_000, 0, INT32_MAX),
    "request.timeout.ms": Spec("int", 30_000, 1, 900_000),
    "transaction.timeout.ms": Spec("int", 60_000, 1000, INT32_MAX),
    "queue.buffering.max.messages": Spec("int", 100_000, 1, INT32_MAX),
    "message.max.bytes": Spec("int", 1_000_000, 1000, 1_000_000_000),
    "on_delivery": Spec("any"),
    "error_cb": Spec("any"),
}
_ALIASES = {
    "bootstrap.servers": "url",
    "metadata.broker.list": "url",
    "request.required.acks": "acks",
    "message.send.max.retries": "retries",
    "queue.buffering.max.ms": "linger.ms",
    "max.in.flight": "max.in.flight.requests.per.connection",
    "delivery.timeout.ms": "message.timeout.ms",
    "dr_cb": "on_delivery",
    "dr_msg_cb": "on_delivery",
}


def _invalid_config(message: str) -> KafkaException:
    return _config.invalid(f"Failed to create producer: {message}")


class Producer(Transactions):
    """confluent-kafka's ``Producer``; ``config`` takes Kafka's property names (``url`` or
    ``bootstrap.servers`` names txlog's HTTP address). Safe to share between threads."""

    def __init__(self, config: dict | None = None, **kwargs: Any) -> None:
        conf = dict(config or {})
        conf.update(kwargs)
        values, given = _config.read(conf, _SPECS, _ALIASES)
        self._transactional_id: str | None = values["transactional.id"] or None
        idempotent = values["enable.idempotence"]
        if self._transactional_id is not None and not idempotent:
            if "enable.idempotence" in given:
                raise _invalid_config("`transactional.id` requires `enable.idempotence=true`")
            idempotent = True
        max_in_flight = values["max.in.flight.requests.per.connection"]
        if idempotent:
            if "max.in.flight.requests.per.connection" in given and max_in_flight > IDEMPOTENCE_MAX_IN_FLIGHT:
                raise _invalid_config(
                    f"`max.in.flight` must be set <= {IDEMPOTENCE_MAX_IN_FLIGHT} when `enable.idempotence` is true"
                )
            max_in_flight = min(max_in_flight, IDEMPOTENCE_MAX_IN_FLIGHT)
            if "retries" in given and values["retries"] < 1:
                raise _invalid_config("`retries` must be set >= 1 when `enable.idempotence` is true")
            if values["acks"] not in ("all", "-1"):
                raise _invalid_config("`acks` must be set to `all` when `enable.idempotence` is true")
        on_delivery, error_cb = values["on_delivery"], values["error_cb"]
        for name, cb in (("on_delivery", on_delivery), ("error_cb", error_cb)):
            if cb is not None and not callable(cb):
                raise _config.invalid(f'Invalid value for configuration property "{name}": expected a callable')

        self._idempotent: bool = idempotent
        self._max_in_flight: int = max_in_flight
        self._retries: int = values["retries"]
        self._backoff_s: float = values["retry.backoff.ms"] / 1000
        self._backoff_max_s: float = max(values["retry.backoff.max.ms"], values["retry.backoff.ms"]) / 1000
        self._linger_s: float = values["linger.ms"] / 1000
        self._batch_messages: int = values["batch.num.messages"]
        self._batch_bytes: int = values["batch.size"]
        self._message_timeout_s: float = values["message.timeout.ms"] / 1000
        self._txn_timeout_ms: int = values["transaction.timeout.ms"]
        self._max_queued: int = values["queue.buffering.max.messages"]
        self._max_message_bytes: int = values["message.max.bytes"]
        self._default_callback: Callable | None = on_delivery
        self._error_cb: Callable | None = error_cb
        self._transport = Transport(values["url"], values["token"], timeout_s=values["request.timeout.ms"] / 1000)

        self._cond = threading.Condition(threading.Lock())
        self._partitions: dict[tuple[str, int], PartitionQueue] = {}
        self._partition_counts: dict[str, int] = {}
        self._sticky: dict[str, int] = {}  # null-key records stick to a partition until its batch is sealed
        self._reports: deque[tuple[Callable | None, KafkaError | None, Message]] = deque()
        self._errors: deque[KafkaError] = deque()  # for error_cb
        self._queued = 0  # produced, not yet reported
        self._flushing = 0
        self._closed = False
        self._fatal: KafkaError | None = None
        self._txn_error: KafkaError | None = None  # the abortable error of the current transaction
        self._purging = False
        self._txn_state = UNINIT
        self._txn_sent = False  # a batch or offsets of the current transaction went to the server
        self._committing_batch: _Batch | None = None  # the batch a commit_transaction() sends with its commit
        self._producer_id: int | None = None
        self._producer_epoch: int | None = None
        self._pid_wanted = False  # an idempotent producer asks for its id when it first sends

        self._work = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._sender, name="txlog-producer-sender", daemon=True)]
        self._threads += [
            threading.Thread(target=self._request_worker, name=f"txlog-producer-request-{i}", daemon=True) for i in range(16)
        ]
        for t in self._threads:
            t.start()

    # --- producing ----------------------------------------------------------------------------

    def produce(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        partition: int | None = -1,
        on_delivery: Callable | None = None,
        timestamp: int = 0,
        headers: Any = None,
        *,
        callback: Callable | None = None,
    ) -> None:
        """Queue one record. Raises ``BufferError`` when ``queue.buffering.max.messages`` are
        waiting, ``KafkaException`` when the producer cannot take it (fatal error, no transaction
        begun, unknown partition, too large)."""
        self._check_may_produce()
        k = to_bytes(key, "key")
        v = to_bytes(value, "value")
        hs = to_headers(headers)
        size = (len(k) if k else 0) + (len(v) if v else 0) + sum(len(hk) + (len(hv) if hv else 0) for hk, hv in hs)
        if size > self._max_message_bytes:
            raise KafkaException(
                KafkaError(
                    KafkaError.MESSAGE_TOO_LARGE, f"Message size too large ({size} > message.max.bytes {self._max_message_bytes})"
                )
            )
        count = self._partition_count(topic)
        if partition is not None and partition != -1:
            if not 0 <= partition < count:
                raise KafkaException(KafkaError(KafkaError._UNKNOWN_PARTITION, f"Local: Unknown partition {topic} [{partition}]"))
        elif k is not None:
            partition = partition_for_key(k, count)
        else:
            partition = None
        ts = int(timestamp) if timestamp else int(time.time() * 1000)
        record: dict[str, Any] = {"key": b64(k), "value": b64(v), "timestamp_ms": ts}
        if hs:
            record["headers"] = [{"key": hk, "value": b64(hv)} for hk, hv in hs]
        cb = on_delivery or callback or self._default_callback
        with self._cond:
            self._check_may_produce()
            if self._queued >= self._max_queued:
                raise BufferError("Local: Queue full")
            if partition is None:
                partition = self._sticky.get(topic)
                if partition is None:
                    partition = self._sticky[topic] = random.randrange(count)
            tp = (topic, partition)
            msg = Message(topic, partition, None, k, v, hs, (TIMESTAMP_CREATE_TIME, ts))
            msg._latency = time.monotonic()
            pq = self._partitions.get(tp)
            if pq is None:
                pq = self._partitions[tp] = PartitionQueue()
            if not pq.messages:
                pq.first_at = time.monotonic()
                pq.deadline = pq.first_at + self._linger_s
            pq.messages.append(msg)
            pq.records.append(record)
            pq.callbacks.append(cb)
            pq.bytes += size
            self._queued += 1
            if len(pq.messages) >= self._batch_messages or pq.bytes >= self._batch_bytes:
                self._seal(tp, pq)
            if len(pq.messages) <= 1:
                self._cond.notify_all()

    def _check_may_produce(self) -> None:
        if self._fatal is not None:
            raise KafkaException(self._fatal)
        if self._closed:
            raise state_error("Producer is closed")
        if self._transactional_id is not None:
            if self._txn_state != IN_TXN:
                raise state_error(f"Transactional producer is in state {self._txn_state}: call begin_transaction() first")
            if self._txn_error is not None:
                raise KafkaException(self._txn_error)

    def _partition_count(self, topic: str) -> int:
        count = self._partition_counts.get(topic)
        if count is None:
            answer = self._retrying(lambda: self._transport.get(f"/v1/topics/{segment(topic)}"))
            count = self._partition_counts[topic] = len(answer["partitions"])
        return count

    def _retrying(self, call: Callable[[], Any], attempts: int = 10) -> Any:
        """A metadata request, tried again after retriable errors (a lost answer, a busy server)."""
        for attempt in range(1, attempts + 1):
            try:
                return call()
            except KafkaException as exc:
                if not exc.args[0].retriable() or attempt == attempts:
                    raise
            time.sleep(_timing.backoff(attempt, self._backoff_s, self._backoff_max_s))

    def close(self, timeout: float | None = None) -> int:
        """Flush, then stop the producer's threads. Answers how many records were left unreported."""
        left = self.flush(timeout)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for _ in self._threads[1:]:
            self._work.put(None)
        self._transport.close()
        return left
