"""``txlog principals`` and ``txlog acls`` on the database itself, and the per-process
``Authorizer`` reading what they wrote: the first principal needs no server."""

from __future__ import annotations

import json

import pytest

from app.cli import main
from app.domain.acl_bindings import Operation, ResourceType
from app.domain.acls import Api
from app.errors import ErrorCode, TxlogError
from app.services.security import Authorizer
from app.storage.db import Database


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_principals_and_acls_from_the_command_line(db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "principals", "create", "User:alice", "--database-url", db_url, "--json")
    assert code == 0
    created = json.loads(out)
    assert created["name"] == "alice" and created["token"].startswith("txlog_")
    code, _, err = run(capsys, "principals", "create", "alice", "--database-url", db_url)
    assert code == 1 and "INVALID_REQUEST" in err  # an active principal's name is taken

    code, out, _ = run(
        capsys,
        "acls",
        "add",
        "--allow-principal",
        "User:alice",
        "--operation",
        "Read",
        "--operation",
        "Write",
        "--topic",
        "orders",
        "--resource-pattern-type",
        "prefixed",
        "--database-url",
        db_url,
    )
    assert code == 0 and out.count("added: ") == 2
    code, out, _ = run(
        capsys,
        "acls",
        "add",
        "--deny-principal",
        "alice",
        "--operation",
        "Read",
        "--topic",
        "orders-secret",
        "--database-url",
        db_url,
    )
    assert code == 0
    code, out, _ = run(capsys, "acls", "list", "--principal", "alice", "--json", "--database-url", db_url)
    listed = json.loads(out)["acls"]
    assert {(a["operation"], a["resource_name"], a["pattern_type"], a["permission_type"]) for a in listed} == {
        ("Read", "orders", "prefixed", "allow"),
        ("Write", "orders", "prefixed", "allow"),
        ("Read", "orders-secret", "literal", "deny"),
    }
    assert (
        run(capsys, "acls", "add", "--allow-principal", "alice", "--operation", "Frob", "--topic", "x", "--database-url", db_url)[
            0
        ]
        == 2
    )
    assert run(capsys, "acls", "add", "--operation", "Read", "--topic", "x", "--database-url", db_url)[0] == 2

    db = Database(db_url, pool_size=1)
    try:
        auth = Authorizer(db)
        alice = auth.authenticate(created["token"])
        assert alice.name == "alice"
        auth.check("alice", Api.FETCH, {"topic": "orders-eu"})
        with pytest.raises(TxlogError) as denied:
            auth.check("alice", Api.FETCH, {"topic": "orders-secret"})
        assert denied.value.code is ErrorCode.TOPIC_AUTHORIZATION_FAILED
        assert auth.allowed("alice", Operation.DESCRIBE, ResourceType.TOPIC, "orders-secret")  # Write implies Describe

        code, out, _ = run(
            capsys,
            "acls",
            "remove",
            "--deny-principal",
            "alice",
            "--operation",
            "Read",
            "--topic",
            "orders-secret",
            "--database-url",
            db_url,
        )
        assert code == 0 and "removed: " in out
        assert auth.refresh()
        auth.check("alice", Api.FETCH, {"topic": "orders-secret"})

        code, out, _ = run(capsys, "principals", "list", "--database-url", db_url)
        assert code == 0 and "alice" in out
        assert run(capsys, "principals", "revoke", "alice", "--database-url", db_url)[0] == 0
        assert auth.refresh()
        with pytest.raises(TxlogError) as refused:
            auth.authenticate(created["token"])
        assert refused.value.code is ErrorCode.SASL_AUTHENTICATION_FAILED
        assert run(capsys, "principals", "revoke", "nobody", "--database-url", db_url)[0] == 1
        # A revoked name may be taken again: a new token, the old one still refused.
        code, out, _ = run(capsys, "principals", "create", "alice", "--database-url", db_url)
        assert code == 0 and out.strip() != created["token"]
        auth.refresh()
        assert auth.authenticate(out.strip()).name == "alice"
        with pytest.raises(TxlogError):
            auth.authenticate(created["token"])
    finally:
        db.dispose()


def test_scram_passwords_from_the_command_line(
    db_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``txlog principals scram set`` reads the password from stdin (never an argument), creates
    the principal when there is none, and the credential signs in; ``list`` shows mechanisms and
    iterations, never keys; ``delete`` removes one mechanism's."""
    import io

    from app.services import sasl
    from tests.unit.test_scram import kafka_python_scram_client

    ScramClient = kafka_python_scram_client()

    monkeypatch.setattr("sys.stdin", io.StringIO("s3cret pass\n"))
    code, _, err = run(
        capsys,
        "principals",
        "scram",
        "set",
        "User:scram-cli",
        "--mechanism",
        "scram-sha-512",
        "--iterations",
        "8192",
        "--database-url",
        db_url,
    )
    assert code == 0, err
    monkeypatch.setattr("sys.stdin", io.StringIO("other\n"))
    assert (
        run(capsys, "principals", "scram", "set", "scram-cli", "--mechanism", "SCRAM-SHA-256", "--database-url", db_url)[0] == 0
    )
    monkeypatch.setattr("sys.stdin", io.StringIO("x\n"))
    code, _, err = run(
        capsys,
        "principals",
        "scram",
        "set",
        "scram-cli",
        "--mechanism",
        "SCRAM-SHA-256",
        "--iterations",
        "100",
        "--database-url",
        db_url,
    )
    assert code == 1 and "UNACCEPTABLE_CREDENTIAL" in err

    code, out, _ = run(capsys, "principals", "list", "--json", "--database-url", db_url)
    listed = {p["name"]: p["scram"] for p in json.loads(out)["principals"]}
    assert listed["scram-cli"] == [
        {"mechanism": "SCRAM-SHA-256", "iterations": 4096},
        {"mechanism": "SCRAM-SHA-512", "iterations": 8192},
    ]
    code, out, _ = run(capsys, "principals", "list", "--database-url", db_url)
    assert "SCRAM-SHA-512 (8192 iterations)" in out

    db = Database(db_url, pool_size=1)
    try:
        client = ScramClient("scram-cli", "s3cret pass", "SCRAM-SHA-512")
        exchange = sasl.start("SCRAM-SHA-512", Authorizer(db))
        client.process_server_first_message(exchange.respond(client.first_message()))
        client.process_server_final_message(exchange.respond(client.final_message()))
        assert exchange.principal is not None and exchange.principal.name == "scram-cli"
    finally:
        db.dispose()

    assert (
        run(capsys, "principals", "scram", "delete", "scram-cli", "--mechanism", "SCRAM-SHA-512", "--database-url", db_url)[0]
        == 0
    )
    code, _, err = run(
        capsys, "principals", "scram", "delete", "scram-cli", "--mechanism", "SCRAM-SHA-512", "--database-url", db_url
    )
    assert code == 1 and "RESOURCE_NOT_FOUND" in err
