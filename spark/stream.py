"""``txlog spark stream``: micro-batches over JDBC, resumable without loss or duplicates.

Each batch is a snapshot from the group's committed offsets to the last stable offsets of the
moment, read over JDBC like :func:`spark.reader.read_topic`. The sink writes the batch under its
batch id (idempotent: writing batch N again replaces batch N), and only then are the batch's end
offsets committed to the group, with the batch id in the offsets' metadata. A run killed before the
commit re-runs the same batch id from the same start offsets; when the sink already holds that batch
complete (its manifest names the same start offsets) it is committed as it is — the same range, as
Spark's offset log would replay it.
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from app import faults
from app.errors import ErrorCode, TxlogError
from spark.export import Encoding, Format, encode_payload, write_files
from spark.progress import say
from spark.reader import IsolationLevel, TopicSnapshot, commit_offsets, read_snapshot, service_broker, snapshot

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

MANIFEST = "_txlog_batch.json"
CRASH_ENV = "TXLOG_STREAM_CRASH_AT"  # commit: die after the sink wrote a batch, before its offsets are committed


@dataclass(frozen=True)
class BatchManifest:
    batch_id: int
    topic: str
    start_offsets: dict[int, int]
    end_offsets: dict[int, int]
    records: int

    def to_json(self) -> str:
        return json.dumps(
            {
                "batch_id": self.batch_id,
                "topic": self.topic,
                "start_offsets": {str(k): v for k, v in sorted(self.start_offsets.items())},
                "end_offsets": {str(k): v for k, v in sorted(self.end_offsets.items())},
                "records": self.records,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> "BatchManifest":
        d = json.loads(text)
        return cls(
            d["batch_id"],
            d["topic"],
            {int(k): v for k, v in d["start_offsets"].items()},
            {int(k): v for k, v in d["end_offsets"].items()},
            d["records"],
        )


class Sink(Protocol):
    def written(self, batch_id: int) -> BatchManifest | None:
        """The batch's manifest if the sink holds it complete."""

    def write(self, batch_id: int, df: "DataFrame", snap: TopicSnapshot) -> int:
        """Write the batch (replacing any earlier attempt of it); returns the records written."""


class FileSink:
    """``DIR/batch=N/`` per batch (Parquet or JSON) with a manifest. A batch is written under
    ``DIR/_attempts/`` (hidden from Spark's readers) and renamed into place complete, so
    ``spark.read.parquet(DIR)`` never sees half a batch and gets a ``batch`` column."""

    def __init__(self, output: str | Path, fmt: Format = "parquet", encoding: Encoding | None = None) -> None:
        self.root = Path(output).absolute()
        self.fmt = fmt
        self.encoding: Encoding = encoding or ("binary" if fmt == "parquet" else "utf8")

    def batch_dir(self, batch_id: int) -> Path:
        return self.root / f"batch={batch_id:06d}"

    def written(self, batch_id: int) -> BatchManifest | None:
        manifest = self.batch_dir(batch_id) / MANIFEST
        return BatchManifest.from_json(manifest.read_text()) if manifest.is_file() else None

    def write(self, batch_id: int, df: "DataFrame", snap: TopicSnapshot) -> int:
        attempt = self.root / "_attempts" / f"batch={batch_id:06d}-{uuid.uuid4().hex[:8]}"
        records = write_files(encode_payload(df, self.encoding), str(attempt), self.fmt, mode="overwrite")
        manifest = BatchManifest(batch_id, snap.topic, dict(snap.start_offsets), dict(snap.end_offsets), records)
        (attempt / MANIFEST).write_text(manifest.to_json())
        target = self.batch_dir(batch_id)
        if target.exists():
            shutil.rmtree(target)
        attempt.rename(target)
        return records


class ConsoleSink:
    """Prints each batch (at-least-once: a batch killed before its commit is printed again)."""

    def __init__(self, rows: int = 20) -> None:
        self.rows = rows

    def written(self, batch_id: int) -> BatchManifest | None:
        return None

    def write(self, batch_id: int, df: "DataFrame", snap: TopicSnapshot) -> int:
        df = encode_payload(df, "utf8").cache()
        n = df.count()
        print(f"-------- batch {batch_id}: {n} records --------", flush=True)
        df.orderBy("partition", "offset").show(self.rows, truncate=False)
        df.unpersist()
        return n


def last_batch_id(url: str, group_id: str, topic: str) -> int:
    """The id of the group's last committed batch on the topic (-1 before the first)."""
    from app.services import groups

    with service_broker(url) as broker:
        offsets = [o for o in groups.offset_fetch(broker, group_id) if o.topic == topic]
    ids = []
    for o in offsets:
        try:
            ids.append(int(json.loads(o.metadata)["batch_id"]))
        except (ValueError, KeyError, TypeError):
            continue  # committed by something else than a stream: batch ids start over above it
    return max(ids, default=-1)


@dataclass(frozen=True)
class StreamResult:
    batches: int
    records: int
    last_batch_id: int


def run_stream(
    spark: "SparkSession",
    url: str,
    topic: str,
    group_id: str,
    sink: Sink,
    trigger_seconds: float = 5.0,
    max_batches: int | None = None,
    available_now: bool = False,
    isolation_level: IsolationLevel = "read_committed",
    num_partitions: int | None = None,
) -> StreamResult:
    """Run micro-batches every ``trigger_seconds``: until ``max_batches`` batches are written, or,
    with ``available_now``, until a trigger finds nothing new (Spark's ``availableNow``)."""
    if trigger_seconds < 0:
        raise TxlogError(ErrorCode.INVALID_REQUEST, "trigger_seconds must not be negative")
    batch_id = last_batch_id(url, group_id, topic) + 1
    batches = records = 0
    while max_batches is None or batches < max_batches:
        started = time.monotonic()
        snap = snapshot(url, topic, isolation_level, group_id=group_id)
        done = sink.written(batch_id)
        if done is not None and done.start_offsets == snap.start_offsets and done.topic == topic:
            say(f"stream: batch {batch_id} was written before the last run stopped; committing it")
            n = done.records
            snap = TopicSnapshot(url, topic, isolation_level, done.start_offsets, done.end_offsets, group_id)
        elif snap.is_empty():
            if available_now:
                break
            time.sleep(max(0.0, trigger_seconds - (time.monotonic() - started)))
            continue
        else:
            ranges = ", ".join(f"{r.partition}:[{r.start},{r.end})" for r in snap.ranges if r.span)
            say(f"stream: batch {batch_id} of {topic}: {ranges}")
            n = sink.write(batch_id, read_snapshot(spark, snap, num_partitions), snap)
        faults.crash_point(CRASH_ENV, "commit")
        commit_offsets(url, group_id, snap, metadata=json.dumps({"batch_id": batch_id}))
        say(f"stream: batch {batch_id} done, {n} records; group {group_id} at {snap.end_offsets}")
        batches += 1
        records += n
        batch_id += 1
        if not available_now and (max_batches is None or batches < max_batches):
            time.sleep(max(0.0, trigger_seconds - (time.monotonic() - started)))
    return StreamResult(batches, records, batch_id - 1)
