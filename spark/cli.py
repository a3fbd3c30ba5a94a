"""``txlog spark export | pipeline | stream``. PySpark is imported only when one of them runs, so
``txlog serve`` never loads it, and its absence is told as what to install, not as a traceback."""

from __future__ import annotations

import functools
import importlib.util
from typing import TYPE_CHECKING, Any, Callable

import click

from app.cli.common import EXIT_MISSING_DEPENDENCY
from app.cli.server import resolve_database_url
from app.errors import TxlogError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from spark.export import Encoding, Format
    from spark.reader import IsolationLevel

INSTALL_HINT = (
    "PySpark is not installed. Install txlog's Spark extra: pip install 'txlog[spark]' "
    "(PySpark 4 with pandas), and Java 17 or newer for Spark itself."
)
ISOLATION = click.Choice(["read_committed", "read_uncommitted"])
ENCODING = click.Choice(["utf8", "base64", "binary"])


def pyspark_missing() -> bool:
    try:
        return importlib.util.find_spec("pyspark") is None
    except (ImportError, ValueError):
        return True


def spark_job(name: str, check: Callable[[dict], None] | None = None) -> Callable[[Callable[..., int]], Callable[..., int]]:
    """The options every job takes, and its run: ``check`` the options, check PySpark is there,
    find the database, start Spark, run ``body(spark, url, **options)``, report a job's error as
    one line (exit 1)."""

    def decorate(body: Callable[..., int]) -> Callable[..., int]:
        @click.option(
            "--database-url",
            default=None,
            metavar="URL",
            help="txlog database (default: $TXLOG_DATABASE_URL, else the embedded one)",
        )
        @click.option("--master", default="local[2]", show_default=True, help="Spark master")
        @click.option(
            "--num-partitions", type=int, default=None, help="parallel JDBC slices per read (default: Spark's parallelism)"
        )
        @functools.wraps(body)
        def command(database_url: str | None, master: str, **options: Any) -> int:
            if check is not None:
                check(options)  # before Spark starts
            if pyspark_missing():
                click.echo(f"error: {INSTALL_HINT}", err=True)
                return EXIT_MISSING_DEPENDENCY
            url, _server = resolve_database_url(database_url)  # an embedded server keeps running after we exit, as with db-url
            from pyspark.errors import PySparkException

            from spark.session import spark_session

            spark = spark_session(f"txlog-{name}", master)
            try:
                return body(spark, url, **options)
            except (TxlogError, PySparkException) as exc:
                click.echo(f"error: {str(exc).strip().splitlines()[0]}", err=True)
                return 1
            finally:
                spark.stop()

        return command

    return decorate


@click.group(context_settings={"max_content_width": 100})
def spark() -> None:
    """Spark jobs over txlog's tables (needs Java 17+ and pyspark: pip install 'txlog[spark]')."""


@spark.command()
@click.option("--topic", required=True)
@click.option("--output", required=True, help="output directory")
@click.option("--format", "format_", type=click.Choice(["parquet", "json"]), default="parquet", show_default=True)
@click.option("--isolation-level", type=ISOLATION, default="read_committed", show_default=True)
@click.option("--group", default=None, help="start from this group's offsets and commit the end offsets after writing")
@click.option("--mode", type=click.Choice(["errorifexists", "overwrite", "append"]), default="errorifexists", show_default=True)
@click.option(
    "--encoding",
    type=ENCODING,
    default=None,
    help="keys and values: utf8 text, base64 or bytes (default: bytes for parquet, utf8 for json)",
)
@spark_job("export")
def export(
    spark: SparkSession,
    url: str,
    topic: str,
    output: str,
    format_: Format,
    isolation_level: IsolationLevel,
    group: str | None,
    mode: str,
    encoding: Encoding | None,
    num_partitions: int | None,
) -> int:
    """Write a topic's records as Parquet or JSON files."""
    from spark.export import export as run_export

    run_export(spark, url, topic, output, format_, isolation_level, group, num_partitions, mode, encoding)
    return 0


@spark.command()
@click.option("--input", "input_", required=True, help='input topic (values {"customer": str, "amount": number})')
@click.option("--output", required=True, help='output topic (key customer, value {"customer", "total", "orders"})')
@click.option("--group", required=True, help="consumer group whose offsets track the input")
@click.option("--transaction-timeout-ms", type=int, default=None)
@spark_job("pipeline")
def pipeline(
    spark: SparkSession,
    url: str,
    input_: str,
    output: str,
    group: str,
    transaction_timeout_ms: int | None,
    num_partitions: int | None,
) -> int:
    """Exactly-once job: orders in, per-customer running totals out."""
    from spark.pipeline import run_pipeline

    run_pipeline(spark, url, input_, output, group, num_partitions, transaction_timeout_ms)
    return 0


def _check_stream(options: dict) -> None:
    if options["sink"] == "files" and not options["output"]:
        raise click.UsageError("--output is required with --sink files", ctx=click.get_current_context())


@spark.command()
@click.option("--topic", required=True)
@click.option("--group", required=True)
@click.option("--output", default=None, help="output directory (one batch=N sub-directory per batch)")
@click.option("--sink", type=click.Choice(["files", "console"]), default="files", show_default=True)
@click.option("--format", "format_", type=click.Choice(["parquet", "json"]), default="parquet", show_default=True)
@click.option("--encoding", type=ENCODING, default=None)
@click.option("--isolation-level", type=ISOLATION, default="read_committed", show_default=True)
@click.option("--trigger-seconds", type=float, default=5.0, show_default=True)
@click.option("--max-batches", type=int, default=None, help="stop after this many batches")
@click.option("--available-now", is_flag=True, help="stop once a trigger finds nothing new")
@spark_job("stream", check=_check_stream)
def stream(
    spark: SparkSession,
    url: str,
    topic: str,
    group: str,
    output: str | None,
    sink: str,
    format_: Format,
    encoding: Encoding | None,
    isolation_level: IsolationLevel,
    trigger_seconds: float,
    max_batches: int | None,
    available_now: bool,
    num_partitions: int | None,
) -> int:
    """Micro-batches from a group's offsets to files, resumable exactly once."""
    from spark.stream import ConsoleSink, FileSink, run_stream

    # _check_stream has refused --sink files without --output
    file_sink = FileSink(output, format_, encoding) if sink == "files" and output is not None else None
    result = run_stream(
        spark,
        url,
        topic,
        group,
        file_sink or ConsoleSink(),
        trigger_seconds,
        max_batches,
        available_now,
        isolation_level,
        num_partitions,
    )
    click.echo(f"stream: {result.batches} batches, {result.records} records", err=True)
    return 0
