"""The consume-transform-produce copier of ``copier_confluent.py``, written with kafka-python 3.0
(its ``KafkaProducer(transactional_id=...)`` and ``KafkaConsumer``): the same topics, transform,
transactions and exit codes, run the same way by ``test_exactly_once``.

Each poll is one transaction: the copies (same partition, value + "!", key kept), the input offsets
after them (``send_offsets_to_transaction`` with the consumer's group metadata: generation -1, as it
is assigned its partitions, not a member), the commit. A transaction that fails short of a fatal
error is aborted and the input read again from the offsets of the last commit; a fatal one (fenced
by a newer copier) ends the process with 2.

kafka-python 3.0.12 drops a transactional request it tries to send while the coordinator's
connection is down (its sender's ``await_ready`` raising after the target node is chosen, so the
request is neither sent nor queued again): a transaction whose AddPartitionsToTxn, AddOffsetsToTxn
or EndTxn comes while the gateway restarts then waits for it forever, in
``send_offsets_to_transaction`` or ``commit_transaction``, which take no timeout. The calls run
under the copiers' watchdog (``copier_common.watched``): one blocked past ``STUCK_AFTER_S`` (a
gateway restarts in a few seconds) ends the copier (exit 3) for a new one to take over, as an
application would restart a wedged client.
"""

from __future__ import annotations

import argparse
import sys
import time

from copier_common import (  # a sibling: the copier runs as a script
    FATAL,
    WATCHDOG,
    arguments,
    crash_if_due,
    log,
    pause_before_commit,
    watched,
)
from kafka.errors import KafkaError, ProducerFencedError

from kafka import KafkaConsumer, KafkaProducer, OffsetAndMetadata, TopicPartition

# Reconnect to a restarted gateway within a second, not after kafka-python's backoff of up to 30 s.
RECONNECT = {"reconnect_backoff_ms": 50, "reconnect_backoff_max_ms": 1000}
# A transactional call blocked this long is wedged (see the module's doc): a gateway restarts in a
# few seconds.
STUCK_AFTER_S = 10


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    WATCHDOG.stuck_after_s = args.stuck_after_s or STUCK_AFTER_S
    WATCHDOG.start()
    ends = args.ends
    partitions = [TopicPartition(args.input, p) for p in range(len(ends))]

    producer = KafkaProducer(bootstrap_servers=args.bootstrap, transactional_id=args.transactional_id, linger_ms=5, **RECONNECT)
    consumer = KafkaConsumer(
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        isolation_level="read_committed",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **RECONNECT,
    )
    try:
        # The producer first: its init fences a previous copier and ends its open transaction.
        producer.init_transactions()
        consumer.assign(partitions)
        committed = {tp.partition: consumer.committed(tp) or 0 for tp in partitions}
        for tp in partitions:
            consumer.seek(tp, committed[tp.partition])
        log(f"started at {committed}")
        transactions = 0
        while any(committed[p] < end for p, end in enumerate(ends)):
            polled = consumer.poll(timeout_ms=500, max_records=args.max_batch)
            records = [r for batch in polled.values() for r in batch]
            if not records:
                continue
            positions = dict(committed)
            for tp, batch in polled.items():
                positions[tp.partition] = batch[-1].offset + 1
            if copy(args, consumer, producer, records, positions):
                transactions += 1
                crash_if_due(args, transactions)
                if args.offsets_outside:
                    consumer.commit({TopicPartition(args.input, p): OffsetAndMetadata(o, "", -1) for p, o in positions.items()})
                committed = positions
            else:
                for tp in partitions:  # aborted: read again from the last committed offsets
                    consumer.seek(tp, committed[tp.partition])
        log(f"done at {committed} after {transactions} transactions")
        return 0
    except ProducerFencedError as exc:
        log(f"fatal: {exc!r}")
        return FATAL
    finally:
        consumer.close()


def copy(
    args: argparse.Namespace, consumer: KafkaConsumer, producer: KafkaProducer, records: list, positions: dict[int, int]
) -> bool:
    """One transaction: the copies, then the offsets, then the commit. False if it was aborted."""
    producer.begin_transaction()
    try:
        for r in records:
            producer.send(args.output, (r.value or b"") + b"!", r.key, partition=r.partition)
        if not args.offsets_outside:
            offsets = {TopicPartition(args.input, p): OffsetAndMetadata(o, "", -1) for p, o in positions.items()}
            watched(
                "send_offsets_to_transaction", lambda: producer.send_offsets_to_transaction(offsets, consumer.group_metadata())
            )
        pause_before_commit(args)
        watched("commit_transaction", producer.commit_transaction)
        return True
    except ProducerFencedError:
        raise
    except KafkaError as exc:
        if "ProducerFencedError" in str(exc):  # a later call names the fatal error it is stuck in
            raise ProducerFencedError(str(exc)) from exc
        log(f"aborting: {exc!r}")
        abort(producer)
        return False


def abort(producer: KafkaProducer) -> None:
    """Abort, retried while the producer is still recovering from the failure (kafka-python first
    bumps its epoch, KIP-360, and refuses an abort meanwhile)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            watched("abort_transaction", producer.abort_transaction)
            return
        except ProducerFencedError:
            raise
        except KafkaError as exc:
            if "ProducerFencedError" in str(exc):
                raise ProducerFencedError(str(exc)) from exc
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


if __name__ == "__main__":
    sys.exit(main())
