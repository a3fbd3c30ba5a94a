"""``txlog consume``: records of a topic on stdout (kafka-console-consumer.sh), at either isolation
level, from the beginning, an offset or a group's committed offsets; to the end of the log, or
following it."""

from __future__ import annotations

import os
import sys
from typing import TextIO

import click

from app.cli.common import EXIT_SERVER_ERROR, Client, Progress, client_command, print_json_line
from txlog._http import segment
from txlog.message import Message, b64

START = {"earliest", "latest"}


def _start_offset(value: str | None, from_beginning: bool) -> str | int:
    if from_beginning:
        if value not in (None, "earliest"):
            raise click.UsageError("--from-beginning and --offset disagree")
        return "earliest"
    if value is None:
        return "earliest"
    if value in START:
        return value
    try:
        offset = int(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not an offset, earliest or latest", param_hint="--offset") from None
    if offset < 0:
        raise click.BadParameter("an offset is not negative", param_hint="--offset")
    return offset


def _text(data: bytes | None) -> str | dict | None:
    """Bytes for JSON: text when they are UTF-8, else ``{"base64": ...}``."""
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": b64(data)}


def _shown(data: bytes | None) -> str:
    return "null" if data is None else data.decode("utf-8", "backslashreplace")


@click.command()
@click.argument("topic")
@click.option("--partition", type=click.IntRange(min=0), default=None, help="Only this partition (default: all of them).")
@click.option(
    "--offset",
    default=None,
    metavar="OFFSET|earliest|latest",
    help="Where to start without a committed group offset (default: earliest). A number needs --partition.",
)
@click.option("--from-beginning", is_flag=True, help="Start at the log start (the same as --offset earliest).")
@click.option("--group", default=None, help="Consume as this group: start at its committed offsets and commit what was read.")
@click.option(
    "--share-group",
    default=None,
    metavar="GROUP",
    help="Consume as a member of this share group: records are acquired (each by one member of the group), "
    "printed, then accepted; the group's configs say where it starts and its isolation level.",
)
@click.option(
    "--reject",
    "share_ack",
    flag_value="reject",
    default=None,
    help="With --share-group: reject the records printed (archived, never delivered again) instead of accepting them.",
)
@click.option(
    "--release",
    "share_ack",
    flag_value="release",
    help="With --share-group: release the records printed (delivered again, to any member) instead of accepting them.",
)
@click.option(
    "--isolation-level",
    type=click.Choice(["read_uncommitted", "read_committed"]),
    default="read_uncommitted",
    show_default=True,
    help="read_committed: only committed records, up to the last stable offset.",
)
@click.option("--max-messages", type=click.IntRange(min=1), default=None, metavar="N", help="Stop after N records.")
@click.option("--follow", "-f", is_flag=True, help="Keep waiting for new records (default: stop at the end of the log).")
@click.option("--print-key", is_flag=True, help="Print each record's key before its value.")
@click.option("--print-headers", is_flag=True, help="Print each record's headers (k:v,k:v) before its key and value.")
@click.option("--print-offset", is_flag=True, help="Print each record's partition and offset first.")
@click.option("--print-timestamp", is_flag=True, help="Print each record's timestamp (epoch ms) first.")
@click.option("--key-separator", default="\t", show_default="tab", help="Between the printed fields.")
@click.option(
    "--progress/--no-progress",
    default=None,
    help="A count of records read on stderr (default: when stderr is a terminal and stdout is not).",
)
@client_command
def consume(
    client: Client,
    topic: str,
    partition: int | None,
    offset: str | None,
    from_beginning: bool,
    group: str | None,
    share_group: str | None,
    share_ack: str | None,
    isolation_level: str,
    max_messages: int | None,
    follow: bool,
    print_key: bool,
    print_headers: bool,
    print_offset: bool,
    print_timestamp: bool,
    key_separator: str,
    progress: bool | None,
) -> int:
    """Print TOPIC's records, one per line (with --json one JSON object per line)."""
    from txlog import Consumer, TopicPartition
    from txlog.errors import KafkaError, KafkaException

    printer = _Printer(client.json, print_key, print_headers, print_offset, print_timestamp, key_separator)
    if share_group is not None:
        if group is not None or offset is not None or from_beginning or partition is not None:
            raise click.UsageError(
                "--share-group does not go with --group, --offset, --from-beginning or --partition "
                "(the share group's configs say where it starts; it reads every partition)"
            )
        return _consume_shared(client, topic, share_group, share_ack or "accept", max_messages, follow, printer, progress)
    if share_ack is not None:
        raise click.UsageError("--reject and --release go with --share-group")
    start = _start_offset(offset, from_beginning)
    if isinstance(start, int) and partition is None:
        raise click.UsageError("--offset with a number needs --partition")
    if isinstance(start, int) and group is not None:
        raise click.UsageError("--offset with a number does not go with --group (the group's offsets say where to start)")
    described = client.http.get(f"/v1/topics/{segment(topic)}")
    partitions = [p["partition"] for p in described["partitions"]]
    if partition is not None:
        if partition not in partitions:
            raise KafkaException(
                KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PARTITION, f"Topic-partition {topic}-{partition} does not exist")
            )
        partitions = [partition]

    conf = client.config(
        isolation_level=isolation_level,
        auto_offset_reset=start if isinstance(start, str) else "earliest",
        enable_partition_eof=True,
        enable_auto_commit=False,
    )
    conf["group.id"] = group if group is not None else f"txlog-console-consumer-{os.getpid()}"
    consumer = Consumer(conf)
    if group is not None:
        consumer.assign([TopicPartition(topic, p) for p in partitions])  # the group's committed offsets, else the reset
    else:
        logical = {"earliest": -2, "latest": -1}
        consumer.assign([TopicPartition(topic, p, start if isinstance(start, int) else logical[start]) for p in partitions])

    shown = Progress("consumed", progress if progress is not None else (None if not sys.stdout.isatty() else False))
    at_end: set[int | None] = set()  # partitions at their end (a message's partition() is typed optional)
    count = 0
    out = sys.stdout
    try:
        while max_messages is None or count < max_messages:
            msg = consumer.poll(1.0 if follow else 5.0)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    at_end.add(msg.partition())
                    if not follow and at_end >= set(partitions):
                        break
                    continue
                raise KafkaException(err)
            at_end.discard(msg.partition())
            count += 1
            shown.advance()
            printer.write(msg, out)
            if follow:
                out.flush()
        if group is not None:  # the positions reached: past the records handed out, and past markers
            reached = [tp for tp in consumer.position(consumer.assignment()) if tp.offset >= 0]
            if reached:
                consumer.commit(offsets=reached, asynchronous=False)
    finally:
        out.flush()
        shown.finish()
        consumer.close()
    click.echo(f"Processed a total of {count} messages", err=True)
    return 0


