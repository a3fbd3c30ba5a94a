"""``txlog principals …`` and ``txlog acls …`` (Kafka's kafka-acls.sh): principals with API tokens (and
SCRAM passwords for the Kafka wire, as kafka-configs.sh --entity-type users sets them) and the ACLs
that bind them to operations on resources. Like ``txlog migrate`` these work on the
database itself (``--database-url``, else ``$TXLOG_DATABASE_URL``, else the embedded one), so the
first principal can be created before any can sign in; over HTTP the same is
``/v1/principals`` and ``/v1/acls`` (Alter on the cluster). Every server process applies a change
within a second."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any, Callable, Iterator

import click

from app.cli.server import DATABASE_URL, resolve_database_url
from app.domain.acl_bindings import CLUSTER_NAME, AclBinding, Operation, PatternType, PermissionType, ResourceType, principal_name
from app.errors import TxlogError

if TYPE_CHECKING:
    from app.storage.db import Database

JSON = click.option("--json", "as_json", is_flag=True, help="JSON instead of a table")


def _database(url: str | None) -> Database:
    from app.storage.db import Database

    resolved, _ = resolve_database_url(url)
    return Database(resolved, pool_size=1, max_overflow=0)


def _fail(exc: TxlogError) -> int:
    click.echo(f"error: {exc.code.name} (code {exc.code.kafka_code}): {exc.message}", err=True)
    return 1


def _ms(value: int | None) -> str:
    if value is None:
        return "-"
    import datetime

    return datetime.datetime.fromtimestamp(value / 1000, tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- principals -----------------------------------------------------------------------------------


@click.group()
def principals() -> None:
    """Principals and their API tokens (sent as Authorization: Bearer), on the database itself."""


@principals.command("create")
@click.argument("name")
@DATABASE_URL
@JSON
def principals_create(name: str, database_url: str | None, as_json: bool) -> int:
    """Create principal NAME and print its token: shown this once, only its hash is stored."""
    from app.services import security

    db = _database(database_url)
    try:
        created = security.create_principal(db, principal_name(name))
    except TxlogError as exc:
        return _fail(exc)
    finally:
        db.dispose()
    if as_json:
        click.echo(
            json.dumps({"name": created.principal.name, "token": created.token, "created_at_ms": created.principal.created_at_ms})
        )
    else:
        click.echo(f"principal {created.principal.name} created; its token (shown only now):", err=True)
        click.echo(created.token)
    return 0


@principals.command("rocketmq-key")
def principals_rocketmq_key() -> int:
    """Print the RocketMQ secret key of the principal whose token is typed (a prompt on a terminal,
    else the first line of stdin): a RocketMQ client's Credentials are the principal's name and
    this key (MQv2-HMAC-SHA1 signs with the key itself, which the server derives from the token's
    stored hash). Computed here, from the token alone; a new token has a new key."""
    from app.services import security

    if sys.stdin.isatty():
        token = str(click.prompt("Token", hide_input=True))
    else:
        token = sys.stdin.readline().strip()
    if not token:
        raise click.UsageError("no token given")
    click.echo(security.rocketmq_secret_key(token))
    return 0


@principals.command("list")
@DATABASE_URL
@JSON
def principals_list(database_url: str | None, as_json: bool) -> int:
    """Every principal, revoked ones included, with its SCRAM mechanisms and their iterations."""
    from app.services import scram, security

    db = _database(database_url)
    try:
        found = security.list_principals(db)
        credentials = scram.credentials_by_principal(db)
    finally:
        db.dispose()
    if as_json:
        click.echo(
            json.dumps(
                {
                    "principals": [
                        {
                            "name": p.name,
                            "created_at_ms": p.created_at_ms,
                            "revoked_at_ms": p.revoked_at_ms,
                            "scram": [{"mechanism": m, "iterations": i} for m, i in credentials.get(p.name, [])],
                        }
                        for p in found
                    ]
                }
            )
        )
        return 0
    click.echo(f"{'PRINCIPAL':<32} {'CREATED':<21} {'REVOKED':<21} SCRAM")
    for p in found:
        scram_text = ", ".join(f"{m} ({i} iterations)" for m, i in credentials.get(p.name, [])) or "-"
        click.echo(f"{p.name:<32} {_ms(p.created_at_ms):<21} {_ms(p.revoked_at_ms):<21} {scram_text}")
    return 0


@principals.command("revoke")
@click.argument("name")
@DATABASE_URL
def principals_revoke(name: str, database_url: str | None) -> int:
    """Revoke NAME's token: refused by every server process within a second (its ACLs stay)."""
    from app.services import security

    db = _database(database_url)
    try:
        security.revoke_principal(db, principal_name(name))
    except TxlogError as exc:
        return _fail(exc)
    finally:
        db.dispose()
    click.echo(f"principal {principal_name(name)} revoked", err=True)
    return 0


