"""One member of a share group for ``test_share_group_faults``: it consumes a topic and acknowledges
every record as the record's value says, logging durably what it was given and what it acknowledged.

    python -m tests.chaos.share_worker kafka BOOTSTRAP GROUP TOPIC LOG
    python -m tests.chaos.share_worker http URL GROUP TOPIC LOG

``kafka`` is confluent-kafka's ShareConsumer through the gateway, ``http`` txlog's ShareConsumer over
the HTTP API; both in explicit acknowledgement mode. A value ``<n>:<kind>`` is acknowledged per
``decide``: ``accept``; ``release-once`` released at its first delivery and accepted after;
``reject``; ``poison`` released at every delivery (the delivery-count limit archives it).

The log is one JSON object a line, appended and fsync'ed at each step:
- ``{"e": "got", ...}`` for each record of a poll, with its delivery count, before any decision;
- ``{"e": "ack", ..., "t": type}`` before the acknowledgements are sent (the intent);
- ``{"e": "send", "ts": ...}`` when they are about to be sent, after the batch's processing;
- ``{"e": "res", ..., "t": type, "r": "ok" | "refused" | "unknown", "err": ...}`` once the server
  answered: ``ok`` it took them, ``refused`` it said they were not this member's to acknowledge
  (INVALID_RECORD_STATE: their lock had expired, they went back or to another member), ``unknown``
  the answer was lost (a gateway or a server killed meanwhile, a timeout): they may or may not have
  taken effect.
A worker killed between the intent and its result leaves the intent alone: unknown too. A worker
killed in the middle of a write leaves a line cut short; the next life starts on a new line.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any, Callable

ACCEPT, RELEASE, REJECT = "accept", "release", "reject"
PROCESSING_S = 0.05


def kind_of(value: str) -> str:
    """The kind a producer gave a value ``<n>:<kind>``."""
    return value.split(":", 1)[1]


def decide(value: str, delivery_count: int) -> str:
    """What a worker does with a record at its ``delivery_count``-th delivery: a function of the
    value and the count only, so every worker decides alike."""
    kind = kind_of(value)
    if kind == "poison":
        return RELEASE
    if kind == "reject":
        return REJECT
    if kind == "release-once" and delivery_count == 1:
        return RELEASE
    return ACCEPT


class Log:
    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        # A line the previous life was writing when killed ends here, apart from this life's.
        os.write(self.fd, b"\n")

    def write(self, entries: list[dict]) -> None:
        """Appended and on disk before it returns: what the checker reads survives a kill -9."""
        if entries:
            os.write(self.fd, "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in entries).encode())
            os.fsync(self.fd)


def run(
    log: Log,
    poll: Callable[[], list[Any]],
    ack: Callable[[Any, str], None],
    commit: Callable[[], dict[tuple[str, int], tuple[str, str | None]]],
) -> None:
    """Poll, decide, log the intent, acknowledge, log each partition's result; for ever."""
    while True:
        try:
            messages = poll()
        except Exception as exc:  # noqa: BLE001 — a server away: poll again, as an application would
            log.write([{"e": "error", "err": repr(exc)[:300], "pid": os.getpid()}])
            continue
        if not messages:
            continue
        got, intents = [], []
        for m in messages:
            value = m.value().decode()
            entry = {
                "p": m.partition(),
                "o": m.offset(),
                "v": value,
                "dc": m.delivery_count(),
                "pid": os.getpid(),
                "ts": time.time(),
            }
            got.append({"e": "got", **entry})
            intents.append({"e": "ack", **entry, "t": decide(value, m.delivery_count())})
        log.write(got + intents)
        time.sleep(PROCESSING_S)  # the work the decisions stand for, between the intent and the acknowledgement
        log.write([{"e": "send", "pid": os.getpid(), "ts": time.time()}])
        for m, intent in zip(messages, intents):
            ack(m, intent["t"])
        results = commit()
        done = []
        for m, intent in zip(messages, intents):
            result, error = results.get((m.topic(), m.partition()), ("unknown", "no answer"))
            done.append({**intent, "e": "res", "r": result, "err": error, "ts": time.time()})
        log.write(done)


def _outcome(err: Any) -> tuple[str, str | None]:
    """A partition's result: ok, refused by the server's rules, or unknown."""
    if err is None:
        return "ok", None
    error = err.args[0] if hasattr(err, "args") and err.args and hasattr(err.args[0], "name") else err
    name = error.name() if hasattr(error, "name") else str(error)
    return ("refused" if name == "INVALID_RECORD_STATE" else "unknown"), f"{name}: {error}"


def kafka(bootstrap: str, group: str, topic: str, log: Log) -> None:
    from confluent_kafka import AcknowledgeType, KafkaException, ShareConsumer

    types = {ACCEPT: AcknowledgeType.ACCEPT, RELEASE: AcknowledgeType.RELEASE, REJECT: AcknowledgeType.REJECT}
    consumer = ShareConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "share.acknowledgement.mode": "explicit",
            "metadata.recovery.strategy": "none",
            "socket.timeout.ms": 10_000,
        }
    )
    consumer.subscribe([topic])

    def poll() -> list[Any]:
        return [m for m in consumer.poll(0.5) or [] if m.error() is None]

    def commit() -> dict[tuple[str, int], tuple[str, str | None]]:
        try:
            answered = consumer.commit_sync(15)
        except KafkaException:
            return {}  # every partition unknown
        return {(tp.topic, tp.partition): _outcome(err) for tp, err in answered.items()}

    run(log, poll, lambda m, t: consumer.acknowledge(m, types[t]), commit)


def http(url: str, group: str, topic: str, log: Log) -> None:
    from txlog import ShareConsumer

    consumer = ShareConsumer(
        {"url": url, "group.id": group, "share.acknowledgement.mode": "explicit", "request.timeout.ms": 10_000}
    )
    consumer.subscribe([topic])

    def commit() -> dict[tuple[str, int], tuple[str, str | None]]:
        return {(tp.topic, tp.partition): _outcome(err) for tp, err in consumer.commit().items()}

    run(log, lambda: consumer.poll(0.5), consumer.acknowledge, commit)


def main() -> None:
    way, address, group, topic, path = sys.argv[1:6]
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    log = Log(path)
    (kafka if way == "kafka" else http)(address, group, topic, log)


if __name__ == "__main__":
    main()
