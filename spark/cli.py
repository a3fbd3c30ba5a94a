"""``txlog spark export | pipeline | stream``. PySpark is imported only when one of them runs, so
``txlog serve`` never loads it."""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from app.errors import TxlogError


def _database_url(args: argparse.Namespace) -> str:
    from app.cli import _database_url as resolve

    url, _server = resolve(args)  # an embedded server keeps running after we exit, as with db-url
    return url


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--database-url", default=None, help="txlog database (default: $TXLOG_DATABASE_URL, else the embedded one)")
    p.add_argument("--master", default="local[2]", help="Spark master (default: local[2])")
    p.add_argument("--num-partitions", type=int, default=None, help="parallel JDBC slices per read (default: Spark's parallelism)")


def _run(name: str, body: Callable[..., int]) -> Callable[[argparse.Namespace], int]:
    def command(args: argparse.Namespace) -> int:
        if getattr(args, "check", None):
            args.check(args)  # before Spark starts
        url = _database_url(args)
        from spark.reader import spark_session

        from pyspark.errors import PySparkException

        spark = spark_session(f"txlog-{name}", args.master)
        try:
            return body(spark, url, args)
        except (TxlogError, PySparkException) as exc:
            print(f"error: {str(exc).strip().splitlines()[0]}", file=sys.stderr)
            return 1
        finally:
            spark.stop()

    return command


def _export(spark, url: str, args: argparse.Namespace) -> int:  # type: ignore[no-untyped-def]
    from spark.export import export

    export(spark, url, args.topic, args.output, args.format, args.isolation_level, args.group, args.num_partitions, args.mode, args.encoding)
    return 0


def _pipeline(spark, url: str, args: argparse.Namespace) -> int:  # type: ignore[no-untyped-def]
    from spark.pipeline import run_pipeline

    run_pipeline(spark, url, args.input, args.output, args.group, args.num_partitions, args.transaction_timeout_ms)
    return 0


def _stream(spark, url: str, args: argparse.Namespace) -> int:  # type: ignore[no-untyped-def]
    from spark.stream import ConsoleSink, FileSink, run_stream

    sink = ConsoleSink() if args.sink == "console" else FileSink(args.output, args.format, args.encoding)
    result = run_stream(
        spark, url, args.topic, args.group, sink, args.trigger_seconds, args.max_batches, args.available_now,
        args.isolation_level, args.num_partitions,
    )
    print(f"stream: {result.batches} batches, {result.records} records", file=sys.stderr)
    return 0


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    spark = subparsers.add_parser("spark", help="Spark jobs over txlog's tables (needs Java 17+ and pyspark)")
    sub = spark.add_subparsers(dest="spark_command", required=True)

    ex = sub.add_parser("export", help="write a topic's records as Parquet or JSON files")
    ex.add_argument("--topic", required=True)
    ex.add_argument("--output", required=True, help="output directory")
    ex.add_argument("--format", choices=["parquet", "json"], default="parquet")
    ex.add_argument("--isolation-level", choices=["read_committed", "read_uncommitted"], default="read_committed")
    ex.add_argument("--group", default=None, help="start from this group's offsets and commit the end offsets after writing")
    ex.add_argument("--mode", choices=["errorifexists", "overwrite", "append"], default="errorifexists")
    ex.add_argument("--encoding", choices=["utf8", "base64", "binary"], default=None,
                    help="keys and values: utf8 text, base64 or bytes (default: bytes for parquet, utf8 for json)")
    _common(ex)
    ex.set_defaults(func=_run("export", _export))

    pl = sub.add_parser("pipeline", help="exactly-once job: orders in, per-customer running totals out")
    pl.add_argument("--input", required=True, help="input topic (values {\"customer\": str, \"amount\": number})")
    pl.add_argument("--output", required=True, help="output topic (key customer, value {\"customer\", \"total\", \"orders\"})")
    pl.add_argument("--group", required=True, help="consumer group whose offsets track the input")
    pl.add_argument("--transaction-timeout-ms", type=int, default=None)
    _common(pl)
    pl.set_defaults(func=_run("pipeline", _pipeline))

    st = sub.add_parser("stream", help="micro-batches from a group's offsets to files, resumable exactly once")
    st.add_argument("--topic", required=True)
    st.add_argument("--group", required=True)
    st.add_argument("--output", default=None, help="output directory (one batch=N sub-directory per batch)")
    st.add_argument("--sink", choices=["files", "console"], default="files")
    st.add_argument("--format", choices=["parquet", "json"], default="parquet")
    st.add_argument("--encoding", choices=["utf8", "base64", "binary"], default=None)
    st.add_argument("--isolation-level", choices=["read_committed", "read_uncommitted"], default="read_committed")
    st.add_argument("--trigger-seconds", type=float, default=5.0)
    st.add_argument("--max-batches", type=int, default=None, help="stop after this many batches")
    st.add_argument("--available-now", action="store_true", help="stop once a trigger finds nothing new")
    _common(st)
    st.set_defaults(func=_run("stream", _stream))

    def check_stream(args: argparse.Namespace) -> None:
        if args.sink == "files" and not args.output:
            st.error("--output is required with --sink files")

    st.set_defaults(check=check_stream)