class _Printer:
    """How each record is printed: a JSON object per line, or the fields asked for."""

    def __init__(self, as_json: bool, key: bool, headers: bool, offset: bool, timestamp: bool, separator: str) -> None:
        self.json, self.key, self.headers, self.offset, self.timestamp, self.separator = (
            as_json,
            key,
            headers,
            offset,
            timestamp,
            separator,
        )

    def write(self, msg: Message, out: TextIO, delivery_count: int | None = None) -> None:
        if self.json:
            line: dict = {
                "topic": msg.topic(),
                "partition": msg.partition(),
                "offset": msg.offset(),
                "timestamp_ms": msg.timestamp()[1],
                "key": _text(msg.key()),
                "value": _text(msg.value()),
                "headers": [[k, _text(v)] for k, v in (msg.headers() or [])],
            }
            if delivery_count is not None:
                line["delivery_count"] = delivery_count
            print_json_line(line)
            return
        parts = []
        if self.timestamp:
            parts.append(f"CreateTime:{msg.timestamp()[1]}")
        if self.offset:
            parts += [f"Partition:{msg.partition()}", f"Offset:{msg.offset()}"]
            if delivery_count is not None:
                parts.append(f"DeliveryCount:{delivery_count}")
        if self.headers:
            parts.append(",".join(f"{k}:{_shown(v)}" for k, v in (msg.headers() or [])) or "NO_HEADERS")
        if self.key:
            parts.append(_shown(msg.key()))
        parts.append(_shown(msg.value()))
        out.write(self.separator.join(parts) + "\n")


def _consume_shared(
    client: Client,
    topic: str,
    group: str,
    ack: str,
    max_messages: int | None,
    follow: bool,
    printer: _Printer,
    progress: bool | None,
) -> int:
    """Acquire TOPIC's records as a member of the share group, print each and acknowledge it with
    ``ack``. Records acquired and not printed (past --max-messages, or on an interruption) are
    released: the group gets them again at once. Without --follow it stops when no
    record can be acquired."""
    from txlog import ShareConsumer

    conf = client.config()
    consumer = ShareConsumer(
        {**conf, "group.id": group, "share.acknowledgement.mode": "explicit"},
        topics=[topic],
        max_records=min(500, max_messages or 500),
        wait_ms=1000 if follow else 500,
    )
    shown = Progress("consumed", progress if progress is not None else (None if not sys.stdout.isatty() else False))
    count = 0
    failed: list = []
    out = sys.stdout
    try:
        while max_messages is None or count < max_messages:
            got = consumer.poll(1.0)
            if not got and not follow:
                break
            for msg in got:
                if max_messages is not None and count >= max_messages:
                    consumer.acknowledge(msg, "release")  # acquired past --max-messages: the group gets it again
                    continue
                printer.write(msg, out, msg.delivery_count())
                consumer.acknowledge(msg, ack)
                count += 1
                shown.advance()
            if follow:
                out.flush()
        results = consumer.commit()
        failed = [(tp, err) for tp, err in results.items() if err is not None]
        for tp, err in failed:
            click.echo(f"error: acknowledging {tp.topic}-{tp.partition}: {err.name()} (code {err.code()}): {err.str()}", err=True)
    finally:
        out.flush()
        shown.finish()
        consumer.close()
    verb = {"accept": "accepted", "reject": "rejected", "release": "released"}[ack]
    click.echo(f"Processed a total of {count} messages ({verb})", err=True)
    return EXIT_SERVER_ERROR if failed else 0
