"""The fault suites' checker: a run's history against the log it left, with the anomalies named as
Jepsen's Kafka workload names them.

A history is what the clients were told and saw, gathered by the test: each producer's
acknowledgements (value -> where), each consumer's polls in poll order (one list per session: a
session ends where the consumer was restarted or its partitions were assigned again, and offsets
may go back only across sessions), what each copier committed (its output log and its group's
offsets on its input), the records of aborted transactions, and the log as a read_committed reader
sees it once every transaction has ended. Values are unique: each producer numbers its own, and a
copier's transform of a unique value is unique.

The anomalies, each counted:
- lost write: a value acknowledged (by a producer, or by a copier's commit: an input record below
  its group's committed offset) that the log does not hold;
- duplicate: a value at two offsets of the log, or polled at two offsets;
- aborted read: a consumer polled a record of an aborted transaction, or one the committed log
  does not hold at all;
- poll skip: a consumer's consecutive polls of a partition in one session passed over a committed
  offset;
- non-monotonic poll: a consumer's polls of a partition in one session went back, or repeated;
- inconsistent offsets: two observations of one offset (an acknowledgement, a poll, the log)
  disagree on its value;
- unseen: a committed value of a topic a consumer followed to the end which that consumer never
  polled.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable

TopicPartition = tuple[str, int]
Where = tuple[str, int, int]  # topic, partition, offset
# Where a producer was told its record is. The offset is None when librdkafka acknowledged the record
# implicitly: an earlier request's answer was lost and a later batch of the same producer succeeded, whose
# sequence proves the earlier records written; their delivery reports carry no offset.
Acknowledged = tuple[str, int, "int | None"]
ANOMALIES = ("lost write", "duplicate", "aborted read", "poll skip", "non-monotonic poll", "inconsistent offsets", "unseen")


@dataclass
class Poll:
    topic: str
    partition: int
    offset: int
    value: str


@dataclass
class Copier:
    """What a consume-transform-produce client committed: its output is ``transform`` of each input
    record below ``offsets`` (its group's committed offsets on ``input``, per partition)."""

    name: str
    input: str
    output: str
    offsets: dict[int, int]
    transform: Callable[[int, int, str], str]  # (partition, offset, value) -> the output's value
    committed: int = 0  # transactions committed, for the load's summary
    aborted: int = 0


@dataclass
class History:
    acked: dict[str, dict[str, Acknowledged]] = field(default_factory=dict)  # producer -> value -> where
    produced: dict[str, int] = field(default_factory=dict)  # producer -> values sent
    polls: dict[str, list[list[Poll]]] = field(default_factory=dict)  # consumer -> its sessions
    followed: dict[str, set[str]] = field(default_factory=dict)  # consumer that ran to the end -> its topics
    copiers: list[Copier] = field(default_factory=list)
    aborted: set[Where] = field(default_factory=set)  # data records of aborted transactions
    log: dict[TopicPartition, list[tuple[int, str]]] = field(default_factory=dict)  # read_committed, in offset order
    faults: list[tuple[float, str]] = field(default_factory=list)  # (seconds since the start, what)


@dataclass
class Result:
    counts: dict[str, int]
    examples: dict[str, list[str]]

    def ok(self) -> bool:
        return not any(self.counts.values())

    def report(self) -> str:
        lines = []
        for name in ANOMALIES:
            n = self.counts[name]
            lines.append(f"  {name}: {n}" + (f"  e.g. {'; '.join(self.examples[name][:5])}" if n else ""))
        return "\n".join(lines)


def acknowledged_where(acknowledged: Acknowledged, places: list[Where]) -> bool:
    """Whether a record acknowledged at ``acknowledged`` is where the log has it (``places``): at that
    offset, or, acknowledged without one, in that partition."""
    topic, partition, offset = acknowledged
    if offset is None:
        return any(p[:2] == (topic, partition) for p in places)
    return acknowledged in places


def check(h: History) -> Result:
    counts = dict.fromkeys(ANOMALIES, 0)
    examples: dict[str, list[str]] = defaultdict(list)

    def found(name: str, what: str) -> None:
        counts[name] += 1
        examples[name].append(what)

    at: dict[Where, str] = {}  # the log, by offset
    where: dict[tuple[str, str], list[Where]] = defaultdict(list)  # (topic, value) -> its offsets in the log
    committed: dict[TopicPartition, list[int]] = {}
    for (topic, partition), records in h.log.items():
        committed[(topic, partition)] = [o for o, _ in records]
        for offset, value in records:
            at[(topic, partition, offset)] = value
            where[(topic, value)].append((topic, partition, offset))
    for (_topic, value), places in where.items():
        if len(places) > 1:
            found("duplicate", f"{value!r} at {places}")

    # Acknowledged writes: in the log, where acknowledged.
    for producer, acked in h.acked.items():
        for value, place in acked.items():
            if (place[0], value) not in where:
                found("lost write", f"{producer} acknowledged {value!r} at {place}")
            elif not acknowledged_where(place, where[(place[0], value)]):
                found(
                    "inconsistent offsets",
                    f"{producer} acknowledged {value!r} at {place}, the log has it at {where[(place[0], value)]}",
                )

    # Copies: each input record below the group's committed offset has its copy in the output.
    for c in h.copiers:
        for (topic, partition), records in h.log.items():
            if topic != c.input:
                continue
            for offset, value in records:
                if offset < c.offsets.get(partition, 0) and (c.output, c.transform(partition, offset, value)) not in where:
                    found(
                        "lost write",
                        f"copier {c.name} committed past {c.input}-{partition}@{offset} ({value!r}), no copy in {c.output}",
                    )

    # Polls.
    for consumer, sessions in h.polls.items():
        polled_at: dict[tuple[str, str], set[Where]] = defaultdict(set)
        for session in sessions:
            last: dict[TopicPartition, int] = {}
            for p in session:
                place = (p.topic, p.partition, p.offset)
                polled_at[(p.topic, p.value)].add(place)
                if place in h.aborted:
                    found("aborted read", f"{consumer} polled {p.value!r} at {place}, written by an aborted transaction")
                elif place not in at:
                    found("aborted read", f"{consumer} polled {p.value!r} at {place}, not in the committed log")
                elif at[place] != p.value:
                    found("inconsistent offsets", f"{consumer} polled {p.value!r} at {place}, the log has {at[place]!r}")
                tp = (p.topic, p.partition)
                previous = last.get(tp)
                if previous is not None:
                    if p.offset <= previous:
                        found("non-monotonic poll", f"{consumer} polled {tp} at {p.offset} after {previous}")
                    else:
                        skipped = [o for o in committed.get(tp, []) if previous < o < p.offset]
                        if skipped:
                            found("poll skip", f"{consumer} polled {tp} at {previous} then {p.offset}, skipping {skipped[:5]}")
                last[tp] = p.offset
        for (_topic, value), places in polled_at.items():
            if len(places) > 1:
                found("duplicate", f"{consumer} polled {value!r} at {sorted(places)}")

    # Unseen: every committed value of a followed topic polled by each consumer that ran to the end.
    for consumer, topics in h.followed.items():
        seen = {(p.topic, p.value) for session in h.polls.get(consumer, []) for p in session}
        for (topic, partition), records in h.log.items():
            if topic in topics:
                for offset, value in records:
                    if (topic, value) not in seen:
                        found("unseen", f"{consumer} never polled {value!r} at {(topic, partition, offset)}")
    return Result(counts, dict(examples))


def summary(h: History, result: Result) -> str:
    """The load, the faults and each anomaly's count: what a run prints, passing or not."""
    lines = ["load:"]
    for producer, acked in sorted(h.acked.items()):
        lines.append(f"  producer {producer}: {h.produced.get(producer, len(acked))} produced, {len(acked)} acknowledged")
    for c in h.copiers:
        copied = sum(c.offsets.values())
        lines.append(
            f"  copier {c.name}: {c.input} -> {c.output}, {copied} records copied, "
            f"{c.committed} transactions committed, {c.aborted} aborted"
        )
    for consumer, sessions in sorted(h.polls.items()):
        lines.append(f"  consumer {consumer}: {sum(len(s) for s in sessions)} records polled in {len(sessions)} session(s)")
    lines.append(f"faults ({len(h.faults)}):")
    lines.extend(f"  {t:7.1f} s  {what}" for t, what in h.faults)
    lines.append("anomalies:")
    lines.append(result.report())
    return "\n".join(lines)
