"""``Producer``: confluent-kafka's producer over txlog's HTTP API.

``produce()`` only queues a record: it goes into the open batch of its partition (chosen by
Kafka's murmur2 partitioner from the key, or given), a batch is sealed when it is full or has
lingered ``linger.ms``, and a sender thread hands sealed batches to request threads, up to
``max.in.flight`` per partition. Delivery reports wait until ``poll()`` or ``flush()`` calls each
record's ``on_delivery(err, msg)``.

With ``enable.idempotence`` the producer has a producer id and numbers each partition's records
from 0: a batch keeps its base sequence for life, so a batch whose answer was lost is sent again
as it was and the server answers the duplicate with its original offsets, never appending it
twice. Requests of one partition may overtake each other on their way to the server; a batch
refused with OUT_OF_ORDER_SEQUENCE_NUMBER or UNKNOWN_PRODUCER_ID while an earlier batch of its
partition was still unanswered was overtaken, and is sent again once the earlier ones are through,
one at a time, as Kafka's producer does.

With ``transactional.id`` the records belong to transactions (``init_transactions``,
``begin_transaction``, ``send_offsets_to_transaction``, ``commit_transaction``,
``abort_transaction``). Every transaction has its own epoch: the server's answer to EndTxn names
the next one, and every partition's sequence starts again at 0. Errors are classified as Kafka's
client does: fencing is fatal (the producer refuses everything after it), a failed batch makes the
transaction abortable (``txn_requires_abort()``), a timeout is retriable.
"""

from __future__ import annotations

import queue
import random
import threading
import time
from collections import deque
from typing import Any, Callable

from app.domain.partitioner import partition_for_key
from txlog import _config
from txlog._config import Spec
from txlog._http import Transport, segment
from txlog.errors import KafkaError, KafkaException
from txlog.message import TIMESTAMP_CREATE_TIME, Message, TopicPartition, b64, to_bytes, to_headers

INT32_MAX = 2**31 - 1
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

# Errors that end the producer: another instance took its transactional id over, or it may not act.
_FATAL_CODES = frozenset(
    {
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
        KafkaError.INVALID_PRODUCER_ID_MAPPING,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        KafkaError.TRANSACTIONAL_ID_NOT_FOUND,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.SASL_AUTHENTICATION_FAILED,
        KafkaError.INVALID_TRANSACTION_TIMEOUT,
    }
)
# Sequence errors that an overtaken request earns; a real gap if nothing earlier was unanswered.
_OVERTAKEN_CODES = frozenset({KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, KafkaError.UNKNOWN_PRODUCER_ID})

# Batch states.
_SENDING, _RETRY, _DONE, _FAILED = "sending", "retry", "done", "failed"

# Transaction states of the producer (as librdkafka's txn state machine, simplified).
_UNINIT, _READY, _IN_TXN, _COMMITTING, _ABORTING = "Init", "Ready", "InTransaction", "Committing", "Aborting"


class _Batch:
    """A sealed batch of one partition: once sent, its records, producer id, epoch and base
    sequence never change, so every resend is the same batch."""

    __slots__ = (
        "tp",
        "messages",
        "records",
        "callbacks",
        "state",
        "attempts",
        "retry_at",
        "created",
        "body",
        "sent_behind",
        "error",
    )

    def __init__(self, tp: tuple[str, int], messages: list[Message], records: list[dict], callbacks: list, now: float) -> None:
        self.tp = tp
        self.messages = messages
        self.records = records
        self.callbacks = callbacks
        self.state: str | None = None
        self.attempts = 0
        self.retry_at = 0.0
        self.created = now
        self.body: dict | None = None
        self.sent_behind = False  # sent while an earlier batch of the partition was unanswered
        self.error: KafkaError | None = None


