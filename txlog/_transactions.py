"""The transactional API of ``Producer``.

With ``transactional.id`` the records belong to transactions (``init_transactions``,
``begin_transaction``, ``send_offsets_to_transaction``, ``commit_transaction``,
``abort_transaction``). Every transaction has its own epoch: the server's answer to EndTxn names
the next one, and every partition's sequence starts again at 0.
"""

from __future__ import annotations

import time
from typing import Any

from txlog import _config, _timing
from txlog._http import segment
from txlog._sender import FATAL_CODES, Sender, _Batch
from txlog.errors import KafkaError, KafkaException
from txlog.message import TopicPartition

# Transaction states of the producer (as librdkafka's txn state machine, simplified).
UNINIT, READY, IN_TXN, COMMITTING, ABORTING = "Init", "Ready", "InTransaction", "Committing", "Aborting"


def state_error(message: str) -> KafkaException:
    return KafkaException(KafkaError(KafkaError._STATE, message))


class Transactions(Sender):
    """``init_transactions``, ``begin_transaction``, ``send_offsets_to_transaction``,
    ``commit_transaction`` and ``abort_transaction``, for a producer with ``transactional.id``."""

    _txn_state: str
    _txn_timeout_ms: int
    _committing_batch: _Batch | None

    def init_transactions(self, timeout: float | None = None) -> None:
        """InitProducerId for ``transactional.id``: fences every older instance of it (aborting or
        finishing what it left open) and readies this one. Retriable errors are retried until
        ``timeout`` seconds (default: ``transaction.timeout.ms``)."""
        self._require_transactional("init_transactions")
        with self._cond:
            self._raise_fatal()
            if self._txn_state != UNINIT:
                raise state_error(f"init_transactions() was already called (state {self._txn_state})")
        answer = self._coordinator_call(
            "/v1/producers",
            {"transactional_id": self._transactional_id, "transaction_timeout_ms": self._txn_timeout_ms},
            timeout,
            fatal_unless_retriable=True,
        )
        with self._cond:
            self._producer_id, self._producer_epoch = answer["producer_id"], answer["producer_epoch"]
            self._txn_state = READY

    def begin_transaction(self) -> None:
        self._require_transactional("begin_transaction")
        with self._cond:
            self._raise_fatal()
            if self._txn_state == UNINIT:
                raise state_error("begin_transaction(): call init_transactions() first")
            if self._txn_state != READY:
                raise state_error(f"begin_transaction(): a transaction is already in progress (state {self._txn_state})")
            self._txn_state = IN_TXN

    def send_offsets_to_transaction(
        self, positions: list[TopicPartition], group_metadata: Any, timeout: float | None = None
    ) -> None:
        """Commit the consumer's ``positions`` (the next offsets to read) for its group as part of
        the transaction: they become the group's committed offsets if and only if it commits."""
        transactional_id = self._require_transactional("send_offsets_to_transaction")
        with self._cond:
            self._raise_fatal()
            if self._txn_state != IN_TXN:
                raise state_error(f"send_offsets_to_transaction(): no transaction in progress (state {self._txn_state})")
            if self._txn_error is not None:
                raise KafkaException(self._txn_error)
            pid, epoch = self._producer_id, self._producer_epoch
            self._txn_sent = True
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
        A retriable error (timeout) may be retried by calling ``commit_transaction()`` again.

        A transaction whose records are one batch not sent yet (nothing else of it went to the
        server) is committed with that batch, in one request (``"commit": true``)."""
        transactional_id = self._require_transactional("commit_transaction")
        deadline = _timing.deadline(timeout if timeout is not None else self._txn_timeout_ms / 1000)
        with self._cond:
            self._raise_fatal()
            if self._txn_state not in (IN_TXN, COMMITTING):
                raise state_error(f"commit_transaction(): no transaction in progress (state {self._txn_state})")
            if self._txn_error is not None:
                raise KafkaException(self._txn_error)
            if self._txn_state == IN_TXN:
                self._committing_batch = self._batch_with_commit()
                if self._committing_batch is not None:
                    self._txn_state = COMMITTING
            batch = self._committing_batch
        if batch is not None:
            self._commit_with_batch(batch, deadline)
            return
        if self._txn_state == IN_TXN:
            if self.flush(_timing.remaining(deadline)) > 0:
                raise KafkaException(
                    KafkaError(
                        KafkaError._TIMED_OUT, "Failed to flush all outstanding messages within the timeout", retriable=True
                    )
                )
            with self._cond:
                self._raise_fatal()
                if self._txn_error is not None:
                    raise KafkaException(self._txn_error)
                self._txn_state = COMMITTING
        self._end_txn(transactional_id, "commit", deadline)

    def _batch_with_commit(self) -> _Batch | None:
        """The transaction's only batch, sealed and started with ``"commit": true``; None if
        anything of the transaction went to the server already, or it is not one batch."""
        if self._txn_sent or self._producer_id is None:
            return None
        pending = [(tp, pq) for tp, pq in self._partitions.items() if pq.messages or pq.ready or pq.in_flight]
        if len(pending) != 1 or pending[0][1].ready or pending[0][1].in_flight:
            return None
        tp, pq = pending[0]
        self._seal(tp, pq)
        b = pq.ready.popleft()
        pq.in_flight.append(b)
        self._start(pq, b, [])
        assert b.body is not None
        b.body["commit"] = True
        return b

    def _commit_with_batch(self, b: _Batch, deadline: float | None) -> None:
        """Send ``b`` with the commit, again while its errors are retriable and time remains: the
        same request again is answered as the first was. A retriable error past ``deadline`` keeps
        it for the next ``commit_transaction()``; any other fails the batch, and the transaction
        must be aborted (or the producer is fenced)."""
        topic, partition = b.tp
        path = f"/v1/topics/{segment(topic)}/partitions/{partition}/records"
        assert b.body is not None  # started (``_batch_with_commit``)
        try:
            answer, err = self._coordinator_call(path, b.body, _timing.remaining(deadline)), None
        except KafkaException as exc:
            answer, err = None, exc.args[0]
            if err.retriable():
                raise
        with self._cond:
            self._committing_batch = None
            self._completed(b, answer, err)
            if err is None:
                ended = answer["transaction"]
                self._next_transaction(ended["producer_id"], ended["producer_epoch"])
            else:
                self._txn_state = IN_TXN  # abortable (or fatal): abort_transaction() ends it
            failure = self._fatal or self._txn_error
            self._cond.notify_all()
        self._serve()
        if err is not None:
            raise KafkaException(failure or err)

    def abort_transaction(self, timeout: float | None = None) -> None:
        """Drop the records not sent yet, wait for those on their way, then abort: nothing of the
        transaction becomes visible to read_committed consumers, nor its offsets to the group."""
        transactional_id = self._require_transactional("abort_transaction")
        deadline = _timing.deadline(timeout if timeout is not None else self._txn_timeout_ms / 1000)
        with self._cond:
            self._raise_fatal()
            if self._txn_state not in (IN_TXN, ABORTING):
                raise state_error(f"abort_transaction(): no transaction to abort (state {self._txn_state})")
            self._txn_state = ABORTING
            self._purging = True
            self._fail_unsent(KafkaError(KafkaError._PURGE_QUEUE, "Local: Purged in queue: the transaction was aborted"))
            if self._committing_batch is not None:  # its commit timed out: it is given up
                b, self._committing_batch = self._committing_batch, None
                self._completed(
                    b, None, KafkaError(KafkaError._PURGE_INFLIGHT, "Local: Purged in flight: the transaction was aborted")
                )
        while True:
            self._serve()
            with self._cond:
                self._raise_fatal()
                if self._queued == 0:
                    break
                remaining = _timing.remaining(deadline)
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
            _timing.remaining(deadline),
            fatal_unless_retriable=True,
        )
        with self._cond:
            self._next_transaction(answer["producer_id"], answer["producer_epoch"])

    def _next_transaction(self, producer_id: int, producer_epoch: int) -> None:
        """The transaction ended (the lock held): the next one has its own epoch, and every
        partition starts again at sequence 0."""
        self._producer_id, self._producer_epoch = producer_id, producer_epoch
        for pq in self._partitions.values():
            pq.next_sequence = 0
        self._txn_error = None
        self._purging = False
        self._txn_sent = False
        self._txn_state = READY

    def _coordinator_call(self, path: str, body: dict, timeout: float | None, fatal_unless_retriable: bool = False) -> Any:
        """One request to the transaction coordinator, retried while its errors are retriable and
        time remains. Fencing (and, with ``fatal_unless_retriable``, any lasting error) is fatal."""
        deadline = _timing.deadline(timeout if timeout is not None else self._txn_timeout_ms / 1000)
        attempt = 0
        while True:
            try:
                return self._transport.post(path, body)
            except KafkaException as exc:
                err = exc.args[0]
            attempt += 1
            if err.retriable():
                delay = _timing.backoff(attempt, self._backoff_s, self._backoff_max_s)
                remaining = _timing.remaining(deadline)
                if remaining is None or remaining > delay:
                    time.sleep(delay)
                    continue
                raise KafkaException(err.with_flags(retriable=True))
            if err.code() in FATAL_CODES or fatal_unless_retriable:
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
