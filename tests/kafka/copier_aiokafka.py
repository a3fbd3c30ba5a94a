"""The consume-transform-produce copier of ``copier_confluent.py``, written with aiokafka 0.14 (its
``AIOKafkaProducer(transactional_id=...)`` and ``AIOKafkaConsumer``): the same topics, transform,
transactions and exit codes.

It reads every partition of the input read_committed, by ``assign()`` under a fixed group id, from
the group's committed offsets, and makes each batch of records one transaction: the copies (same
partition, value + "!", key kept), the input offsets after them (``send_offsets_to_transaction``
with the group id), the commit. A transaction that fails short of a fatal error is aborted and the
input read again from the offsets of the last commit; a fatal one (fenced by a newer copier) ends
the process with 2. aiokafka's transactional calls take no timeout: they run under the copiers'
watchdog, and one blocked past its limit ends the copier (exit 3).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError, ProducerFenced
from copier_common import FATAL, WATCHDOG, arguments, crash_if_due, log  # a sibling: the copier runs as a script


async def watched(what: str, step: Any) -> Any:
    """``await step``, under the watchdog (``copier_common.watched`` for a coroutine)."""
    WATCHDOG.call = (what, time.monotonic())
    try:
        return await step
    finally:
        WATCHDOG.call = None


async def copy_all(args: argparse.Namespace) -> int:
    ends = args.ends
    partitions = [TopicPartition(args.input, p) for p in range(len(ends))]
    producer = AIOKafkaProducer(bootstrap_servers=args.bootstrap.split(","), transactional_id=args.transactional_id, linger_ms=5)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=args.bootstrap.split(","),
        group_id=args.group,
        isolation_level="read_committed",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    # The producer first: its init fences a previous copier and ends its open transaction.
    await watched("producer start", producer.start())
    await watched("consumer start", consumer.start())
    try:
        consumer.assign(partitions)
        committed = {}
        for tp in partitions:
            committed[tp.partition] = (await watched("committed", consumer.committed(tp))) or 0
            consumer.seek(tp, committed[tp.partition])
        log(f"started at {committed}")
        transactions = 0
        while any(committed[p] < end for p, end in enumerate(ends)):
            polled = await consumer.getmany(timeout_ms=500, max_records=args.max_batch)
            records = [r for batch in polled.values() for r in batch]
            if not records:
                continue
            positions = dict(committed)
            for tp, batch in polled.items():
                positions[tp.partition] = batch[-1].offset + 1
            if await copy(args, producer, records, positions):
                transactions += 1
                crash_if_due(args, transactions)
                committed = positions
            else:
                for tp in partitions:  # aborted: read again from the last committed offsets
                    consumer.seek(tp, committed[tp.partition])
        log(f"done at {committed} after {transactions} transactions")
        return 0
    except ProducerFenced as exc:
        log(f"fatal: {exc!r}")
        return FATAL
    finally:
        await consumer.stop()
        await producer.stop()


async def copy(args: argparse.Namespace, producer: AIOKafkaProducer, records: list, positions: dict[int, int]) -> bool:
    """One transaction: the copies, then the offsets, then the commit. False if it was aborted."""
    await watched("begin_transaction", producer.begin_transaction())
    try:
        for r in records:
            await producer.send(args.output, (r.value or b"") + b"!", r.key, partition=r.partition)
        offsets = {TopicPartition(args.input, p): o for p, o in positions.items()}
        await watched("send_offsets_to_transaction", producer.send_offsets_to_transaction(offsets, args.group))
        if args.pause_ms:
            await asyncio.sleep(args.pause_ms / 1000)
        await watched("commit_transaction", producer.commit_transaction())
        return True
    except ProducerFenced:
        raise
    except KafkaError as exc:
        log(f"aborting: {exc!r}")
        await watched("abort_transaction", producer.abort_transaction())
        return False


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    WATCHDOG.stuck_after_s = args.stuck_after_s or WATCHDOG.stuck_after_s
    WATCHDOG.start()
    return asyncio.run(copy_all(args))


if __name__ == "__main__":
    sys.exit(main())
