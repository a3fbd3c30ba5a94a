"""``txlog share-groups list | describe | alter-config`` (kafka-share-groups.sh, kafka-configs.sh
--entity-type groups): share groups, their share partitions' start and end offsets (SPSO/SPEO),
the records in flight with their state, lock holder and delivery count, and their share.* configs."""

from __future__ import annotations

import click

from app.cli.common import Client, client_command, fields, now_ms, parse_pairs, print_json, table
from txlog._http import segment


@click.group("share-groups")
def share_groups() -> None:
    """List share groups (queues on the log), describe their in-flight records, set their configs."""


@share_groups.command("list")
@client_command
def list_(client: Client) -> int:
    """List the share groups."""
    answer = client.http.get("/v1/share-groups")
    if client.json:
        print_json(answer)
        return 0
    table(["GROUP"], [(g,) for g in answer["groups"]])
    return 0


def _lock(now: float, deadline_ms: int | None) -> str | None:
    """A lock's time left, as seconds (the server's clock against this host's: an estimate)."""
    if deadline_ms is None:
        return None
    return f"{max(0.0, (deadline_ms - now) / 1000):.1f}s"


def _end(p: dict) -> int | None:
    """The share-partition end offset (SPEO): the last offset in flight, none when none is."""
    return p["end_offset"] - 1 if p["end_offset"] > p["start_offset"] else None


@share_groups.command()
@click.argument("group")
@click.option("--configs", "show_configs", is_flag=True, help="Also show the group's share.* configs.")
@client_command
def describe(client: Client, group: str, show_configs: bool) -> int:
    """Show GROUP's share partitions — start offset (SPSO), end offset (SPEO), records in flight by
    state — and each in-flight run of records with its state, lock holder (member id), time left
    on its lock and delivery count."""
    answer = client.http.get(f"/v1/share-groups/{segment(group)}")
    if client.json:
        print_json(answer)
        return 0
    parts = answer["partitions"]
    if not parts:
        click.echo(f"Share group {group} has not read any partition.")
    else:
        table(
            ["GROUP", "TOPIC", "PARTITION", "START-OFFSET", "END-OFFSET", "AVAILABLE", "ACQUIRED", "ACKNOWLEDGED", "ARCHIVED"],
            [
                (
                    group,
                    p["topic"],
                    p["partition"],
                    p["start_offset"],
                    _end(p),
                    *(p["records"].get(s, 0) for s in ("Available", "Acquired", "Acknowledged", "Archived")),
                )
                for p in parts
            ],
        )
        now = now_ms()
        in_flight = [(p["topic"], p["partition"], r) for p in parts for r in p["in_flight"]]
        if in_flight:
            click.echo()
            table(
                ["TOPIC", "PARTITION", "FIRST-OFFSET", "LAST-OFFSET", "STATE", "MEMBER-ID", "LOCK-LEFT", "DELIVERY-COUNT"],
                [
                    (
                        t,
                        p,
                        r["first_offset"],
                        r["last_offset"],
                        r["state"],
                        r["member_id"],
                        _lock(now, r["lock_deadline_ms"]),
                        r["delivery_count"],
                    )
                    for t, p, r in in_flight
                ],
                title="Records in flight",
            )
    if show_configs:
        click.echo()
        table(["CONFIG", "VALUE"], sorted(answer["configs"].items()))
    return 0


@share_groups.command("alter-config")
@click.argument("group")
@click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="KEY=VALUE",
    help="Set a config (share.record.lock.duration.ms, share.delivery.count.limit, share.auto.offset.reset, "
    "share.isolation.level, share.group.session.timeout.ms); repeatable.",
)
@click.option("--delete", "deletes", multiple=True, metavar="KEY", help="Put a config back to its default; repeatable.")
@client_command
def alter_config(client: Client, group: str, sets: tuple[str, ...], deletes: tuple[str, ...]) -> int:
    """Change GROUP's share.* configs (kafka-configs.sh --alter --entity-type groups: only the keys
    named change). Values out of Kafka's bounds are refused (INVALID_CONFIG)."""
    if not sets and not deletes:
        raise click.UsageError("name at least one --set or --delete")
    changes: dict[str, str | None] = dict(parse_pairs(sets, "--set"))
    changes.update({k: None for k in deletes})
    answer = client.http.request("PATCH", f"/v1/share-groups/{segment(group)}/configs", body={"configs": changes})
    if client.json:
        print_json(answer)
        return 0
    click.echo(f"Altered share group {group}.")
    fields(sorted(answer["configs"].items()))
    return 0