# --- SCRAM credentials ----------------------------------------------------------------------------

MECHANISM = click.option(
    "--mechanism", required=True, type=click.Choice(["SCRAM-SHA-256", "SCRAM-SHA-512"], case_sensitive=False)
)


@principals.group("scram")
def principals_scram() -> None:
    """A principal's SCRAM passwords (SASL/SCRAM-SHA-256 and -512 on the Kafka wire; Kafka's
    kafka-configs.sh --alter --add-config 'SCRAM-SHA-256=[...]' --entity-type users)."""


def _password() -> str:
    """From a prompt (typed twice, not shown) on a terminal, else the first line of stdin: never a
    command-line argument, which other users of the machine can read."""
    stdin = sys.stdin
    if stdin.isatty():
        return str(click.prompt("Password", hide_input=True, confirmation_prompt=True))
    return stdin.readline().rstrip("\r\n")


@principals_scram.command("set")
@click.argument("name")
@MECHANISM
@click.option("--iterations", type=int, default=4096, show_default=True, help="PBKDF2 iterations, 4096 to 16384")
@DATABASE_URL
def principals_scram_set(name: str, mechanism: str, iterations: int, database_url: str | None) -> int:
    """Set NAME's SCRAM password for one mechanism, read from a prompt or stdin. A NAME that is no
    principal becomes one, with a token no one is told (it signs in by SCRAM); a revoked one is refused."""
    from app.services import scram

    password = _password()
    db = _database(database_url)
    try:
        scram.set_password(db, principal_name(name), mechanism.upper(), password, iterations)
    except TxlogError as exc:
        return _fail(exc)
    finally:
        db.dispose()
    click.echo(f"{mechanism.upper()} credential of {principal_name(name)} set ({iterations} iterations)", err=True)
    return 0


@principals_scram.command("delete")
@click.argument("name")
@MECHANISM
@DATABASE_URL
def principals_scram_delete(name: str, mechanism: str, database_url: str | None) -> int:
    """Delete NAME's SCRAM credential for one mechanism (RESOURCE_NOT_FOUND if it has none)."""
    from app.services import scram

    db = _database(database_url)
    try:
        scram.delete_credential(db, principal_name(name), mechanism.upper())
    except TxlogError as exc:
        return _fail(exc)
    finally:
        db.dispose()
    click.echo(f"{mechanism.upper()} credential of {principal_name(name)} deleted", err=True)
    return 0


# --- ACLs -----------------------------------------------------------------------------------------


def _resource_options(f: Callable[..., int]) -> Callable[..., int]:
    for option in reversed(
        [
            click.option("--allow-principal", multiple=True, metavar="P", help="principal allowed (User:NAME, NAME or *)"),
            click.option("--deny-principal", multiple=True, metavar="P", help="principal denied (a DENY wins over every ALLOW)"),
            click.option(
                "--operation",
                "operations",
                multiple=True,
                required=True,
                metavar="OP",
                help="All, Read, Write, Create, Delete, Alter, Describe, IdempotentWrite",
            ),
            click.option("--topic", multiple=True, metavar="T"),
            click.option("--group", multiple=True, metavar="G"),
            click.option("--transactional-id", multiple=True, metavar="ID"),
            click.option("--cluster", is_flag=True, help="the cluster resource"),
            click.option(
                "--resource-pattern-type",
                type=click.Choice(["literal", "prefixed"]),
                default="literal",
                show_default=True,
                help="literal: the name itself (* is every resource); prefixed: every name starting with it",
            ),
            DATABASE_URL,
        ]
    ):
        f = option(f)
    return f


