"""``ShareConsumer``: a member of a share group (KIP-932's queues on the log) over txlog's HTTP API.

Records are acquired, not read from a position: each record ``poll`` answers is locked to this
consumer (its member id, one per consumer) for the group's share.record.lock.duration.ms, and no
other member of the group gets it until it is acknowledged or the lock expires. Each record says
its delivery count (more than 1: delivered before, then released or its lock expired).

Acknowledgements are kept and sent together, as Kafka's share consumer sends them: with the next
acquisition (in its request, applied before it), or on ``commit()`` / ``close()``. In implicit mode (Kafka's
``share.acknowledgement.mode=implicit``, the default) the records of a poll that were not
acknowledged explicitly are accepted at the next poll; in explicit mode every record must be
acknowledged before the next poll. A consumer that stops without closing loses nothing: its
records go to the other members once their locks expire.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any, Callable, Iterator

from txlog import _config, _timing
from txlog._config import Spec
from txlog._http import Transport, segment
from txlog.errors import KafkaError, KafkaException
from txlog.message import TIMESTAMP_CREATE_TIME, Message, TopicPartition, unb64

ACCEPT = "accept"
RELEASE = "release"
REJECT = "reject"
_TYPES = (ACCEPT, RELEASE, REJECT)

_SPECS = {
    "url": Spec("str"),
    "token": Spec("str"),
    "group.id": Spec("str"),
    "share.acknowledgement.mode": Spec("str", "implicit", choices=("implicit", "explicit")),
    "fetch.wait.max.ms": Spec("int", 500, 0, 60_000),
    "max.partition.fetch.bytes": Spec("int", 1_048_576, 1, 2**31 - 1),
    "max.poll.records": Spec("int", 500, 1, 100_000),
    "request.timeout.ms": Spec("int", 30_000, 1, 900_000),
    "retry.backoff.ms": Spec("int", 100, 1, 300_000),
    "member.id": Spec("str"),
    "on_acknowledge": Spec("any"),
}
_ALIASES = {"bootstrap.servers": "url", "metadata.broker.list": "url", "fetch.message.max.bytes": "max.partition.fetch.bytes"}

# Keyword arguments and the properties they set.
_KEYWORDS = {
    "url": "url",
    "token": "token",
    "group": "group.id",
    "acknowledgement_mode": "share.acknowledgement.mode",
    "wait_ms": "fetch.wait.max.ms",
    "max_records": "max.poll.records",
    "max_bytes": "max.partition.fetch.bytes",
    "request_timeout_ms": "request.timeout.ms",
    "member_id": "member.id",
    "on_acknowledge": "on_acknowledge",
}

Key = tuple[str, int, int]  # topic, partition, offset

# How long the partitions of a subscription to several topics are used before they are read again
# (Kafka's metadata.max.age.ms; a subscription to one topic names only the topic, and the server
# reads its partitions at each acquisition).
METADATA_MAX_AGE_S = 300.0


class ShareMessage(Message):
    """A record acquired for a share group: a ``Message`` with its ``delivery_count()``."""

    __slots__ = ("_delivery_count",)

    def __init__(self, *args: Any, delivery_count: int = 1, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._delivery_count = delivery_count

    def delivery_count(self) -> int:
        """1 at the first delivery; each release or lock expiry adds one at the next."""
        return self._delivery_count

    def __repr__(self) -> str:
        return f"ShareMessage(topic={self._topic!r}, partition={self._partition}, offset={self._offset}, delivery_count={self._delivery_count})"


def _runs(offsets: dict[int, str]) -> list[tuple[int, int, str]]:
    """Offsets and their types as contiguous runs of one type, in offset order."""
    runs: list[tuple[int, int, str]] = []
    for offset in sorted(offsets):
        kind = offsets[offset]
        if runs and runs[-1][1] + 1 == offset and runs[-1][2] == kind:
            runs[-1] = (runs[-1][0], offset, kind)
        else:
            runs.append((offset, offset, kind))
    return runs


def _items(acks: dict[tuple[str, int], dict[int, str]]) -> list[dict]:
    """The acknowledgements as the HTTP API takes them: a range per run of one type."""
    return [
        {"topic": t, "partition": p, "first_offset": first, "last_offset": last, "type": kind}
        for (t, p), offsets in acks.items()
        for first, last, kind in _runs(offsets)
    ]


def _results(parts: Any) -> dict[TopicPartition, KafkaError | None]:
    """Each partition's acknowledgement error as the server answered it, None where they took effect."""
    out: dict[TopicPartition, KafkaError | None] = {}
    for part in parts:
        err = part["error"]
        out[TopicPartition(part["topic"], part["partition"])] = (
            None if err is None else KafkaError(int(err.get("kafka_code", -1)), str(err.get("message")), details=err)
        )
    return out


