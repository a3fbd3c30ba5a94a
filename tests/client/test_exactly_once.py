"""Exactly-once, proved end to end with the client.

1. The consume-transform-produce example runs over 10,000 input records and is killed with
   SIGKILL at random points, again and again, each time started anew with the same transactional
   id. Afterwards the output topic, read with read_committed, holds every input record transformed
   exactly once, in order per key.
2. A TCP proxy between the producer and the server drops answers after the server has acted on
   the request. The idempotent producer sends each batch again as it was and the log holds every
   record exactly once, in order; a plain producer, under the same losses, writes duplicates.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict

import httpx
import pytest

from tests.client.logs import create_topic, group_offsets, read_topic
from tests.client.proxy import LossyProxy
from tests.support import ROOT, wait_until
from txlog import Producer, TopicPartition

EXAMPLE = ROOT / "examples" / "consume_transform_produce.py"
RECORDS = 10_000
KEYS = 40
PARTITIONS = 3
KILLS = 5


def _produce_input(url: str, topic: str) -> dict[tuple[int, int], bytes]:
    """The input records: keys k00..k39, each key's values numbered from 0. Answers each record's
    (partition, offset) and value."""
    delivered: dict[tuple[int, int], bytes] = {}
    errors = []

    def report(err, msg):  # type: ignore[no-untyped-def]
        if err is not None:
            errors.append(err)
        else:
            delivered[(msg.partition(), msg.offset())] = msg.value()

    p = Producer({"url": url, "enable.idempotence": True, "linger.ms": 10, "on_delivery": report})
    counters: Counter[str] = Counter()
    rng = random.Random(7)
    for _ in range(RECORDS):
        key = f"k{rng.randrange(KEYS):02d}"
        p.produce(topic, key=key, value=f"{key}:{counters[key]:05d}:payload")
        counters[key] += 1
    assert p.flush(120) == 0
    p.close()
    assert errors == []
    assert len(delivered) == RECORDS
    return delivered


@pytest.mark.slow
def test_consume_transform_produce_is_exactly_once_across_kill_9(server, tmp_path):
    rng = random.Random(20240611)
    suffix = uuid.uuid4().hex[:8]
    source, sink, group, tid = f"in-{suffix}", f"out-{suffix}", f"upper-{suffix}", f"upper-{suffix}"
    create_topic(server.url, source, PARTITIONS)
    create_topic(server.url, sink, PARTITIONS)
    inputs = _produce_input(server.url, source)

    log = tmp_path / "transform.log"

    def start() -> subprocess.Popen:
        with open(log, "ab") as out:
            return subprocess.Popen(
                [
                    sys.executable,
                    str(EXAMPLE),
                    "--url",
                    server.url,
                    "--input",
                    source,
                    "--output",
                    sink,
                    "--group",
                    group,
                    "--transactional-id",
                    tid,
                    "--batch",
                    "100",
                    "--idle-exit-s",
                    "3",
                ],
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def progress() -> int:
        return sum(group_offsets(server.url, group).values())

    killed_at = []
    for _ in range(KILLS):
        proc = start()
        target = progress() + rng.randint(200, 700)
        wait_until(lambda: proc.poll() is not None or progress() >= target, timeout=120, interval=0.02, message="progress")
        time.sleep(rng.uniform(0, 0.15))  # a random point: inside a transaction, or between two
        assert proc.poll() is None, log.read_text()
        proc.kill()  # SIGKILL
        proc.wait(timeout=30)
        killed_at.append(progress())
    assert killed_at[-1] < RECORDS, killed_at  # every kill interrupted work still to do

    final = start()
    assert final.wait(timeout=300) == 0, log.read_text()
    assert progress() == RECORDS

    output = read_topic(server.url, sink, PARTITIONS)
    sources = [h for recs in output.values() for r in recs for k, h in r["headers"] if k == "source"]
    assert len(sources) == sum(len(recs) for recs in output.values())
    seen = Counter(sources)
    duplicated = [s for s, n in seen.items() if n > 1]
    assert duplicated == []
    expected = {f"{source}:{p}:{o}".encode(): v for (p, o), v in inputs.items()}
    assert set(seen) == set(expected)  # nothing lost
    per_key: dict[bytes, list[int]] = defaultdict(list)
    for recs in output.values():
        for r in recs:
            src = dict(r["headers"])["source"]
            assert r["value"] == expected[src].upper()
            key, number, _ = r["value"].split(b":")
            assert r["key"] == key.lower()
            per_key[r["key"]].append(int(number))
    for key, numbers in per_key.items():
        assert numbers == list(range(len(numbers))), key  # in order per key, none missing
    aborted = sum(len(v) for v in read_topic(server.url, sink, PARTITIONS, "read_uncommitted").values()) - RECORDS
    print(f"kills at committed offsets {killed_at}; {aborted} output records of interrupted transactions aborted")


def _duplicate_batches(url: str, topic: str) -> float:
    """The server's count of batches of ``topic`` answered as duplicates (one worker: one count)."""
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("txlog_duplicate_batches_total{") and f'topic="{topic}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _count_values(url: str, topic: str, partitions: int) -> tuple[Counter[bytes], dict[int, list[bytes]]]:
    log = read_topic(url, topic, partitions, "read_uncommitted")
    return Counter(r["value"] for recs in log.values() for r in recs), {p: [r["value"] for r in recs] for p, recs in log.items()}


