"""``txlog produce``: lines from stdin or a file as records (kafka-console-producer.sh), idempotent by
default, in transactions with ``--transactional-id``."""

from __future__ import annotations

from typing import IO, Any, Iterator

import click

from app.cli.common import EXIT_SERVER_ERROR, Client, Progress, client_command, parse_pairs, print_json
from txlog.errors import KafkaException


class BadLine(Exception):
    pass


def records(lines: IO[bytes], key_separator: bytes | None) -> Iterator[tuple[bytes | None, bytes]]:
    """(key, value) of each line, its line ending removed; with a separator the key is what precedes
    its first occurrence (a line without it is an error, as Kafka's parse.key)."""
    for number, line in enumerate(lines, 1):
        line = line.rstrip(b"\n")
        if line.endswith(b"\r"):
            line = line[:-1]
        if key_separator is None:
            yield None, line
            continue
        key, sep, value = line.partition(key_separator)
        if not sep:
            raise BadLine(f"line {number} has no key separator {key_separator.decode()!r}")
        yield key, value


class Deliveries:
    """What the delivery reports said: offsets per partition, and the failures."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.partitions: dict[int, list[int]] = {}  # partition -> [first offset, last offset, records]
        self.delivered = 0
        self.failed = 0
        self.first_error: Any = None

    def __call__(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.failed += 1
            if self.first_error is None:
                self.first_error = err
            return
        self.delivered += 1
        self.progress.advance()
        p, o = msg.partition(), msg.offset()
        seen = self.partitions.get(p)
        if seen is None:
            self.partitions[p] = [o, o, 1]
        else:
            seen[0], seen[1], seen[2] = min(seen[0], o), max(seen[1], o), seen[2] + 1


@click.command()
@click.argument("topic")
@click.option("--file", "source", type=click.File("rb"), default="-", show_default="stdin", help="Read the lines from this file.")
@click.option(
    "--partition",
    type=click.IntRange(min=0),
    default=None,
    help="Send every record to this partition (default: by key with Kafka's partitioner).",
)
@click.option(
    "--key-separator", default=None, metavar="SEP", help="Each line is KEY SEP VALUE (Kafka's parse.key=true, key.separator)."
)
@click.option("--header", "headers", multiple=True, metavar="KEY=VALUE", help="A header on every record (repeatable).")
@click.option("--transactional-id", default=None, help="Send in transactions of this transactional id, committed at the end.")
@click.option(
    "--transaction-size",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="With --transactional-id: commit every N records (default: one transaction for everything).",
)
@click.option(
    "--idempotence/--no-idempotence",
    default=True,
    show_default=True,
    help="Idempotent producer: retries never duplicate or reorder records.",
)
@click.option("--progress/--no-progress", default=None, help="Progress on stderr (default: when stderr is a terminal).")
@client_command
def produce(
    client: Client,
    topic: str,
    source: IO[bytes],
    partition: int | None,
    key_separator: str | None,
    headers: tuple[str, ...],
    transactional_id: str | None,
    transaction_size: int | None,
    idempotence: bool,
    progress: bool | None,
) -> int:
    """Send each line of stdin (or --file) as a record of TOPIC."""
    from txlog import Producer

    if transaction_size is not None and transactional_id is None:
        raise click.UsageError("--transaction-size goes with --transactional-id")
    record_headers = [(k, v.encode()) for k, v in parse_pairs(headers, "--header")] or None
    separator = key_separator.encode() if key_separator else None
    conf = client.config(enable_idempotence=idempotence or transactional_id is not None, transactional_id=transactional_id)
    producer = Producer(conf)
    shown = Progress("produced", progress)
    deliveries = Deliveries(shown)
    committed = 0
    in_transaction = 0
    try:
        if transactional_id is not None:
            producer.init_transactions()
            producer.begin_transaction()
        for key, value in records(source, separator):
            kwargs: dict[str, Any] = {"key": key, "headers": record_headers, "on_delivery": deliveries}
            if partition is not None:
                kwargs["partition"] = partition
            while True:
                try:
                    producer.produce(topic, value, **kwargs)
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    producer.poll(0.1)
            producer.poll(0)
            in_transaction += 1
            if transaction_size is not None and in_transaction >= transaction_size:
                producer.commit_transaction()
                committed += 1
                in_transaction = 0
                producer.begin_transaction()
        if transactional_id is not None:
            producer.commit_transaction()  # flushes, and fails if any record of it failed
            committed += 1
        else:
            producer.flush()
    except BadLine as exc:
        if transactional_id is not None:
            _abort_quietly(producer, transactional_id)
            done = "its transaction was aborted"
        else:
            producer.flush()  # the lines before it are sent, as Kafka's console producer does
            done = f"{deliveries.delivered} record(s) before it were produced"
        click.echo(f"error: {exc}; {done}", err=True)
        return EXIT_SERVER_ERROR
    except (KafkaException, KeyboardInterrupt):
        _abort_quietly(producer, transactional_id)
        raise
    finally:
        producer.close(0)  # everything delivered is reported by now; what is not stays undelivered
        shown.finish()
    summary: dict[str, Any] = {
        "topic": topic,
        "records": deliveries.delivered,
        "failed": deliveries.failed,
        "partitions": [
            {"partition": p, "first_offset": f, "last_offset": last, "records": n}
            for p, (f, last, n) in sorted(deliveries.partitions.items())
        ],
        "transactional_id": transactional_id,
        "transactions_committed": committed,
    }
    if client.json:
        print_json(summary)
    else:
        where = "; ".join(
            f"partition {p['partition']} offsets {p['first_offset']}-{p['last_offset']}" for p in summary["partitions"]
        )
        txns = f" in {committed} committed transaction(s) of {transactional_id}" if transactional_id else ""
        click.echo(f"Produced {deliveries.delivered} record(s) to {topic}{txns}" + (f" ({where})." if where else "."))
    if deliveries.failed:
        err = deliveries.first_error
        click.echo(
            f"error: {deliveries.failed} record(s) not delivered; the first: {err.name()} (code {err.code()}): {err.str()}",
            err=True,
        )
        return EXIT_SERVER_ERROR
    return 0


def _abort_quietly(producer: Any, transactional_id: str | None) -> None:
    """End an unfinished transaction (its records are dropped for read_committed readers); a producer
    that cannot (fenced, server away) leaves it to the server's timeout."""
    if transactional_id is None:
        return
    try:
        producer.abort_transaction(5.0)
    except KafkaException:  # the error that brought us here is the one reported
        pass
