"""``txlog spark pipeline``: an exactly-once read-process-write job, as Kafka Streams does it.

Input: orders, each value ``{"customer": str, "amount": number}``. Output: one record per customer
whose total changed, keyed by customer, value ``{"customer", "total", "orders"}`` — the running
total over every order ever consumed by the group. Each run:

1. InitProducerId with a transactional id fixed per (group, output topic). A previous run that was
   killed mid-transaction is fenced and its open transaction aborted: its output records become
   invisible and its pending group offsets are dropped. A run killed while committing (PrepareCommit)
   is completed as a commit instead.
2. Read the input from the group's committed offsets up to the last stable offsets (a snapshot).
3. Transform in Spark: per-customer sums of the batch, added to the latest committed total of each
   customer in the output topic.
4. In ONE txlog transaction: the output records and the group's new input offsets
   (TxnOffsetCommit), then EndTxn(commit).

Killed at any point, the next run starts from the offsets and totals of the last committed run, so
each input record counts exactly once. The output topic must be written only by this job (an open
transaction of another producer there would hold back its last stable offset and hide totals).
Amounts are summed as DECIMAL(38, 9): exact for up to nine decimal places.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Iterable, Iterator

from app import faults
from app.domain.groups.offsets import GroupOffset
from app.domain.partitioner import partition_for_key
from app.domain.records import NewRecord
from app.errors import ErrorCode, TxlogError
from app.services import produce, topics, transactions
from app.services.produce import ProduceRequest
from spark.progress import say
from spark.reader import TopicSnapshot, read_snapshot, service_broker, snapshot

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from app.services import Broker

CRASH_ENV = "TXLOG_PIPELINE_CRASH_AT"  # read | transform | write | commit: os._exit(137) right there
CRASH_POINTS = ("read", "transform", "write", "commit")
AMOUNT_TYPE = "DECIMAL(38, 9)"
BATCH_RECORDS = 500


def crash_point(name: str) -> None:
    faults.crash_point(CRASH_ENV, name)


def transactional_id(group_id: str, output_topic: str) -> str:
    """Stable across runs, so that a new run fences the previous one."""
    return f"txlog-spark-pipeline/{group_id}/{output_topic}"


@dataclass(frozen=True)
class PipelineResult:
    input: TopicSnapshot
    orders: int  # valid input records consumed
    malformed: int  # input records consumed but skipped (not JSON, or no customer/amount)
    outputs: int  # records written to the output topic


def format_decimal(d: Decimal) -> str:
    text = format(d.normalize(), "f")
    return "0" if text in ("-0", "0") else text


def total_record(customer: str, total: Decimal, orders: int) -> NewRecord:
    value = f'{{"customer": {json.dumps(customer)}, "total": {format_decimal(total)}, "orders": {orders}}}'
    return NewRecord(customer.encode("utf-8"), value.encode("utf-8"))


def parse_orders(orders: "DataFrame") -> "DataFrame":
    """Input records as (customer, amount); null columns where the value is not a valid order."""
    from pyspark.sql import functions as F

    return orders.select(F.from_json(F.col("value").cast("string"), f"customer STRING, amount {AMOUNT_TYPE}").alias("o")).select(
        F.col("o.customer").alias("customer"), F.col("o.amount").alias("amount")
    )


def new_totals(parsed: "DataFrame", previous: "DataFrame") -> "DataFrame":
    """Per customer of this batch: the new running total and order count. ``previous`` is the
    output topic read committed; each customer's latest record there holds its total so far."""
    from pyspark.sql import functions as F

    batch = (
        parsed.where(F.col("customer").isNotNull() & F.col("amount").isNotNull())
        .groupBy("customer")
        .agg(F.sum("amount").alias("amount"), F.count(F.lit(1)).alias("orders"))
    )
    latest = (
        previous.select(F.col("key").cast("string").alias("customer"), "offset", "value")
        .groupBy("customer")
        .agg(F.max_by("value", "offset").alias("value"))  # a key always lands on the same partition
        .select("customer", F.from_json(F.col("value").cast("string"), f"total {AMOUNT_TYPE}, orders BIGINT").alias("v"))
        .select("customer", F.col("v.total").alias("prev_total"), F.col("v.orders").alias("prev_orders"))
    )
    return batch.join(latest, "customer", "left").select(
        "customer",
        (F.coalesce("prev_total", F.lit(0).cast(AMOUNT_TYPE)) + F.col("amount")).cast(AMOUNT_TYPE).alias("total"),
        (F.coalesce("prev_orders", F.lit(0)) + F.col("orders")).alias("orders"),
    )


