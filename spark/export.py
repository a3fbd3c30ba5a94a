"""``txlog spark export``: a topic snapshot written as Parquet or JSON files."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from spark.progress import SparkProgress, say
from spark.reader import IsolationLevel, TopicSnapshot, commit_offsets, read_snapshot, snapshot

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

Format = Literal["parquet", "json"]
Encoding = Literal["utf8", "base64", "binary"]


@dataclass(frozen=True)
class ExportResult:
    snapshot: TopicSnapshot
    records: int
    seconds: float


def encode_payload(df: "DataFrame", encoding: Encoding) -> "DataFrame":
    """Keys and values as the HTTP API shows them (utf8 text or base64), or left as bytes."""
    from pyspark.sql import functions as F

    if encoding == "binary":
        return df
    conv = (lambda c: F.col(c).cast("string")) if encoding == "utf8" else (lambda c: F.base64(F.col(c)))
    return df.withColumn("key", conv("key")).withColumn("value", conv("value"))


def write_files(df: "DataFrame", output: str, fmt: Format, mode: str = "errorifexists") -> int:
    """Write ``df`` and return how many rows were written (counted while writing, one pass)."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    seen = Observation("txlog_written")
    observed = df.observe(seen, F.count(F.lit(1)).alias("rows"))
    observed.write.mode(mode).format(fmt).save(output)
    return int(seen.get.get("rows", 0))


def export(
    spark: "SparkSession",
    url: str,
    topic: str,
    output: str,
    fmt: Format = "parquet",
    isolation_level: IsolationLevel = "read_committed",
    group_id: str | None = None,
    num_partitions: int | None = None,
    mode: str = "errorifexists",
    encoding: Encoding | None = None,
    verbose: bool = True,
) -> ExportResult:
    """Write the topic's records from the group's offsets (or the log start) to the end offsets
    fixed now. With a group, its offsets move to those end offsets once the files are written."""
    snap = snapshot(url, topic, isolation_level, group_id=group_id)
    if verbose:
        ranges = ", ".join(f"{r.partition}:[{r.start},{r.end})" for r in snap.ranges)
        say(f"exporting {topic} ({isolation_level}) offsets {ranges} to {output} as {fmt}")
    df = encode_payload(read_snapshot(spark, snap, num_partitions), encoding or ("binary" if fmt == "parquet" else "utf8"))
    with SparkProgress(spark, f"export {topic}") as progress:
        written = write_files(df, output, fmt, mode)
    if group_id is not None:
        commit_offsets(url, group_id, snap)
    if verbose:
        say(
            f"exported {written} records of {topic} to {output} in {progress.elapsed:.1f} s"
            + (f"; group {group_id} committed at {snap.end_offsets}" if group_id else "")
        )
    return ExportResult(snap, written, progress.elapsed)
