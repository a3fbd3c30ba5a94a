"""Exactly-once consume-transform-produce with txlog's client, as in Kafka's transactions design.

Reads the input topic with read_committed, and for each batch of records, in one transaction:
writes each record transformed (its value upper-cased, its source in a header) to the output
topic, and commits the consumer's positions for its group. The transaction commits both or
neither, so a process killed at any moment and started again (with the same transactional id)
neither loses nor repeats a record: starting, it fences its predecessor and aborts whatever that
left open, then continues from the group's committed offsets.

    python examples/consume_transform_produce.py --input orders --output orders-upper \\
        --group upper --transactional-id upper-0 [--url http://127.0.0.1:8080]
"""

from __future__ import annotations

import argparse
import sys
import time

from txlog import OFFSET_BEGINNING, Consumer, KafkaException, Message, Producer, TopicPartition


def transform(msg: Message) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]:
    """The output record of one input record: same key, value upper-cased, source in a header."""
    source = f"{msg.topic()}:{msg.partition()}:{msg.offset()}".encode()
    value = msg.value()
    return msg.key(), value.upper() if value is not None else None, [("source", source)]


def rewind(consumer: Consumer) -> None:
    """After an aborted transaction: go back to the group's committed offsets."""
    for tp in consumer.committed(consumer.assignment(), timeout=30):
        consumer.seek(TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_BEGINNING))


def process(producer: Producer, consumer: Consumer, records: list[Message], output: str) -> bool:
    """One transaction: the transformed records and the consumer's positions. False if aborted."""
    producer.begin_transaction()
    try:
        for msg in records:
            key, value, headers = transform(msg)
            producer.produce(output, value=value, key=key, headers=headers)
        producer.send_offsets_to_transaction(consumer.position(consumer.assignment()), consumer.consumer_group_metadata())
        while True:
            try:
                producer.commit_transaction()
                return True
            except KafkaException as exc:
                if not exc.args[0].retriable():
                    raise
    except KafkaException as exc:
        if not exc.args[0].txn_requires_abort():
            raise  # fatal: fenced by a newer instance; this one must stop
        producer.abort_transaction()
        rewind(consumer)
        return False


def run(url: str | None, input_topic: str, output: str, group: str, transactional_id: str, batch: int, idle_exit_s: float) -> int:
    producer = Producer({"url": url, "transactional.id": transactional_id, "linger.ms": 5})
    consumer = Consumer(
        {
            "url": url,
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    producer.init_transactions()  # first: aborts what a predecessor left open, freeing its offsets
    consumer.subscribe([input_topic])
    transactions = 0
    idle_since = time.monotonic()
    try:
        while True:
            msgs = consumer.consume(batch, timeout=0.5)
            for m in msgs:
                if m.error() is not None:
                    print(f"consumer event: {m.error()}", file=sys.stderr)
            records = [m for m in msgs if m.error() is None]
            if not records:
                if idle_exit_s and time.monotonic() - idle_since > idle_exit_s:
                    break
                continue
            idle_since = time.monotonic()
            transactions += process(producer, consumer, records, output)
    finally:
        consumer.close()
        producer.close(timeout=5)
    print(f"committed {transactions} transactions")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=None, help="txlog's address (default: $TXLOG_URL, else http://127.0.0.1:8080)")
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--transactional-id", required=True)
    parser.add_argument("--batch", type=int, default=200, help="records per transaction, at most")
    parser.add_argument("--idle-exit-s", type=float, default=0, help="stop after this long without input (0: never)")
    a = parser.parse_args(argv)
    return run(a.url, a.input, a.output, a.group, a.transactional_id, a.batch, a.idle_exit_s)


if __name__ == "__main__":
    sys.exit(main())