def _batches(records: list[NewRecord], max_bytes: int) -> Iterator[list[NewRecord]]:
    batch: list[NewRecord] = []
    size = 0
    for r in records:
        if batch and (len(batch) >= BATCH_RECORDS or size + r.size() > max_bytes // 2):
            yield batch
            batch, size = [], 0
        batch.append(r)
        size += r.size()
    if batch:
        yield batch


def _produce_all(broker: "Broker", topic: str, tid: str, pid: int, epoch: int, records: Iterable[NewRecord]) -> int:
    """Append the records to their partitions (Kafka's partitioner on the key) inside the
    transaction; sequences start at 0 per partition (each transaction has its own epoch)."""
    n = topics.partition_count(broker, topic)
    by_partition: dict[int, list[NewRecord]] = {}
    for r in records:
        by_partition.setdefault(partition_for_key(r.key or b"", n), []).append(r)
    written = 0
    for p in sorted(by_partition):
        seq = 0
        for batch in _batches(by_partition[p], broker.settings.max_request_bytes):
            produce.produce(broker, topic, p, ProduceRequest(batch, pid, epoch, seq, tid))
            seq += len(batch)
            written += len(batch)
            crash_point("write")
    return written


def run_pipeline(
    spark: "SparkSession",
    url: str,
    input_topic: str,
    output_topic: str,
    group_id: str,
    num_partitions: int | None = None,
    transaction_timeout_ms: int | None = None,
) -> PipelineResult:
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    if input_topic == output_topic:
        raise TxlogError(ErrorCode.INVALID_REQUEST, "The pipeline's input and output topics must differ")
    tid = transactional_id(group_id, output_topic)
    with service_broker(url) as broker:
        topics.partition_count(broker, output_topic)  # fail early if the output topic is missing
        producer = transactions.init_producer_id(broker, tid, transaction_timeout_ms)
        pid, epoch = producer.producer_id, producer.producer_epoch
        say(f"pipeline: {tid} is producer {pid} epoch {epoch}")

        snap = snapshot(url, input_topic, "read_committed", group_id=group_id)
        if snap.is_empty():
            say(f"pipeline: no new input in {input_topic} for group {group_id}")
            return PipelineResult(snap, 0, 0, 0)
        say(f"pipeline: reading {input_topic} " + ", ".join(f"{r.partition}:[{r.start},{r.end})" for r in snap.ranges))
        previous = read_snapshot(spark, snapshot(url, output_topic, "read_committed"), num_partitions)
        seen = Observation("txlog_pipeline_input")
        parsed = parse_orders(read_snapshot(spark, snap, num_partitions)).observe(
            seen,
            F.count(F.lit(1)).alias("input"),
            F.count_if(F.col("customer").isNull() | F.col("amount").isNull()).alias("malformed"),
        )
        rows = new_totals(parsed, previous).collect()
        crash_point("read")
        records = [total_record(r["customer"], r["total"], r["orders"]) for r in rows]
        crash_point("transform")

        written = _produce_all(broker, output_topic, tid, pid, epoch, records)
        offsets = [GroupOffset(input_topic, p, end, "") for p, end in sorted(snap.end_offsets.items())]
        transactions.txn_offset_commit(broker, tid, pid, epoch, group_id, offsets)
        crash_point("commit")
        transactions.end_txn(broker, tid, pid, epoch, "commit")
        stats = seen.get
        malformed = int(stats.get("malformed", 0))
        orders = int(stats.get("input", 0)) - malformed
    say(
        f"pipeline: committed {written} totals to {output_topic} for {orders} orders"
        + (f" ({malformed} malformed skipped)" if malformed else "")
        + f"; group {group_id} at {snap.end_offsets}"
    )
    return PipelineResult(snap, orders, malformed, written)
