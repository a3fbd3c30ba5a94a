"""``txlog producers describe`` (kafka-transactions.sh describe-producers, KIP-664): what a
partition remembers of the producers that wrote to it."""

from __future__ import annotations

import click

from app.cli.common import Client, client_command, print_json, table
from txlog._http import segment


@click.group()
def producers() -> None:
    """Describe the producers a partition keeps state for."""


@producers.command()
@click.argument("topic")
@click.argument("partition", type=click.IntRange(min=0))
@client_command
def describe(client: Client, topic: str, partition: int) -> int:
    """Show the active producers of TOPIC's PARTITION: epoch, last sequence and timestamp, and where
    an open transaction of theirs starts (DescribeProducers)."""
    answer = client.http.get(f"/v1/topics/{segment(topic)}/partitions/{partition}/producers")
    if client.json:
        print_json(answer)
        return 0
    if not answer["producers"]:
        click.echo(f"No active producers on {topic}-{partition}.")
        return 0
    table(
        ["PRODUCER-ID", "PRODUCER-EPOCH", "LAST-SEQUENCE", "LAST-TIMESTAMP", "CURRENT-TRANSACTION-START-OFFSET"],
        [
            (p["producer_id"], p["producer_epoch"], p["last_sequence"], p["last_timestamp_ms"], p["current_txn_start_offset"])
            for p in answer["producers"]
        ],
    )
    return 0
