"""The sending half of ``Producer``: batches, the sender thread and request threads, the answers'
classification, and the delivery reports.

With ``enable.idempotence`` the producer has a producer id and numbers each partition's records
from 0: a batch keeps its base sequence for life, so a batch whose answer was lost is sent again
as it was and the server answers the duplicate with its original offsets, never appending it
twice. Requests of one partition may overtake each other on their way to the server; a batch
refused with OUT_OF_ORDER_SEQUENCE_NUMBER or UNKNOWN_PRODUCER_ID while an earlier batch of its
partition was still unanswered was overtaken, and is sent again once the earlier ones are through,
one at a time, as Kafka's producer does.

Errors are classified as Kafka's client does: fencing is fatal (the producer refuses everything
after it), a failed batch makes the transaction abortable (``txn_requires_abort()``), a timeout is
retriable.
"""

from __future__ import annotations

import queue
import random
import threading
import time
from collections import deque
from typing import Any, Callable

from txlog import _timing
from txlog._config import INT32_MAX
from txlog._http import Transport, segment
from txlog.errors import KafkaError, KafkaException
from txlog.message import Message

# Errors that end the producer: another instance took its transactional id over, or it may not act.
FATAL_CODES = frozenset(
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


class PartitionQueue:
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


class Sender:
    """What ``Producer`` sends with: it seals batches, starts them, takes in their answers and
    keeps the delivery reports until they are served. ``Producer.__init__`` sets every attribute
    below and starts the threads (``_sender``, ``_request_worker``)."""

    _transactional_id: str | None
    _idempotent: bool
    _max_in_flight: int
    _retries: int
    _backoff_s: float
    _backoff_max_s: float
    _message_timeout_s: float
    _error_cb: Callable | None
    _transport: Transport
    _cond: threading.Condition
    _partitions: dict[tuple[str, int], PartitionQueue]
    _sticky: dict[str, int]
    _reports: deque[tuple[Callable | None, KafkaError | None, Message]]
    _errors: deque[KafkaError]
    _queued: int
    _flushing: int
    _closed: bool
    _fatal: KafkaError | None
    _txn_error: KafkaError | None
    _purging: bool
    _producer_id: int | None
    _producer_epoch: int | None
    _pid_wanted: bool
    _txn_sent: bool
    _work: queue.SimpleQueue[_Batch | None]

    # --- delivery reports -----------------------------------------------------------------------

    def poll(self, timeout: float | None = None) -> int:
        """Serve delivery reports (and error callbacks), waiting up to ``timeout`` seconds for one
        (``None`` or negative: no limit). Answers how many were served."""
        deadline = _timing.deadline(timeout)
        with self._cond:
            while not self._reports and not self._errors:
                remaining = _timing.remaining(deadline)
                if remaining is not None and remaining <= 0:
                    return 0
                self._cond.wait(remaining)
        return self._serve()

    def flush(self, timeout: float | None = None) -> int:
        """Send every queued record at once (no lingering) and wait until all are reported, serving
        their callbacks. Answers how many are still waiting (0 unless ``timeout`` passed)."""
        deadline = _timing.deadline(timeout)
        with self._cond:
            self._flushing += 1
            self._cond.notify_all()
        try:
            while True:
                self._serve()
                with self._cond:
                    if self._queued == 0 and not self._reports:
                        return 0
                    remaining = _timing.remaining(deadline)
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

    # --- the sender and the requests -------------------------------------------------------------

    def _seal(self, tp: tuple[str, int], pq: PartitionQueue) -> None:
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

    def _start(self, pq: PartitionQueue, b: _Batch, out: list[_Batch]) -> None:
        if b.body is None:
            body: dict[str, Any] = {"encoding": "base64", "records": b.records}
            if self._idempotent:
                body["producer_id"] = self._producer_id
                body["producer_epoch"] = self._producer_epoch
                body["base_sequence"] = pq.next_sequence
                pq.next_sequence = (pq.next_sequence + len(b.records)) % (INT32_MAX + 1)
            if self._transactional_id is not None:
                body["transactional_id"] = self._transactional_id
                self._txn_sent = True
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
        elif err.code() in FATAL_CODES:
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
                    delay = _timing.backoff(b.attempts, self._backoff_s, self._backoff_max_s)
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

    def _report_done(self, pq: PartitionQueue) -> None:
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
                    time.sleep(_timing.backoff(attempt, self._backoff_s, self._backoff_max_s))
                    continue
                with self._cond:
                    self._set_fatal(err)
                return
            with self._cond:
                self._producer_id, self._producer_epoch = answer["producer_id"], answer["producer_epoch"]
                self._pid_wanted = False
                self._cond.notify_all()
            return
