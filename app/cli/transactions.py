"""``txlog transactions list | describe | find-hanging | abort`` (kafka-transactions.sh, KIP-664)."""

from __future__ import annotations

import click

from app.cli.common import Client, client_command, duration, fields, ms_ago, now_ms, print_json, table
from app.domain.transactions import OPEN_STATE_NAMES, STATE_NAMES
from txlog._http import segment


@click.group()
def transactions() -> None:
    """List, describe, find hanging and abort transactions."""


@transactions.command("list")
@click.option("--state", type=click.Choice(STATE_NAMES), default=None, help="Only transactions in this state.")
@click.option(
    "--older-than-ms", type=click.IntRange(min=0), default=None, metavar="MS", help="Only transactions started longer ago."
)
@client_command
def list_(client: Client, state: str | None, older_than_ms: int | None) -> int:
    """List transactional ids with their producer and state (ListTransactions)."""
    answer = client.http.get("/v1/transactions", params={"state": state, "older_than_ms": older_than_ms})
    if client.json:
        print_json(answer)
        return 0
    now = now_ms()
    table(
        ["TRANSACTIONAL-ID", "COORDINATOR", "PRODUCER-ID", "EPOCH", "STATE", "OPEN-FOR", "PARTITIONS"],
        [
            (
                t["transactional_id"],
                t["coordinator"],
                t["producer_id"],
                t["producer_epoch"],
                t["state"],
                ms_ago(now, t["started_at_ms"]) if t["state"] in OPEN_STATE_NAMES else None,
                len(t["partitions"]),
            )
            for t in answer["transactions"]
        ],
    )
    return 0


@transactions.command()
@click.argument("transactional_id")
@click.option("--events", is_flag=True, help="Also show the state transitions, oldest first (the last 1000).")
@client_command
def describe(client: Client, transactional_id: str, events: bool) -> int:
    """Show TRANSACTIONAL_ID's producer, state, timeout and partitions (DescribeTransactions)."""
    t = client.http.get(f"/v1/transactions/{segment(transactional_id)}")
    history = client.http.get(f"/v1/transactions/{segment(transactional_id)}/events") if events else None
    if client.json:
        print_json({**t, "events": history["events"]} if history else t)
        return 0
    now = now_ms()
    open_ = t["state"] in OPEN_STATE_NAMES
    fields(
        [
            ("TransactionalId", t["transactional_id"]),
            ("Coordinator", t["coordinator"]),
            ("ProducerId", t["producer_id"]),
            ("ProducerEpoch", t["producer_epoch"]),
            ("TransactionState", t["state"]),
            ("TransactionTimeoutMs", t["timeout_ms"]),
            ("CurrentTransactionStartTimeMs", t["started_at_ms"] if open_ else None),
            ("TransactionDuration", ms_ago(now, t["started_at_ms"]) if open_ else None),
            ("TopicPartitions", ",".join(f"{p['topic']}-{p['partition']}" for p in t["partitions"]) or None),
            ("Groups", ",".join(t["groups"]) or None),
            ("LastResult", t.get("last_result")),
            ("FenceReason", t.get("fence_reason")),
        ]
    )
    if history:
        click.echo()
        table(
            ["VERSION", "FROM", "TO", "PRODUCER-ID", "EPOCH", "AGO", "REASON"],
            [
                (
                    e["version"],
                    e["from_state"],
                    e["to_state"],
                    e["producer_id"],
                    e["producer_epoch"],
                    ms_ago(now, e["at_ms"]),
                    e["reason"],
                )
                for e in history["events"]
            ],
        )
    return 0