@pytest.mark.slow
def test_idempotent_retries_write_each_record_once_through_lost_answers(server, topic_name):
    create_topic(server.url, topic_name, PARTITIONS)
    n = 3000
    with LossyProxy(server.port, drop_answer=0.25, seed=11) as proxy:
        errors: list = []
        p = Producer(
            {
                "url": proxy.url,
                "enable.idempotence": True,
                "linger.ms": 2,
                "batch.num.messages": 20,
                "retry.backoff.ms": 5,
                "retry.backoff.max.ms": 50,
                "on_delivery": lambda err, msg: err and errors.append(err),
            }
        )
        for i in range(n):
            p.produce(topic_name, key=f"k{i % 50}", value=f"{i:05d}")
        assert p.flush(120) == 0
        p.close()
        dropped = proxy.dropped_answers
    assert errors == []
    assert dropped >= 20, dropped  # the losses happened, after the server had acted
    counts, per_partition = _count_values(server.url, topic_name, PARTITIONS)
    assert sum(counts.values()) == n
    assert set(counts.values()) == {1}
    for values in per_partition.values():
        assert values == sorted(values)  # produce order within each partition
    assert _duplicate_batches(server.url, topic_name) > 0  # resent batches were answered as duplicates


@pytest.mark.slow
def test_a_plain_producer_duplicates_through_the_same_lost_answers(server, topic_name):
    """The control: without idempotence a resent batch is appended again."""
    create_topic(server.url, topic_name, 1)
    with LossyProxy(server.port, drop_answer=0.25, seed=11) as proxy:
        p = Producer({"url": proxy.url, "linger.ms": 2, "batch.num.messages": 20, "retry.backoff.ms": 5})
        for i in range(600):
            p.produce(topic_name, value=f"{i:05d}", partition=0)
        assert p.flush(120) == 0
        p.close()
        dropped = proxy.dropped_answers
    counts, _ = _count_values(server.url, topic_name, 1)
    assert dropped > 0
    assert set(counts) == {f"{i:05d}".encode() for i in range(600)}
    assert sum(counts.values()) > 600  # duplicates


@pytest.mark.slow
def test_transactions_commit_exactly_once_through_lost_answers(server, topic_name):
    """Lost answers to produce, to the offsets and to EndTxn: each is sent again as it was (the
    same producer id, epoch and sequence), and every transaction commits exactly once."""
    create_topic(server.url, topic_name, 2)
    group = f"g-{uuid.uuid4().hex[:8]}"
    transactions, per_txn = 30, 20
    with LossyProxy(server.port, drop_answer=0.25, seed=5) as proxy:
        p = Producer({"url": proxy.url, "transactional.id": f"tid-{uuid.uuid4().hex[:8]}", "retry.backoff.ms": 5})
        p.init_transactions()
        for t in range(transactions):
            p.begin_transaction()
            for i in range(per_txn):
                p.produce(topic_name, value=f"{t:03d}-{i:02d}", partition=i % 2)
            p.send_offsets_to_transaction([TopicPartition(topic_name, 0, t + 1)], group)
            p.commit_transaction()
        p.close()
        dropped = proxy.dropped_answers
    assert dropped >= 10, dropped
    counts, per_partition = _count_values(server.url, topic_name, 2)
    assert sum(counts.values()) == transactions * per_txn and set(counts.values()) == {1}
    committed = read_topic(server.url, topic_name, 2)
    assert sum(len(v) for v in committed.values()) == transactions * per_txn
    for values in per_partition.values():
        assert values == sorted(values)
    assert group_offsets(server.url, group) == {(topic_name, 0): transactions}
