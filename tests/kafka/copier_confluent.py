"""A consume-transform-produce copier written with confluent-kafka (librdkafka), as an application
that wants exactly-once writes it: run by ``test_exactly_once`` as a subprocess, killed with
SIGKILL at random moments and started again, while its gateway is killed and restarted too.

It reads every partition of the input topic read_committed, by ``assign()`` under a fixed group id
(no group membership: generation -1), from the group's committed offsets (OffsetFetch, asked
stable), and copies each poll's records to the same partition of the output topic, value + "!",
key kept. Each poll is one transaction: the records, then the input offsets after them sent to the
transaction (``send_offsets_to_transaction``), then the commit — so the offsets are the group's
exactly when the copies are visible. A failed transaction is aborted and the input read again from
the offsets of the last commit. It exits 0 once the group's offsets reach ``--ends``; 2 on a fatal
error (fenced, or anything the client cannot recover from); a restarted copier takes over.

Both clients set ``metadata.recovery.strategy=none`` (``--metadata-recovery`` sets another): with
librdkafka's default (re-bootstrap once every broker is down, as when the only gateway restarts)
the brokers it knew are decommissioned, and ``send_offsets_to_transaction`` can then wait forever,
past its own timeout, for the group coordinator it had cached (confluentinc/librdkafka #5511 and
#5456, open in 2.16; seen here with the default: the copier hung after the first gateway restart). Should a call still block far past
its timeout, a watchdog ends the copier (exit 3) for a new one to take over.

``--subscribe`` reads by group membership instead, with the next-generation protocol (KIP-848,
``group.protocol: consumer``): several copiers, each with a transactional id of its own, share the
input, and the coordinator moves partitions between them. Each transaction's offsets are sent with
the consumer's group metadata, so its TxnOffsetCommit carries the member id and member epoch: a
copier that lost a partition (fenced, or a zombie of an older epoch) is refused the commit
(KIP-447's fencing) and aborts. A partition goes only between transactions: a revocation (or a loss)
first ends the transaction in flight, committing it when its partitions are still the copier's and
aborting it when they are lost, and the records already read from a revoked partition are dropped,
to be read again by its next owner from the offsets committed. Records of an aborted transaction
are read again from the first offset of the batch. A subscribed copier does not stop on its own:
SIGTERM ends it (it leaves the group), as the test does once the group's offsets reach ``--ends``.

``--offsets-outside`` is the broken variant the test uses as its control: the offsets are
committed with OffsetCommit after the transaction commits, outside it. ``--crash-after-txn N``
ends the process (exit 9, as a kill would) right after the N-th commit, before anything else.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from copier_common import (  # a sibling: the copier runs as a script
    FATAL,
    WATCHDOG,
    arguments,
    crash_if_due,
    log,
    pause_before_commit,
    watched,
)

T = TypeVar("T")
CALL_TIMEOUT_S = 10  # below the watchdog's STUCK_AFTER_S


class Fatal(Exception):
    pass


def retried(what: str, step: Callable[[], T], deadline_s: float = 120) -> T:
    """``step`` until it succeeds; a retriable error (the gateway restarting, a timeout) is tried
    again, a fatal one ends the copier, any other error is the caller's."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            return watched(what, step)
        except KafkaException as exc:
            err: KafkaError = exc.args[0]
            if err.fatal():
                raise Fatal(f"{what}: {err}") from exc
            if not err.retriable() or time.monotonic() > deadline:
                raise
            log(f"{what}: {err.name()}, retrying")
            time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    args = arguments(
        argv,
        debug={"default": None, "help": "librdkafka debug contexts, for a copier that misbehaves"},
        subscribe={"action": "store_true", "help": "read by KIP-848 group membership instead of assign()"},
        **{
            "metadata-recovery": {"default": "none", "help": "librdkafka's metadata.recovery.strategy"},
            "transaction-timeout-ms": {"type": int, "default": 30_000, "help": "the producer's transaction.timeout.ms"},
        },
    )
    if args.subscribe:
        return subscribed(args)
    WATCHDOG.stuck_after_s = args.stuck_after_s or WATCHDOG.stuck_after_s
    WATCHDOG.start()
    ends = args.ends
    partitions = [TopicPartition(args.input, p) for p in range(len(ends))]
    consumer, producer = clients(args)
    try:
        # First the producer: its init fences a previous copier and ends its open transaction, so
        # that no offsets are pending when the committed ones are read.
        retried("init_transactions", lambda: producer.init_transactions(CALL_TIMEOUT_S))
        start = retried("committed", lambda: consumer.committed(partitions, CALL_TIMEOUT_S))
        committed = {tp.partition: max(tp.offset, 0) for tp in start}
        log(f"started at {committed}")
        consumer.assign([TopicPartition(args.input, p, o) for p, o in committed.items()])
        transactions = 0
        while any(committed[p] < end for p, end in enumerate(ends)):
            records = consumed(consumer.consume(args.max_batch, 0.5))
            if not records:
                continue
            positions = next_offsets(records, committed)
            if copy(args, consumer, producer, records, positions):
                transactions += 1
                crash_if_due(args, transactions)
                if args.offsets_outside:
                    offsets = [TopicPartition(args.input, p, o) for p, o in positions.items()]
                    retried("commit offsets", lambda: consumer.commit(offsets=offsets, asynchronous=False))
                committed = positions
            else:
                # aborted: read again from the last committed offsets
                consumer.assign([TopicPartition(args.input, p, o) for p, o in committed.items()])
        log(f"done at {committed} after {transactions} transactions")
        return 0
    except Fatal as exc:
        log(f"fatal: {exc}")
        return FATAL
    finally:
        watched("close", consumer.close)


