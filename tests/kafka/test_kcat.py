"""kcat (Debian's 1.7.1 on librdkafka 2.0.2) against a real gateway: the metadata listing (-L),
producing keyed records (-P -K) uncompressed, gzip and snappy (-z) — librdkafka before 2.11.1
compresses only when Produce v0 is advertised (KAFKA-18659), so the debug log is checked for the
codec actually used — and in a transaction (-X transactional.id), and consuming from the beginning
to the end (-C -o beginning -e), read_committed included."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid

import pytest
from sqlalchemy import text

from app.services import Broker, topics
from tests.kafka.conftest import GatewayProcess
from tests.kafka.test_fetch import transactions_log

KCAT = shutil.which("kcat")
pytestmark = pytest.mark.skipif(KCAT is None, reason="kcat is not installed (apt-get install kcat)")


@pytest.fixture
def topic(store: Broker) -> str:
    name = f"k-{uuid.uuid4().hex[:10]}"
    topics.create_topic(store, name, 2)
    return name


def kcat(gateway: GatewayProcess, *args: str, stdin: str | None = None, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    assert KCAT is not None
    done = subprocess.run([KCAT, "-b", gateway.bootstrap, *args], input=stdin, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"kcat {' '.join(args)} exited with {done.returncode}:\n{done.stderr[-3000:]}"
    return done


def consume(gateway: GatewayProcess, topic: str, partition: int, *extra: str) -> list[dict]:
    """Every record of the partition from the beginning, as kcat's JSON envelopes."""
    out = kcat(gateway, "-C", "-t", topic, "-p", str(partition), "-o", "beginning", "-e", "-J", *extra).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_kcat_lists_the_broker_and_the_topics_with_their_partitions(gateway: GatewayProcess, topic: str) -> None:
    listing = json.loads(kcat(gateway, "-L", "-J").stdout)
    assert [(b["id"], b["name"]) for b in listing["brokers"]] == [(0, gateway.bootstrap)]
    [mine] = [t for t in listing["topics"] if t["topic"] == topic]
    assert [(p["partition"], p["leader"]) for p in mine["partitions"]] == [(0, 0), (1, 0)]
    text = kcat(gateway, "-L", "-t", topic).stdout
    assert f'topic "{topic}" with 2 partitions:' in text and "partition 1, leader 0" in text


@pytest.mark.parametrize("compression", ["none", "gzip", "snappy"])
def test_kcat_produces_keyed_records_and_consumes_them_from_the_beginning(
    gateway: GatewayProcess, topic: str, compression: str
) -> None:
    lines = [f"key-{i % 3}:value {i} {compression}" for i in range(20)]
    codec = () if compression == "none" else ("-z", compression)
    produced = kcat(
        gateway,
        "-P",
        "-t",
        topic,
        "-p",
        "1",
        "-K",
        ":",
        *codec,
        "-X",
        "debug=msg",
        "-X",
        "linger.ms=100",
        stdin="\n".join(lines) + "\n",
    )
    # librdkafka's log names the format and codec of each batch it wrote: record batches v2, and
    # the compression asked for, not turned off
    expected = "uncompressed" if compression == "none" else compression
    assert _batch_formats(produced.stderr) == {("MsgVersion 2", expected)}, produced.stderr[-2000:]
    got = consume(gateway, topic, 1)
    assert [(r["offset"], r["key"], r["payload"]) for r in got] == [(i, *line.split(":", 1)) for i, line in enumerate(lines)]
    assert consume(gateway, topic, 0) == []


def _batch_formats(debug: str) -> set[tuple[str, str]]:
    """(message version, codec) of every batch librdkafka's debug log says it produced: "Produce
    MessageSet with 20 message(s) (551 bytes, ApiVersion 7, MsgVersion 2, …, gzip)"."""
    found = set()
    for line in debug.splitlines():
        if "Produce MessageSet with" in line:
            fields = [f.strip() for f in line.rstrip().rstrip(")").rsplit("(", 1)[-1].split(",")]
            found.add((next(f for f in fields if f.startswith("MsgVersion")), fields[-1]))
    return found


def test_kcat_produces_in_a_transaction_and_consumes_read_committed(gateway: GatewayProcess, store: Broker, topic: str) -> None:
    kcat(gateway, "-P", "-t", topic, "-p", "0", "-K", ":", "-X", f"transactional.id=kcat-{topic}", stdin="a:first\nb:second\n")
    got = consume(gateway, topic, 0, "-X", "isolation.level=read_committed")
    assert [(r["offset"], r["key"], r["payload"]) for r in got] == [(0, "a", "first"), (1, "b", "second")]
    with store.db.read() as conn:
        rows = conn.execute(
            text('SELECT "offset", is_transactional, control_type FROM txlog.log_records WHERE topic = :t ORDER BY "offset"'),
            {"t": topic},
        ).all()
    assert [tuple(r) for r in rows] == [(0, True, None), (1, True, None), (2, True, 1)]  # and the COMMIT marker
    # an aborted transaction after it (written through txlog's own services), then more records
    other = f"k-{uuid.uuid4().hex[:10]}"
    topics.create_topic(store, other, 2)
    transactions_log(store, other)
    committed = consume(gateway, other, 0, "-X", "isolation.level=read_committed")
    assert [(r["offset"], r["payload"]) for r in committed] == [
        (0, "plain-0"),
        (4, "committed-4"),
        (5, "committed-5"),
        (7, "plain-7"),
    ]
    everything = consume(gateway, other, 0, "-X", "isolation.level=read_uncommitted")  # librdkafka's default is read_committed
    assert [r["offset"] for r in everything] == [0, 1, 2, 4, 5, 7, 8]