def _bindings(
    allow_principal: tuple[str, ...],
    deny_principal: tuple[str, ...],
    operations: tuple[str, ...],
    topic: tuple[str, ...],
    group: tuple[str, ...],
    transactional_id: tuple[str, ...],
    cluster: bool,
    resource_pattern_type: str,
) -> Iterator[AclBinding]:
    if not allow_principal and not deny_principal:
        raise click.UsageError("name at least one --allow-principal or --deny-principal")
    resources = [(ResourceType.TOPIC, n) for n in topic] + [(ResourceType.GROUP, n) for n in group]
    resources += [(ResourceType.TRANSACTIONAL_ID, n) for n in transactional_id]
    if cluster:
        resources.append((ResourceType.CLUSTER, CLUSTER_NAME))
    if not resources:
        raise click.UsageError("name a resource: --topic, --group, --transactional-id or --cluster")
    try:
        ops = [Operation.parse(o) for o in operations]
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    people = [(principal_name(p), PermissionType.ALLOW) for p in allow_principal]
    people += [(principal_name(p), PermissionType.DENY) for p in deny_principal]
    for who, permission in people:
        for rt, name in resources:
            pattern = PatternType.LITERAL if rt is ResourceType.CLUSTER else PatternType(resource_pattern_type)
            for op in ops:
                yield AclBinding(who, rt, name, pattern, op, permission)


def _describe(b: AclBinding) -> str:
    return (
        f"User:{b.principal} has {b.permission.value.capitalize()} permission for operation {b.operation.value} "
        f"on {b.resource_type.value} {b.resource_name!r} ({b.pattern_type.value})"
    )


@click.group()
def acls() -> None:
    """Kafka's ACLs: ALLOW or DENY of an operation on topics, groups, transactional ids or the
    cluster, by literal name or prefix, on the database itself."""


@acls.command("add")
@_resource_options
def acls_add(database_url: str | None, **selection: Any) -> int:
    """Add ACLs: every principal named × every resource × every operation."""
    from app.services import security

    bindings = list(_bindings(**selection))
    db = _database(database_url)
    try:
        added = security.add_acls(db, bindings)
    except TxlogError as exc:
        return _fail(exc)
    finally:
        db.dispose()
    for b in bindings:
        click.echo(("added: " if b in added else "exists: ") + _describe(b))
    return 0


@acls.command("remove")
@_resource_options
def acls_remove(database_url: str | None, **selection: Any) -> int:
    """Remove exactly the ACLs named as `acls add` would add them."""
    from app.services import security

    bindings = list(_bindings(**selection))
    db = _database(database_url)
    try:
        removed = security.remove_acls(db, bindings)
    finally:
        db.dispose()
    for b in bindings:
        click.echo(("removed: " if b in removed else "absent: ") + _describe(b))
    return 0


@acls.command("list")
@click.option("--principal", default=None, metavar="P", help="only this principal's ACLs")
@DATABASE_URL
@JSON
def acls_list(principal: str | None, database_url: str | None, as_json: bool) -> int:
    """Every ACL, or one principal's."""
    from app.services import security

    db = _database(database_url)
    try:
        found = security.list_acls(db, principal_name(principal) if principal else None)
    finally:
        db.dispose()
    if as_json:
        click.echo(json.dumps({"acls": [a.to_dict() for a in found]}))
        return 0
    click.echo(f"{'PRINCIPAL':<20} {'PERMISSION':<10} {'OPERATION':<16} {'RESOURCE-TYPE':<17} {'PATTERN':<9} RESOURCE")
    for b in found:
        click.echo(
            f"{b.principal:<20} {b.permission.value:<10} {b.operation.value:<16} {b.resource_type.value:<17} "
            f"{b.pattern_type.value:<9} {b.resource_name}"
        )
    return 0
