"""``txlog quotas describe`` and ``txlog quotas alter`` (Kafka's kafka-configs.sh and
kafka-client-quotas.sh for client quotas): the quotas of user and client-id entities. Like
``txlog acls`` these work on the database itself (``--database-url``, else ``$TXLOG_DATABASE_URL``,
else the embedded one); over the Kafka wire the same is DescribeClientQuotas and AlterClientQuotas.
Every gateway and HTTP worker applies a change within a fraction of a second."""

from __future__ import annotations

import json
from typing import Any, Callable

import click

from app.cli.security import JSON, _database, _fail
from app.cli.server import DATABASE_URL
from app.domain.quotas import CLIENT_ID, USER, FilterComponent, MatchType, entity_path
from app.errors import TxlogError


def _entity_options(f: Callable[..., int]) -> Callable[..., int]:
    for option in reversed(
        [
            click.option("--user", metavar="U", help="the user (a principal's name; ANONYMOUS without authentication)"),
            click.option("--user-default", is_flag=True, help="the default user: every user without a quota of its own"),
            click.option("--client-id", metavar="C", help="the client id"),
            click.option(
                "--client-default", is_flag=True, help="the default client id: every client id without a quota of its own"
            ),
            DATABASE_URL,
        ]
    ):
        f = option(f)
    return f


def _parts(user: str | None, user_default: bool, client_id: str | None, client_default: bool) -> list[tuple[str, str | None]]:
    if user is not None and user_default:
        raise click.UsageError("--user and --user-default exclude each other")
    if client_id is not None and client_default:
        raise click.UsageError("--client-id and --client-default exclude each other")
    parts: list[tuple[str, str | None]] = []
    if user is not None or user_default:
        parts.append((USER, user))
    if client_id is not None or client_default:
        parts.append((CLIENT_ID, client_id))
    return parts


def _configs(values: tuple[str, ...]) -> list[str]:
    """``a=1,b=2`` given once or several times, as kafka-configs.sh takes them."""
    return [item.strip() for value in values for item in value.split(",") if item.strip()]


def _value(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise click.UsageError(f"{text!r} is not a number") from None


@click.group()
def quotas() -> None:
    """Kafka's client quotas (producer_byte_rate, consumer_byte_rate, request_percentage) on user
    and client-id entities, on the database itself."""


@quotas.command("describe")
@_entity_options
@click.option("--strict", is_flag=True, help="only entities with exactly the types named")
@JSON
def quotas_describe(
    user: str | None,
    user_default: bool,
    client_id: str | None,
    client_default: bool,
    database_url: str | None,
    strict: bool,
    as_json: bool,
) -> int:
    """The quotas of the entities named (every entity when none is)."""
    from app.services import quotas as service

    components = [
        FilterComponent(t, MatchType.DEFAULT if name is None else MatchType.EXACT, name)
        for t, name in _parts(user, user_default, client_id, client_default)
    ]
    db = _database(database_url)
    try:
        found = service.describe_quotas(db, components, strict)
    except TxlogError as exc:
        return _fail(exc)
    finally:
        db.dispose()
    if as_json:
        click.echo(json.dumps({"entries": [{"entity": dict(e), "values": v} for e, v in found]}))
        return 0
    for entity, values in found:
        click.echo(f"{entity_path(entity)}: " + ", ".join(f"{k}={_number(v)}" for k, v in sorted(values.items())))
    return 0


def _number(value: float) -> Any:
    return int(value) if value.is_integer() else value


@quotas.command("alter")
@_entity_options
@click.option("--add", "--add-config", "add", multiple=True, metavar="KEY=VALUE[,…]", help="set quotas")
@click.option("--delete", "--delete-config", "delete", multiple=True, metavar="KEY[,…]", help="remove quotas")
@click.option("--validate-only", is_flag=True, help="check, change nothing")
def quotas_alter(
    user: str | None,
    user_default: bool,
    client_id: str | None,
    client_default: bool,
    database_url: str | None,
    add: tuple[str, ...],
    delete: tuple[str, ...],
    validate_only: bool,
) -> int:
    """Set (--add producer_byte_rate=1048576) or remove (--delete consumer_byte_rate) the quotas of
    one entity: --user and/or --client-id, each named or the default."""
    from app.services import quotas as service

    parts = _parts(user, user_default, client_id, client_default)
    if not parts:
        raise click.UsageError("name the entity: --user, --user-default, --client-id or --client-default")
    ops = []
    for item in _configs(add):
        key, sep, value = item.partition("=")
        if not sep:
            raise click.UsageError(f"--add takes KEY=VALUE, not {item!r}")
        ops.append(service.QuotaOp(key.strip(), _value(value.strip())))
    ops += [service.QuotaOp(key, 0.0, remove=True) for key in _configs(delete)]
    if not ops:
        raise click.UsageError("nothing to change: --add KEY=VALUE or --delete KEY")
    db = _database(database_url)
    try:
        (error,) = service.alter_quotas(db, [service.QuotaAlteration(parts, ops)], validate_only)
    except TxlogError as exc:
        return _fail(exc)
    finally:
        db.dispose()
    if error is not None:
        return _fail(error)
    path = entity_path(tuple(sorted(parts)))
    click.echo(f"{'validated' if validate_only else 'altered'}: {path}", err=True)
    return 0