def clients(args: argparse.Namespace, **consumer_config: Any) -> tuple[Consumer, Producer]:
    """The copier's consumer (read_committed, its offsets committed by the copier alone) and its
    transactional producer."""
    debug = {"debug": args.debug} if args.debug else {}
    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            **consumer_config,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": False,
            "metadata.recovery.strategy": args.metadata_recovery,
            **debug,
        }
    )
    producer = Producer(
        {
            "bootstrap.servers": args.bootstrap,
            "transactional.id": args.transactional_id,
            "linger.ms": 5,
            "transaction.timeout.ms": args.transaction_timeout_ms,
            "metadata.recovery.strategy": args.metadata_recovery,
            **debug,
        }
    )
    return consumer, producer


def consumed(messages: list[Any]) -> list[Any]:
    """The records among what ``consume`` answered, its errors logged."""
    for m in messages:
        if m.error() is not None:
            log(f"consume: {m.error()}")
    return [m for m in messages if m.error() is None]


def next_offsets(records: list[Any], since: dict[int, int]) -> dict[int, int]:
    """The offsets to commit once ``records`` are copied: ``since`` moved past each record."""
    positions = dict(since)
    for m in records:
        positions[m.partition()] = m.offset() + 1
    return positions


@dataclass
class Membership:
    """What a subscribed copier owns, and the transaction it has in flight (its batch's records)."""

    owned: set[int] = field(default_factory=set)
    in_flight: list[Any] | None = None
    stop: bool = False