@transactions.command("find-hanging")
@click.option("--topic", default=None, help="Only this topic's partitions (default: every topic).")
@click.option("--partition", type=click.IntRange(min=0), default=None, help="Only this partition of --topic.")
@click.option(
    "--max-transaction-timeout-ms",
    type=click.IntRange(min=0),
    default=None,
    metavar="MS",
    help="Open longer than this is hanging (default: the server's transaction.max.timeout.ms).",
)
@client_command
def find_hanging(client: Client, topic: str | None, partition: int | None, max_transaction_timeout_ms: int | None) -> int:
    """Find open transactions that hold a partition's last stable offset back with no end in sight:
    unknown to or not ongoing at their coordinator, or open longer than the maximum transaction
    timeout. Abort one with `txlog transactions abort --topic T --partition P --start-offset N`."""
    if partition is not None and topic is None:
        raise click.UsageError("--partition needs --topic")
    answer = client.http.get(
        "/v1/open-transactions",
        params={
            "topic": topic,
            "partition": partition,
            "hanging": "true",
            "max_transaction_timeout_ms": max_transaction_timeout_ms,
        },
    )
    if client.json:
        print_json(answer)
        return 0
    found = answer["open_transactions"]
    if not found:
        click.echo(f"No hanging transactions (maximum transaction timeout {answer['max_transaction_timeout_ms']} ms).")
        return 0
    table(
        [
            "TOPIC",
            "PARTITION",
            "PRODUCER-ID",
            "EPOCH",
            "START-OFFSET",
            "DURATION",
            "TRANSACTIONAL-ID",
            "COORDINATOR-STATE",
            "WHY",
        ],
        [
            (
                o["topic"],
                o["partition"],
                o["producer_id"],
                o["producer_epoch"],
                o["start_offset"],
                duration(o["duration_ms"]),
                o["transactional_id"],
                o["coordinator_state"],
                ",".join(o["hanging"]),
            )
            for o in found
        ],
    )
    return 0


@transactions.command()
@click.option("--transactional-id", default=None, help="Abort this transactional id's open transaction.")
@click.option("--topic", default=None, help="Abort the open transaction on a partition of this topic ...")
@click.option("--partition", type=click.IntRange(min=0), default=None, help="... this partition ...")
@click.option(
    "--start-offset", type=click.IntRange(min=0), default=None, help="... that starts at this offset (see find-hanging)."
)
@click.option("--producer-id", type=click.IntRange(min=0), default=None, help="... of this producer id.")
@client_command
def abort(
    client: Client,
    transactional_id: str | None,
    topic: str | None,
    partition: int | None,
    start_offset: int | None,
    producer_id: int | None,
) -> int:
    """Abort an open transaction and fence its producer. By transactional id; or by partition
    (--topic, --partition, and --start-offset or --producer-id when several are open there): a
    transaction its coordinator has open is aborted on all its partitions, a hanging one gets an
    ABORT marker on that partition."""
    by_partition = topic is not None or partition is not None
    if (transactional_id is None) == (not by_partition):
        raise click.UsageError("give either --transactional-id or --topic and --partition")
    if by_partition and (topic is None or partition is None):
        raise click.UsageError("--topic and --partition go together")
    if transactional_id is not None and (start_offset is not None or producer_id is not None):
        raise click.UsageError("--start-offset and --producer-id go with --topic and --partition")
    if transactional_id is not None:
        t = client.http.post(f"/v1/transactions/{segment(transactional_id)}/abort")
        if client.json:
            print_json(t)
        else:
            click.echo(
                f"Aborted the transaction of {transactional_id}: now {t['state']}, "
                f"producer id {t['producer_id']} at epoch {t['producer_epoch']} (the previous producer is fenced)."
            )
        return 0
    assert topic is not None and partition is not None
    answer = client.http.post(
        f"/v1/topics/{segment(topic)}/partitions/{partition}/abort-transaction",
        {"producer_id": producer_id, "start_offset": start_offset},
    )
    if client.json:
        print_json(answer)
    elif answer["transaction"] is not None:
        t = answer["transaction"]
        click.echo(
            f"Aborted the transaction of {t['transactional_id']} (producer id {answer['producer_id']}, from offset "
            f"{answer['start_offset']} on {topic}-{partition}) on all its partitions: now {t['state']}, epoch {t['producer_epoch']}."
        )
    else:
        click.echo(
            f"Wrote an ABORT marker at offset {answer['marker_offset']} on {topic}-{partition} for producer id "
            f"{answer['producer_id']} (epoch {answer['producer_epoch']}), ending its transaction from offset {answer['start_offset']}."
        )
    return 0
