"""What the Kafka and share-group benchmarks read alike: py-spy's collapsed stacks, counted by
function, and the version of the Kafka client they drive."""

from __future__ import annotations

from collections import Counter
from typing import Iterator


def client_version() -> str:
    import confluent_kafka

    return f"{confluent_kafka.version()[0]} (librdkafka {confluent_kafka.libversion()[0]})"


def short_frame(frame: str) -> str:
    """``function (path)``: the line number dropped, so a function's lines add up."""
    name, _, where = frame.partition(" (")
    return f"{name} ({where.rstrip(')').rsplit(':', 1)[0]})"


def stacks(collapsed: str) -> Iterator[tuple[list[str], int]]:
    """py-spy's collapsed stacks: each stack's frames, outermost first (py-spy's thread and process
    frames left out), with its number of samples."""
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        yield [f for f in stack.split(";") if f and not f.startswith(("thread ", "process "))], int(count)


def function_counts(collapsed: str) -> tuple[int, Counter[str], Counter[str]]:
    """The samples in all, and per function (``short_frame``) the samples it is on the stack of
    (inclusive) and at the top of (self)."""
    total = 0
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    for frames, n in stacks(collapsed):
        total += n
        for f in {short_frame(f) for f in frames}:
            inclusive[f] += n
        if frames:
            own[short_frame(frames[-1])] += n
    return total, inclusive, own