def subscribed(args: argparse.Namespace) -> int:
    """--subscribe: copy the partitions the group gives this copier, until SIGTERM."""
    state = Membership()
    signal.signal(signal.SIGTERM, lambda *_: setattr(state, "stop", True))
    consumer, producer = clients(args, **{"group.protocol": "consumer"})

    def finish_in_flight(commit: bool) -> bool:
        """Ends the transaction in flight before partitions go: committed while they are still
        this copier's (a revocation), aborted when they are lost (fenced: the commit would be
        refused, and another member may own them already). Whether it committed."""
        records, state.in_flight = state.in_flight, None
        if records is None:
            return False
        if commit:
            try:
                retried("commit_transaction", lambda: producer.commit_transaction(CALL_TIMEOUT_S))
                return True
            except KafkaException as exc:
                if not exc.args[0].txn_requires_abort():
                    raise Fatal(f"transaction: {exc.args[0]}") from exc
        retried("abort_transaction", lambda: producer.abort_transaction(CALL_TIMEOUT_S))
        rewind(consumer, args.input, records, state.owned)
        return False

    def on_assign(_consumer: Consumer, partitions: list[TopicPartition]) -> None:
        state.owned |= {tp.partition for tp in partitions}
        log(f"assigned {sorted(tp.partition for tp in partitions)}: owns {sorted(state.owned)}")

    def on_revoke(_consumer: Consumer, partitions: list[TopicPartition]) -> None:
        finish_in_flight(commit=True)
        state.owned -= {tp.partition for tp in partitions}
        log(f"revoked {sorted(tp.partition for tp in partitions)}: owns {sorted(state.owned)}")

    def on_lost(_consumer: Consumer, partitions: list[TopicPartition]) -> None:
        state.owned -= {tp.partition for tp in partitions}
        finish_in_flight(commit=False)
        log(f"lost {sorted(tp.partition for tp in partitions)}: owns {sorted(state.owned)}")

    try:
        retried("init_transactions", lambda: producer.init_transactions(CALL_TIMEOUT_S))
        consumer.subscribe([args.input], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost)
        transactions = 0
        while not state.stop:
            messages = watched("consume", lambda: consumer.consume(args.max_batch, 0.5))
            # Records of a partition revoked meanwhile are not this copier's to copy any more.
            records = [m for m in consumed(messages) if m.partition() in state.owned]
            if not records:
                continue
            positions = next_offsets(records, {})
            state.in_flight = records
            if copy(args, consumer, producer, records, positions, finish=False):
                if finish_in_flight(commit=True):
                    transactions += 1
                    crash_if_due(args, transactions)
            else:
                log("aborted: reading the batch again")
                state.in_flight = None
                rewind(consumer, args.input, records, state.owned)
        log(f"stopped after {transactions} transactions")
        return 0
    except Fatal as exc:
        log(f"fatal: {exc}")
        return FATAL
    finally:
        watched("close", consumer.close)


def rewind(consumer: Consumer, topic: str, records: list[Any], owned: set[int]) -> None:
    """After an abort: the partitions still owned read again from the aborted batch's first
    records (those gone are read by their next owner from the offsets committed)."""
    first: dict[int, int] = {}
    for m in records:
        first.setdefault(m.partition(), m.offset())
    for partition, offset in sorted(first.items()):
        if partition in owned:
            try:
                consumer.seek(TopicPartition(topic, partition, offset))
            except KafkaException as exc:
                log(f"seek {partition}: {exc.args[0]}")


def copy(
    args: argparse.Namespace,
    consumer: Consumer,
    producer: Producer,
    records: list[Any],
    positions: dict[int, int],
    finish: bool = True,
) -> bool:
    """One transaction: the copies, then the offsets, then the commit. False if it was aborted.
    ``finish`` False leaves the commit to the caller (a subscribed copier's transaction in flight)."""
    producer.begin_transaction()
    try:
        for m in records:
            value = (m.value() or b"") + b"!"
            while True:
                try:
                    producer.produce(args.output, value, m.key(), partition=m.partition())
                    break
                except BufferError:
                    producer.poll(0.1)
        if not args.offsets_outside:
            offsets = [TopicPartition(args.input, p, o) for p, o in positions.items()]
            retried(
                "send_offsets_to_transaction",
                lambda: producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), CALL_TIMEOUT_S),
            )
        pause_before_commit(args)
        if finish:
            retried("commit_transaction", lambda: producer.commit_transaction(CALL_TIMEOUT_S))
        return True
    except KafkaException as exc:
        err = exc.args[0]
        if not err.txn_requires_abort():
            raise Fatal(f"transaction: {err}") from exc
        log(f"aborting: {err}")
        retried("abort_transaction", lambda: producer.abort_transaction(CALL_TIMEOUT_S))
        return False


if __name__ == "__main__":
    sys.exit(main())