class _Partition:
    """One partition's queue: the open batch, sealed batches not sent yet, sent ones in order."""

    __slots__ = ("messages", "records", "callbacks", "bytes", "deadline", "first_at", "ready", "in_flight", "next_sequence")

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.records: list[dict] = []
        self.callbacks: list = []
        self.bytes = 0
        self.deadline = 0.0
        self.first_at = 0.0
        self.ready: deque[_Batch] = deque()
        self.in_flight: deque[_Batch] = deque()
        self.next_sequence = 0


def _invalid_config(message: str) -> KafkaException:
    return _config.invalid(f"Failed to create producer: {message}")


def _state_error(message: str) -> KafkaException:
    return KafkaException(KafkaError(KafkaError._STATE, message))


class Producer:
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
        self._partitions: dict[tuple[str, int], _Partition] = {}
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
        self._txn_state = _UNINIT
        self._producer_id: int | None = None
        self._producer_epoch: int | None = None
        self._pid_wanted = False  # an idempotent producer asks for its id when it first sends

        self._work: queue.SimpleQueue[_Batch | None] = queue.SimpleQueue()
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
                pq = self._partitions[tp] = _Partition()
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
            raise _state_error("Producer is closed")
        if self._transactional_id is not None:
            if self._txn_state != _IN_TXN:
                raise _state_error(f"Transactional producer is in state {self._txn_state}: call begin_transaction() first")
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
            time.sleep(min(self._backoff_s * 2 ** (attempt - 1), self._backoff_max_s))

    def poll(self, timeout: float | None = None) -> int:
        """Serve delivery reports (and error callbacks), waiting up to ``timeout`` seconds for one
        (``None`` or negative: no limit). Answers how many were served."""
        deadline = _deadline(timeout)
        with self._cond:
            while not self._reports and not self._errors:
                remaining = _remaining(deadline)
                if remaining is not None and remaining <= 0:
                    return 0
                self._cond.wait(remaining)
        return self._serve()

    def flush(self, timeout: float | None = None) -> int:
        """Send every queued record at once (no lingering) and wait until all are reported, serving
        their callbacks. Answers how many are still waiting (0 unless ``timeout`` passed)."""
        deadline = _deadline(timeout)
        with self._cond:
            self._flushing += 1
            self._cond.notify_all()
        try:
            while True:
                self._serve()
                with self._cond:
                    if self._queued == 0 and not self._reports:
                        return 0
                    remaining = _remaining(deadline)
                    if remaining is not None and remaining <= 0:
                        return self._queued + len(self._reports)
                    if not self._reports:
                        self._cond.wait(remaining)
        finally:
            with self._cond:
                self._flushing -= 1

    def __len__(self) -> int:
        """Records produced and not yet reported to their callbacks."""
        with self._cond:
            return self._queued + len(self._reports)

    def _serve(self) -> int:
        """Call the waiting callbacks, outside the lock, in order."""
        served = 0
        call: tuple[Callable[..., Any], tuple[Any, ...]] | None
        while True:
            with self._cond:
                if self._errors:
                    err = self._errors.popleft()
                    call = (self._error_cb, (err,)) if self._error_cb is not None else None
                elif self._reports:
                    cb, error, msg = self._reports.popleft()
                    served += 1
                    call = (cb, (error, msg)) if cb is not None else None
                else:
                    self._cond.notify_all()  # a flush in another thread may be waiting for this
                    return served
            if call is not None:
                call[0](*call[1])

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

    # --- the sender and the requests -------------------------------------------------------------

    def _seal(self, tp: tuple[str, int], pq: _Partition) -> None:
        pq.ready.append(_Batch(tp, pq.messages, pq.records, pq.callbacks, pq.first_at))
        pq.messages, pq.records, pq.callbacks, pq.bytes = [], [], [], 0
        if self._sticky.get(tp[0]) == tp[1]:
            del self._sticky[tp[0]]

    def _sender(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    return
                now = time.monotonic()
                to_send: list[_Batch] = []
                wake = self._dispatch(now, to_send)
                need_pid = self._pid_wanted and self._producer_id is None and self._fatal is None
                if not to_send and not need_pid:
                    self._cond.wait(None if wake is None else max(wake - now, 0.0005))
                    continue
            if need_pid:
                self._init_idempotent_producer()
            for b in to_send:
                self._work.put(b)

    def _dispatch(self, now: float, out: list[_Batch]) -> float | None:
        """Seal what lingered long enough and start what may be sent; answers when to look again."""
        wake: float | None = None
        blocked = self._fatal is not None or self._txn_error is not None or self._purging
        for tp, pq in self._partitions.items():
            if pq.messages and (self._flushing or pq.deadline <= now):
                self._seal(tp, pq)
            elif pq.messages:
                wake = pq.deadline if wake is None else min(wake, pq.deadline)
            if blocked or not (pq.ready or pq.in_flight):
                continue
            if self._idempotent and self._producer_id is None:
                if self._transactional_id is None:
                    self._pid_wanted = True
                continue
            head = pq.in_flight[0] if pq.in_flight else None
            if head is not None and head.state == _RETRY:
                # Resends go in order, each once every batch before it is in.
                if head.retry_at > now:
                    wake = head.retry_at if wake is None else min(wake, head.retry_at)
                else:
                    self._start(pq, head, out)
                continue
            if any(b.state == _RETRY for b in pq.in_flight):
                continue  # nothing new overtakes a batch waiting to be sent again
            while pq.ready and len(pq.in_flight) < self._max_in_flight:
                b = pq.ready.popleft()
                pq.in_flight.append(b)
                self._start(pq, b, out)
        return wake

    def _start(self, pq: _Partition, b: _Batch, out: list[_Batch]) -> None:
        if b.body is None:
            body: dict[str, Any] = {"encoding": "base64", "records": b.records}
            if self._idempotent:
                body["producer_id"] = self._producer_id
                body["producer_epoch"] = self._producer_epoch
                body["base_sequence"] = pq.next_sequence
                pq.next_sequence = (pq.next_sequence + len(b.records)) % (INT32_MAX + 1)
            if self._transactional_id is not None:
                body["transactional_id"] = self._transactional_id
            b.body = body
        earlier = False
        for x in pq.in_flight:
            if x is b:
                break
            earlier = earlier or x.state != _DONE
        b.sent_behind = earlier
        b.attempts += 1
        b.state = _SENDING
        out.append(b)

    def _request_worker(self) -> None:
        while True:
            b = self._work.get()
            if b is None:
                return
            topic, partition = b.tp
            answer, err = None, None
            try:
                answer = self._transport.post(f"/v1/topics/{segment(topic)}/partitions/{partition}/records", b.body)
            except KafkaException as exc:
                err = exc.args[0]
            except Exception as exc:  # a bug must not leave the batch waiting forever
                err = KafkaError(KafkaError._FAIL, f"{type(exc).__name__}: {exc}")
            with self._cond:
                self._completed(b, answer, err)
                self._cond.notify_all()

    def _completed(self, b: _Batch, answer: dict | None, err: KafkaError | None) -> None:
        pq = self._partitions[b.tp]
        now = time.monotonic()
        if err is None:
            assert answer is not None
            b.state = _DONE
            base = answer["base_offset"]
            for i, m in enumerate(b.messages):
                m._offset = base + i
        elif self._fatal is not None:
            self._fail(b, self._fatal)
        elif self._txn_error is not None:
            self._fail(b, self._txn_error)
        elif self._purging:
            self._fail(b, KafkaError(KafkaError._PURGE_INFLIGHT, "Local: Purged in flight: the transaction is being aborted"))
        elif err.code() in _FATAL_CODES:
            self._fail(b, self._set_fatal(err))
        elif err.retriable() or self._overtaken(b, err):
            if b.attempts > self._retries:
                self._batch_failed(b, err)
            elif self._message_timeout_s and now - b.created > self._message_timeout_s:
                self._batch_failed(
                    b, KafkaError(KafkaError._MSG_TIMED_OUT, f"Local: Message timed out (last error: {err.str()})")
                )
            else:
                b.state = _RETRY
                if self._overtaken(b, err):
                    b.retry_at = now  # sent again as soon as the batches before it are in
                else:
                    delay = min(self._backoff_s * 2 ** (b.attempts - 1), self._backoff_max_s)
                    b.retry_at = now + delay * random.uniform(0.8, 1.2)
        else:
            self._batch_failed(b, err)
        self._report_done(pq)

    def _overtaken(self, b: _Batch, err: KafkaError) -> bool:
        """The server saw this batch before an earlier one of its partition that was still on its way."""
        return self._idempotent and b.sent_behind and err.code() in _OVERTAKEN_CODES

    def _batch_failed(self, b: _Batch, err: KafkaError) -> None:
        """A batch gave up. A plain producer loses only that batch; an idempotent one cannot go on
        with a gap in its sequence (fatal), a transactional one must abort the transaction."""
        if not self._idempotent:
            self._fail(b, err)
        elif self._transactional_id is not None:
            self._fail(b, self._set_abortable(err))
        else:
            self._fail(b, self._set_fatal(err))

    def _fail(self, b: _Batch, err: KafkaError) -> None:
        b.state = _FAILED
        b.error = err

    def _report_done(self, pq: _Partition) -> None:
        while pq.in_flight and pq.in_flight[0].state in (_DONE, _FAILED):
            self._report(pq.in_flight.popleft())

    def _report(self, b: _Batch) -> None:
        now = time.monotonic()
        for cb, m in zip(b.callbacks, b.messages):
            m._error = b.error
            m._latency = now - m._latency if m._latency is not None else None
            self._reports.append((cb, b.error, m))
        self._queued -= len(b.messages)

    def _fail_unsent(self, err: KafkaError) -> None:
        """Fail every record not on its way: open and sealed batches, and those waiting to be resent."""
        for tp, pq in self._partitions.items():
            if pq.messages:
                self._seal(tp, pq)
            while pq.ready:
                b = pq.ready.popleft()
                self._fail(b, err)
                self._report(b)
            for b in pq.in_flight:
                if b.state == _RETRY:
                    self._fail(b, err)
            self._report_done(pq)
        self._cond.notify_all()

    def _set_fatal(self, err: KafkaError) -> KafkaError:
        """Make the producer fatally failed (unless it already is); answer the error in force."""
        if self._fatal is not None:
            return self._fatal
        self._fatal = err.with_flags(fatal=True, retriable=False, txn_requires_abort=False)
        self._errors.append(self._fatal)
        self._fail_unsent(self._fatal)
        return self._fatal

    def _set_abortable(self, err: KafkaError) -> KafkaError:
        """Make the transaction abortable (unless it already is); answer the error in force."""
        if self._txn_error is not None:
            return self._txn_error
        self._txn_error = err.with_flags(txn_requires_abort=True, retriable=False, fatal=False)
        self._fail_unsent(self._txn_error)
        return self._txn_error

    def _init_idempotent_producer(self) -> None:
        """InitProducerId without a transactional id: a fresh producer id at epoch 0."""
        attempt = 0
        while True:
            try:
                answer = self._transport.post("/v1/producers", {"transactional_id": None})
            except KafkaException as exc:
                err = exc.args[0]
                attempt += 1
                if err.retriable() and not self._closed:
                    time.sleep(min(self._backoff_s * 2 ** (attempt - 1), self._backoff_max_s))
                    continue
                with self._cond:
                    self._set_fatal(err)
                return
            with self._cond:
                self._producer_id, self._producer_epoch = answer["producer_id"], answer["producer_epoch"]
                self._pid_wanted = False
                self._cond.notify_all()
            return

    # --- transactions ---------------------------------------------------------------------------

    def init_transactions(self, timeout: float | None = None) -> None:
        """InitProducerId for ``transactional.id``: fences every older instance of it (aborting or
        finishing what it left open) and readies this one. Retriable errors are retried until
        ``timeout`` seconds (default: ``transaction.timeout.ms``)."""
        self._require_transactional("init_transactions")
        with self._cond:
            self._raise_fatal()
            if self._txn_state != _UNINIT:
                raise _state_error(f"init_transactions() was already called (state {self._txn_state})")
        answer = self._coordinator_call(
            "/v1/producers",
            {"transactional_id": self._transactional_id, "transaction_timeout_ms": self._txn_timeout_ms},
            timeout,
            fatal_unless_retriable=True,
        )
        with self._cond:
            self._producer_id, self._producer_epoch = answer["producer_id"], answer["producer_epoch"]
            self._txn_state = _READY

    def begin_transaction(self) -> None:
        self._require_transactional("begin_transaction")
        with self._cond:
            self._raise_fatal()
            if self._txn_state == _UNINIT:
                raise _state_error("begin_transaction(): call init_transactions() first")
            if self._txn_state != _READY:
                raise _state_error(f"begin_transaction(): a transaction is already in progress (state {self._txn_state})")
            self._txn_state = _IN_TXN

    def send_offsets_to_transaction(
        self, positions: list[TopicPartition], group_metadata: Any, timeout: float | None = None
    ) -> None:
        """Commit the consumer's ``positions`` (the next offsets to read) for its group as part of
        the transaction: they become the group's committed offsets if and only if it commits."""
        transactional_id = self._require_transactional("send_offsets_to_transaction")
        with self._cond:
            self._raise_fatal()
            if self._txn_state != _IN_TXN:
                raise _state_error(f"send_offsets_to_transaction(): no transaction in progress (state {self._txn_state})")
            if self._txn_error is not None:
                raise KafkaException(self._txn_error)
            pid, epoch = self._producer_id, self._producer_epoch
        group_id = getattr(group_metadata, "group_id", group_metadata)
        if not isinstance(group_id, str) or not group_id:
            raise _config.invalid("send_offsets_to_transaction(): group_metadata must come from consumer_group_metadata()")
        offsets = [
            {"topic": tp.topic, "partition": tp.partition, "offset": tp.offset, "metadata": tp.metadata or ""}
            for tp in positions
            if tp.offset >= 0
        ]
        if not offsets:
            return
        try:
            self._coordinator_call(
                f"/v1/transactions/{segment(transactional_id)}/offsets",
                {"producer_id": pid, "producer_epoch": epoch, "group_id": group_id, "offsets": offsets},
                timeout,
            )
        except KafkaException as exc:
            err = exc.args[0]
            if err.fatal() or err.retriable():
                raise
            with self._cond:
                raise KafkaException(self._set_abortable(err)) from None

    def commit_transaction(self, timeout: float | None = None) -> None:
        """Flush, then commit. A record that failed makes the transaction abortable: this raises
        ``KafkaException`` whose error has ``txn_requires_abort()``; call ``abort_transaction()``.
        A retriable error (timeout) may be retried by calling ``commit_transaction()`` again."""
        transactional_id = self._require_transactional("commit_transaction")
        deadline = _deadline(timeout if timeout is not None else self._txn_timeout_ms / 1000)
        with self._cond:
            self._raise_fatal()
            if self._txn_state not in (_IN_TXN, _COMMITTING):
                raise _state_error(f"commit_transaction(): no transaction in progress (state {self._txn_state})")
            if self._txn_error is not None:
                raise KafkaException(self._txn_error)
        if self._txn_state == _IN_TXN:
            if self.flush(_remaining(deadline)) > 0:
                raise KafkaException(
                    KafkaError(
                        KafkaError._TIMED_OUT, "Failed to flush all outstanding messages within the timeout", retriable=True
                    )
                )
            with self._cond:
                self._raise_fatal()
                if self._txn_error is not None:
                    raise KafkaException(self._txn_error)
                self._txn_state = _COMMITTING
        self._end_txn(transactional_id, "commit", deadline)

    def abort_transaction(self, timeout: float | None = None) -> None:
        """Drop the records not sent yet, wait for those on their way, then abort: nothing of the
        transaction becomes visible to read_committed consumers, nor its offsets to the group."""
        transactional_id = self._require_transactional("abort_transaction")
        deadline = _deadline(timeout if timeout is not None else self._txn_timeout_ms / 1000)
        with self._cond:
            self._raise_fatal()
            if self._txn_state not in (_IN_TXN, _ABORTING):
                raise _state_error(f"abort_transaction(): no transaction to abort (state {self._txn_state})")
            self._txn_state = _ABORTING
            self._purging = True
            self._fail_unsent(KafkaError(KafkaError._PURGE_QUEUE, "Local: Purged in queue: the transaction was aborted"))
        while True:
            self._serve()
            with self._cond:
                self._raise_fatal()
                if self._queued == 0:
                    break
                remaining = _remaining(deadline)
                if remaining is not None and remaining <= 0:
                    raise KafkaException(
                        KafkaError(KafkaError._TIMED_OUT, "Records in flight did not complete within the timeout", retriable=True)
                    )
                if not self._reports:
                    self._cond.wait(remaining)
        self._serve()
        self._end_txn(transactional_id, "abort", deadline)

    def _end_txn(self, transactional_id: str, result: str, deadline: float | None) -> None:
        with self._cond:
            pid, epoch = self._producer_id, self._producer_epoch
        answer = self._coordinator_call(
            f"/v1/transactions/{segment(transactional_id)}/end",
            {"producer_id": pid, "producer_epoch": epoch, "result": result},
            _remaining(deadline),
            fatal_unless_retriable=True,
        )
        with self._cond:
            # The next transaction has its own epoch: every partition starts again at sequence 0.
            self._producer_id, self._producer_epoch = answer["producer_id"], answer["producer_epoch"]
            for pq in self._partitions.values():
                pq.next_sequence = 0
            self._txn_error = None
            self._purging = False
            self._txn_state = _READY

    def _coordinator_call(self, path: str, body: dict, timeout: float | None, fatal_unless_retriable: bool = False) -> Any:
        """One request to the transaction coordinator, retried while its errors are retriable and
        time remains. Fencing (and, with ``fatal_unless_retriable``, any lasting error) is fatal."""
        deadline = _deadline(timeout if timeout is not None else self._txn_timeout_ms / 1000)
        attempt = 0
        while True:
            try:
                return self._transport.post(path, body)
            except KafkaException as exc:
                err = exc.args[0]
            attempt += 1
            if err.retriable():
                delay = min(self._backoff_s * 2 ** (attempt - 1), self._backoff_max_s)
                remaining = _remaining(deadline)
                if remaining is None or remaining > delay:
                    time.sleep(delay)
                    continue
                raise KafkaException(err.with_flags(retriable=True))
            if err.code() in _FATAL_CODES or fatal_unless_retriable:
                with self._cond:
                    raise KafkaException(self._set_fatal(err))
            raise KafkaException(err)

    def _require_transactional(self, call: str) -> str:
        """The transactional id, which every call of the transactional API needs."""
        if self._transactional_id is None:
            raise KafkaException(
                KafkaError(
                    KafkaError._NOT_CONFIGURED, f"{call}(): the transactional API requires transactional.id to be configured"
                )
            )
        return self._transactional_id

    def _raise_fatal(self) -> None:
        if self._fatal is not None:
            raise KafkaException(self._fatal)


def _deadline(timeout: float | None) -> float | None:
    if timeout is None or timeout < 0:
        return None
    return time.monotonic() + timeout


def _remaining(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    return max(deadline - time.monotonic(), 0.0)
