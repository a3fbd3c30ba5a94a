"""``txlog spark export`` and ``txlog spark stream`` as real subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from app.services import groups, topics
from spark.stream import CRASH_ENV as STREAM_CRASH_ENV
from tests.spark.cli import run_spark_cli
from tests.spark.logdata import Txn, consume, group_offsets, mixed_log, plain, rec, spark_rows
from tests.support import ROOT


def json_rows(df) -> list[tuple]:  # type: ignore[no-untyped-def]
    """Rows of a JSON export (keys and values as utf8 text) in the shape of ``spark_rows``."""
    return sorted(
        (
            r["partition"],
            r["offset"],
            r["key"].encode() if r["key"] is not None else None,
            r["value"].encode(),
            json.loads(r["headers"]) if r["headers"] else None,
        )
        for r in df.collect()
    )


def test_export_parquet_and_json(spark, broker, db_url, topic_name, tmp_path) -> None:  # type: ignore[no-untyped-def]
    mixed_log(broker, topic_name)
    expected = consume(broker, topic_name)

    out = run_spark_cli(
        db_url,
        ["export", "--topic", topic_name, "--format", "parquet", "--output", str(tmp_path / "pq")],
        tmp_path / "parquet.log",
    )
    assert f"exported {len(expected)} records of {topic_name}" in out
    assert "tasks" in out  # progress lines while Spark works
    assert spark_rows(spark.read.parquet(str(tmp_path / "pq"))) == expected

    out = run_spark_cli(
        db_url,
        ["export", "--topic", topic_name, "--format", "json", "--output", str(tmp_path / "js"), "--group", "exp"],
        tmp_path / "json.log",
    )
    assert f"exported {len(expected)} records of {topic_name}" in out
    assert json_rows(spark.read.json(str(tmp_path / "js"))) == expected
    lso = {(topic_name, s.partition): s.last_stable_offset for s in topics.describe_topic(broker, topic_name)}
    assert group_offsets(broker, "exp") == lso  # committed after the files were written

    out = run_spark_cli(
        db_url,
        ["export", "--topic", topic_name, "--format", "json", "--output", str(tmp_path / "js")],
        tmp_path / "again.log",
        expect=1,
    )
    assert "already exists" in out  # never overwrites unless told to


@pytest.mark.slow
def test_stream_resumes_without_loss_or_duplicates(spark, broker, db_url, topic_name, tmp_path) -> None:  # type: ignore[no-untyped-def]
    open_txn = mixed_log(broker, topic_name, partitions=2)
    out_dir = tmp_path / "stream"
    args = [
        "stream",
        "--topic",
        topic_name,
        "--group",
        "files",
        "--output",
        str(out_dir),
        "--format",
        "json",
        "--available-now",
        "--trigger-seconds",
        "0",
    ]

    def batch_ids() -> list[str]:
        return sorted(p.name for p in out_dir.glob("batch=*"))

    def metadata() -> set[str]:
        return {o.metadata for o in groups.offset_fetch(broker, "files")}

    run_spark_cli(db_url, args, tmp_path / "run1.log")
    assert batch_ids() == ["batch=000000"]
    assert json_rows(spark.read.json(str(out_dir))) == consume(broker, topic_name)
    first_offsets = group_offsets(broker, "files")
    assert metadata() == {json.dumps({"batch_id": 0})}

    # New data (the open transaction commits, another aborts); the next run dies after writing its
    # batch but before committing the batch's offsets.
    open_txn.commit()
    t = Txn(broker)
    t.send(topic_name, 0, rec("aborted-late"))
    t.abort()
    plain(broker, topic_name, 1, rec("second"))
    run_spark_cli(db_url, args, tmp_path / "run2.log", env={STREAM_CRASH_ENV: "commit"}, expect=137)
    assert batch_ids() == ["batch=000000", "batch=000001"]
    assert group_offsets(broker, "files") == first_offsets

    plain(broker, topic_name, 0, rec("third"))
    out = run_spark_cli(db_url, args, tmp_path / "run3.log")
    assert "batch 1 was written before the last run stopped" in out
    assert batch_ids() == ["batch=000000", "batch=000001", "batch=000002"]
    assert metadata() == {json.dumps({"batch_id": 2})}

    everything = spark.read.json(str(out_dir))
    rows = json_rows(everything)
    assert rows == consume(broker, topic_name)  # every committed record once: no loss, no duplicate
    assert len(rows) == len({(p, o) for p, o, *_ in rows})
    by_batch = {r["value"]: r["batch"] for r in everything.collect()}
    assert by_batch["open-0"] == by_batch["second"] == 1 and by_batch["third"] == 2
    assert "aborted-late" not in by_batch

    out = run_spark_cli(db_url, args, tmp_path / "run4.log")  # nothing new: no empty batch
    assert batch_ids() == ["batch=000000", "batch=000001", "batch=000002"]
    assert "0 batches" in out


def test_the_spark_commands_do_not_load_pyspark_until_they_run() -> None:
    code = (
        "import sys; from app.cli.root import cli; args = ['export', '--topic', 't', '--output', 'o']; "
        "top = cli.make_context('txlog', ['spark', *args]); group = cli.get_command(top, 'spark'); "
        "ctx = group.make_context('spark', list(args), parent=top); "
        "export = group.get_command(ctx, 'export'); export.make_context('export', args[1:], parent=ctx); "
        "print(sorted(m for m in sys.modules if m.startswith('pyspark')))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