class ShareConsumer:
    """A share group's consumer: ``ShareConsumer(url, group, topics)`` or, as confluent-kafka's,
    ``ShareConsumer({"bootstrap.servers": url, "group.id": group})`` then ``subscribe(topics)``.

    Keyword arguments: ``acknowledgement_mode`` ("implicit" or "explicit"), ``wait_ms`` (the
    longest one acquisition long-polls, fetch.wait.max.ms), ``max_records`` (max.poll.records),
    ``max_bytes`` (per partition), ``member_id`` (a UUID of its own by default), ``token``,
    ``request_timeout_ms``, ``on_acknowledge`` (called with ``(partition, error_or_None,
    offsets_by_type)`` for each partition's acknowledgements once the server answered them).
    """

    def __init__(
        self, config: dict | str | None = None, group: str | None = None, topics: list[str] | None = None, **kwargs: Any
    ) -> None:
        conf: dict[str, Any] = dict(config) if isinstance(config, dict) else {}
        if isinstance(config, str):
            conf["url"] = config
        if group is not None:
            conf["group.id"] = group
        for name, value in kwargs.items():
            conf[_KEYWORDS.get(name, name)] = value
        values, _ = _config.read(conf, _SPECS, _ALIASES)
        if not values["group.id"]:
            raise _config.invalid("A share consumer needs group.id")
        if values["on_acknowledge"] is not None and not callable(values["on_acknowledge"]):
            raise _config.invalid('Invalid value for configuration property "on_acknowledge": expected a callable')
        self._group: str = values["group.id"]
        self._implicit = values["share.acknowledgement.mode"] == "implicit"
        self._wait_max_ms: int = values["fetch.wait.max.ms"]
        self._max_records: int = values["max.poll.records"]
        self._max_bytes: int = values["max.partition.fetch.bytes"]
        self._request_timeout_s: float = values["request.timeout.ms"] / 1000
        self._backoff_s: float = values["retry.backoff.ms"] / 1000
        self._on_acknowledge: Callable | None = values["on_acknowledge"]
        self.member_id: str = values["member.id"] or str(uuid.uuid4())
        self._transport = Transport(values["url"], values["token"], timeout_s=self._request_timeout_s)
        self._lock = threading.RLock()
        self._topics: list[str] = []
        self._partitions: list[tuple[str, int]] = []  # of a subscription to several topics, in turn
        self._partitions_until = 0.0
        self._turn = 0
        self._delivered: set[Key] = set()  # handed out by the last poll, not acknowledged yet
        self._pending: dict[tuple[str, int], dict[int, str]] = {}  # acknowledgements to send
        self._closed = False
        if topics:
            self.subscribe(topics)

    @property
    def group_id(self) -> str:
        return self._group

    # --- subscription -------------------------------------------------------------------------

    def subscribe(self, topics: list[str]) -> None:
        """Acquire from every partition of ``topics`` (the group's members share them all)."""
        if isinstance(topics, str):
            raise TypeError("subscribe() expects a list of topics")
        with self._lock:
            self._check_open()
            self._topics = list(dict.fromkeys(topics))
            self._partitions = []

    def unsubscribe(self) -> None:
        with self._lock:
            self._check_open()
            self._topics, self._partitions = [], []

    def subscription(self) -> list[str]:
        return list(self._topics)

    # --- acquiring ----------------------------------------------------------------------------

    def poll(self, timeout: float | None = None) -> list[ShareMessage]:
        """The next records acquired for this consumer, waiting up to ``timeout`` seconds (``None``
        or negative: until some come); empty when none came in time. The acknowledgements kept go
        with the acquisition (in implicit mode accepting the last poll's records not acknowledged);
        their outcome goes to ``on_acknowledge``."""
        deadline = _timing.deadline(timeout)
        with self._lock:
            self._check_open()
            if not self._topics:
                raise KafkaException(KafkaError(KafkaError._STATE, "poll(): not subscribed to any topic"))
            self._settle_delivered()
            while True:
                remaining = _timing.remaining(deadline)
                wait_ms = _timing.wait_ms(self._wait_max_ms, remaining)
                acks, self._pending = self._pending, {}
                try:
                    got = self._acquire(wait_ms, acks)
                except KafkaException as exc:
                    if acks:
                        self._report(acks, {TopicPartition(t, p): exc.args[0] for t, p in acks})
                    if not exc.args[0].retriable():
                        raise
                    got = []
                    time.sleep(min(self._backoff_s, remaining if remaining is not None else self._backoff_s))
                if got or (deadline is not None and time.monotonic() >= deadline):
                    return got

    def __iter__(self) -> Iterator[ShareMessage]:
        """The records, one at a time, without end (``close()`` from another thread stops it)."""
        while not self._closed:
            yield from self.poll(1.0)

    def _body(self, wait_ms: int) -> dict:
        body: dict[str, Any] = {
            "member_id": self.member_id,
            "max_records": self._max_records,
            "max_bytes": self._max_bytes,
            "wait_ms": wait_ms,
            "encoding": "base64",
        }
        if len(self._topics) == 1:
            body["topic"] = self._topics[0]  # the server starts each acquisition at a random partition
            return body
        if not self._partitions or time.monotonic() >= self._partitions_until:
            # Read again now and then: a topic may grow partitions (Kafka's metadata.max.age.ms).
            found: list[tuple[str, int]] = []
            for topic in self._topics:
                answer = self._transport.get(f"/v1/topics/{segment(topic)}")
                found += [(topic, p["partition"]) for p in answer["partitions"]]
            self._partitions, self._partitions_until = found, time.monotonic() + METADATA_MAX_AGE_S
        self._turn = (self._turn + 1) % len(self._partitions)
        order = self._partitions[self._turn :] + self._partitions[: self._turn]
        body["partitions"] = [{"topic": t, "partition": p} for t, p in order]
        return body

    def _acquire(self, wait_ms: int, acks: dict[tuple[str, int], dict[int, str]]) -> list[ShareMessage]:
        """One acquisition, carrying the acknowledgements kept (applied first, as a ShareFetch's)."""
        body = self._body(wait_ms)
        if acks:
            body["acknowledgements"] = _items(acks)
        answer = self._transport.post(
            f"/v1/share-groups/{segment(self._group)}/acquire", body, timeout_s=self._request_timeout_s + wait_ms / 1000
        )
        if acks:
            self._report(acks, _results(answer.get("acknowledgements") or ()))
        out: list[ShareMessage] = []
        for r in answer["records"]:
            headers = [(h["key"], unb64(h["value"])) for h in r.get("header_list") or ()]
            out.append(
                ShareMessage(
                    r["topic"],
                    r["partition"],
                    r["offset"],
                    unb64(r["key"]),
                    unb64(r["value"]),
                    headers,
                    (TIMESTAMP_CREATE_TIME, r["timestamp_ms"]),
                    delivery_count=r["delivery_count"],
                )
            )
        with_record = {(m.topic(), m.partition(), m.offset()) for m in out}
        for p in answer["partitions"]:
            for run in p["acquired"]:
                for offset in range(run["first_offset"], run["last_offset"] + 1):
                    if (p["topic"], p["partition"], offset) not in with_record:
                        # Acquired without a data record (compacted away, a control record): a gap.
                        self._pending.setdefault((p["topic"], p["partition"]), {})[offset] = "gap"
        self._delivered = {(m.topic(), m.partition(), m.offset()) for m in out}  # type: ignore[misc]  # acquired records have all three
        return out

    # --- acknowledging ------------------------------------------------------------------------

    def acknowledge(self, record: Message, type: str = ACCEPT) -> None:
        """Acknowledge one record of the last poll: ``accept`` (done), ``release`` (delivered
        again, to any member) or ``reject`` (unprocessable: archived, never delivered again). Sent
        with the next poll, ``commit()`` or ``close()``."""
        kind = str(type).lower()
        if kind not in _TYPES:
            raise KafkaException(
                KafkaError(KafkaError._INVALID_ARG, f"Unknown acknowledgement type {type!r}: accept, release or reject")
            )
        key = (record.topic(), record.partition(), record.offset())
        with self._lock:
            self._check_open()
            if key not in self._delivered:
                raise KafkaException(
                    KafkaError(
                        KafkaError._STATE,
                        f"{key[0]} [{key[1]}] offset {key[2]} was not delivered by the last poll or is acknowledged already",
                    )
                )
            self._delivered.discard(key)
            self._pending.setdefault((key[0], key[1]), {})[key[2]] = kind

    def renew(self, record: Message) -> None:
        """Extend the lock on a record of the last poll still being worked on: it runs again from
        now, for the group's share.record.lock.duration.ms. Sent at once (a lock about to expire
        cannot wait for the next poll); the record still needs its acknowledgement."""
        key = (record.topic(), record.partition(), record.offset())
        with self._lock:
            self._check_open()
            if key not in self._delivered:
                raise KafkaException(
                    KafkaError(
                        KafkaError._STATE,
                        f"{key[0]} [{key[1]}] offset {key[2]} was not delivered by the last poll or is acknowledged already",
                    )
                )
            results = self._send({(key[0], key[1]): {key[2]: "renew"}})
        err = next(iter(results.values()))
        if err is not None:
            raise KafkaException(err)

    def commit(self) -> dict[TopicPartition, KafkaError | None]:
        """Send the acknowledgements kept now (in implicit mode accepting the last poll's records
        not acknowledged): each partition's error, or None where they took effect. A partition's
        acknowledgements take effect whole or not at all (INVALID_RECORD_STATE when a lock expired
        and the record went to another member)."""
        with self._lock:
            self._check_open()
            self._settle_delivered()
            return self._send_acknowledgements()

    def _settle_delivered(self) -> None:
        if not self._delivered:
            return
        if not self._implicit:
            left = sorted(self._delivered)
            raise KafkaException(
                KafkaError(
                    KafkaError._STATE,
                    f"Explicit acknowledgement mode: {len(left)} record(s) of the last poll not acknowledged (first: "
                    f"{left[0][0]} [{left[0][1]}] offset {left[0][2]})",
                )
            )
        for topic, partition, offset in self._delivered:
            self._pending.setdefault((topic, partition), {})[offset] = ACCEPT
        self._delivered = set()

    def _send_acknowledgements(self) -> dict[TopicPartition, KafkaError | None]:
        pending, self._pending = self._pending, {}
        return self._send(pending) if pending else {}

    def _send(self, acks: dict[tuple[str, int], dict[int, str]]) -> dict[TopicPartition, KafkaError | None]:
        try:
            answer = self._transport.post(
                f"/v1/share-groups/{segment(self._group)}/acknowledge",
                {"member_id": self.member_id, "acknowledgements": _items(acks)},
            )
            results = _results(answer["partitions"])
        except KafkaException as exc:
            results = {TopicPartition(t, p): exc.args[0] for t, p in acks}
        self._report(acks, results)
        return results

    def _report(self, acks: dict[tuple[str, int], dict[int, str]], results: dict[TopicPartition, KafkaError | None]) -> None:
        if self._on_acknowledge is not None:
            for tp, err in results.items():
                by_type: dict[str, list[int]] = {}
                for offset, kind in sorted(acks.get((tp.topic, tp.partition), {}).items()):
                    by_type.setdefault(kind, []).append(offset)
                self._on_acknowledge(tp, err, by_type)

    # --- closing ------------------------------------------------------------------------------

    def close(self) -> None:
        """Send the acknowledgements kept and stop. In implicit mode the last poll's records not
        acknowledged are accepted; in explicit mode they are released (the group gets them
        again at once, as when a Kafka share consumer leaves its group)."""
        with self._lock:
            if self._closed:
                return
            try:
                if not self._implicit:
                    self._release_delivered()
                self._settle_delivered()
                self._send_acknowledgements()
            finally:
                self._closed = True
                self._transport.close()

    def _release_delivered(self) -> None:
        for topic, partition, offset in self._delivered:
            self._pending.setdefault((topic, partition), {})[offset] = RELEASE
        self._delivered = set()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("ShareConsumer closed")

    def __enter__(self) -> "ShareConsumer":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        """Close; leaving on an exception releases the last poll's records not acknowledged (in
        either mode): records whose handling failed are delivered again, not accepted."""
        if exc_type is not None and not self._closed:
            with self._lock:
                self._release_delivered()
        self.close()
