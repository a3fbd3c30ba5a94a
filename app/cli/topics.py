"""``txlog topics create | list | describe | alter | delete`` (kafka-topics.sh and kafka-configs.sh)."""

from __future__ import annotations

import click

from app.cli.common import Client, client_command, fields, parse_pairs, print_json, table
from txlog._http import segment
from txlog.errors import KafkaError, KafkaException


@click.group()
def topics() -> None:
    """Create, list, describe and alter topics."""


@topics.command()
@click.argument("topic")
@click.option("--partitions", type=int, default=1, show_default=True)
@click.option(
    "--config", "configs", multiple=True, metavar="KEY=VALUE", help="A topic config, e.g. retention.ms=86400000 (repeatable)."
)
@click.option("--if-not-exists", is_flag=True, help="Succeed when the topic exists already.")
@client_command
def create(client: Client, topic: str, partitions: int, configs: tuple[str, ...], if_not_exists: bool) -> int:
    """Create TOPIC."""
    body = {"name": topic, "partitions": partitions, "config": dict(parse_pairs(configs, "--config"))}
    try:
        created = client.http.post("/v1/topics", body)
    except KafkaException as exc:
        if not (if_not_exists and exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS):
            raise
        created = {"name": topic, "partitions": None, "already_exists": True}
    if client.json:
        print_json(created)
    elif created.get("already_exists"):
        click.echo(f"Topic {topic} exists already.")
    else:
        click.echo(f"Created topic {created['name']} with {created['partitions']} partition(s).")
    return 0


@topics.command("list")
@client_command
def list_(client: Client) -> int:
    """List the topics."""
    answer = client.http.get("/v1/topics")
    if client.json:
        print_json(answer)
    else:
        table(["TOPIC", "PARTITIONS"], [(t["name"], t["partitions"]) for t in answer["topics"]])
    return 0


@topics.command()
@click.argument("topic")
@client_command
def describe(client: Client, topic: str) -> int:
    """Show TOPIC's partitions with their log start, last stable offset and high watermark, and its config."""
    answer = client.http.get(f"/v1/topics/{segment(topic)}")
    if client.json:
        print_json(answer)
        return 0
    parts = answer["partitions"]
    config = ",".join(f"{k}={v}" for k, v in sorted(answer.get("config", {}).items()))
    fields([("Topic", answer["name"]), ("PartitionCount", len(parts)), ("Configs", config or None)])
    click.echo()
    table(
        ["PARTITION", "LOG-START-OFFSET", "LAST-STABLE-OFFSET", "HIGH-WATERMARK", "UNSTABLE"],
        [
            (
                p["partition"],
                p["log_start_offset"],
                p["last_stable_offset"],
                p["high_watermark"],
                p["high_watermark"] - p["last_stable_offset"],
            )
            for p in parts
        ],
    )
    return 0


@topics.command()
@click.argument("topic")
@click.option("--config", "configs", multiple=True, metavar="KEY=VALUE", help="Set a config (repeatable).")
@click.option(
    "--delete-config",
    "deletes",
    multiple=True,
    metavar="KEY",
    help="Remove a config; the server default applies again (repeatable).",
)
@click.option(
    "--partitions", type=int, help="Grow TOPIC to this many partitions (kafka-topics.sh --alter); a topic never shrinks."
)
@client_command
def alter(client: Client, topic: str, configs: tuple[str, ...], deletes: tuple[str, ...], partitions: int | None) -> int:
    """Change TOPIC's configs (kafka-configs.sh --alter: only the keys named change), or grow its
    partitions (kafka-topics.sh --alter --partitions)."""
    if not configs and not deletes and partitions is None:
        raise click.UsageError("name at least one --config, --delete-config or --partitions")
    answers: dict = {}
    if partitions is not None:
        answers["partitions"] = client.http.post(f"/v1/topics/{segment(topic)}/partitions", {"count": partitions})
    if configs or deletes:
        changes: dict[str, str | None] = dict(parse_pairs(configs, "--config"))
        changes.update({k: None for k in deletes})
        answers["config"] = client.http.request("PATCH", f"/v1/topics/{segment(topic)}", body={"config": changes})
    if client.json:
        print_json(answers["config"] if list(answers) == ["config"] else answers)
        return 0
    if partitions is not None:
        click.echo(f"Topic {topic} now has {partitions} partition(s).")
    if "config" in answers:
        click.echo(f"Altered topic {topic}.")
        table(["CONFIG", "VALUE"], sorted(answers["config"]["config"].items()))
    return 0


@topics.command()
@click.argument("topic")
@click.option("--if-exists", is_flag=True, help="Succeed when there is no such topic.")
@client_command
def delete(client: Client, topic: str, if_exists: bool) -> int:
    """Delete TOPIC with its records, committed offsets and producer states (kafka-topics.sh
    --delete); each open transaction that wrote to it is aborted."""
    try:
        answer = client.http.request("DELETE", f"/v1/topics/{segment(topic)}")
    except KafkaException as exc:
        if not (if_exists and exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PARTITION):
            raise
        answer = {"name": topic, "deleted": False}
    if client.json:
        print_json(answer)
    elif answer.get("deleted") is False:
        click.echo(f"Topic {topic} does not exist.")
    else:
        aborted = answer["aborted_transactions"]
        click.echo(f"Deleted topic {topic}." + (f" Aborted the open transactions of {', '.join(aborted)}." if aborted else ""))
    return 0
