"""``txlog groups list | describe | delete`` (kafka-consumer-groups.sh): committed offsets and lag
against the last stable offset, what a read_committed consumer of the group still has to read; a
group without members deleted with its offsets."""

from __future__ import annotations

import click

from app.cli.common import Client, client_command, ms_ago, now_ms, print_json, table
from txlog._http import segment


@click.group()
def groups() -> None:
    """List consumer groups and describe their offsets and lag."""


@groups.command("list")
@client_command
def list_(client: Client) -> int:
    """List the consumer groups with their total lag."""
    answer = client.http.get("/v1/groups")
    if client.json:
        print_json(answer)
        return 0
    now = now_ms()
    table(
        ["GROUP", "PARTITIONS", "LAG", "LAST-COMMIT", "PENDING-OFFSETS"],
        [
            (g["group_id"], g["partitions"], g["lag"], ms_ago(now, g["last_commit_ms"]), g["pending_offsets"])
            for g in answer["groups"]
        ],
    )
    return 0


@groups.command()
@click.argument("group")
@client_command
def describe(client: Client, group: str) -> int:
    """Show GROUP's committed offset, log end, last stable offset and lag per partition, and its
    offsets still pending in open transactions."""
    answer = client.http.get(f"/v1/groups/{segment(group)}")
    if client.json:
        print_json(answer)
        return 0
    if not answer["offsets"] and not answer["pending_offsets"]:
        click.echo(f"Consumer group {group} has no committed offsets.")
        return 0
    table(
        ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LAST-STABLE-OFFSET", "LOG-END-OFFSET", "LAG"],
        [
            (group, o["topic"], o["partition"], o["offset"], o["last_stable_offset"], o["high_watermark"], o["lag"])
            for o in answer["offsets"]
        ],
    )
    if answer["pending_offsets"]:
        click.echo()
        table(
            ["TOPIC", "PARTITION", "PENDING-OFFSET", "TRANSACTIONAL-ID", "PRODUCER-ID", "EPOCH"],
            [
                (p["topic"], p["partition"], p["offset"], p["transactional_id"], p["producer_id"], p["producer_epoch"])
                for p in answer["pending_offsets"]
            ],
            title="Offsets pending in open transactions",
        )
    return 0


@groups.command()
@click.argument("group")
@client_command
def delete(client: Client, group: str) -> int:
    """Delete GROUP with its committed offsets (kafka-consumer-groups.sh --delete): refused while it
    has members."""
    answer = client.http.request("DELETE", f"/v1/groups/{segment(group)}")
    if client.json:
        print_json(answer)
    else:
        click.echo(f"Deleted consumer group {group}.")
    return 0
