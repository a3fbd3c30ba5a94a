"""``txlog quotas describe`` and ``txlog quotas alter`` on the database itself, and a process's
``QuotaManager`` picking up what they wrote."""

from __future__ import annotations

import json

import pytest

from app.cli import main
from app.services.quotas import QuotaManager
from app.storage.db import Database


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_quotas_from_the_command_line(db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    db = Database(db_url, pool_size=1, max_overflow=0)
    manager = QuotaManager(db)
    manager.refresh()
    assert not manager.enabled
    code, _, err = run(
        capsys,
        "quotas",
        "alter",
        "--user",
        "alice",
        "--client-default",
        "--add",
        "producer_byte_rate=1048576,consumer_byte_rate=2097152",
        "--add",
        "request_percentage=50.5",
        "--database-url",
        db_url,
    )
    assert code == 0 and "altered: /users/alice/clients/<default>" in err
    code, _, _ = run(
        capsys, "quotas", "alter", "--client-id", "app", "--add-config", "producer_byte_rate=1024", "--database-url", db_url
    )
    assert code == 0
    code, out, _ = run(capsys, "quotas", "describe", "--user", "alice", "--database-url", db_url)
    assert out.splitlines() == [
        "/users/alice/clients/<default>: consumer_byte_rate=2097152, producer_byte_rate=1048576, request_percentage=50.5"
    ]
    code, out, _ = run(capsys, "quotas", "describe", "--json", "--database-url", db_url)
    assert json.loads(out)["entries"] == [
        {"entity": {"client-id": "app"}, "values": {"producer_byte_rate": 1024.0}},
        {
            "entity": {"client-id": None, "user": "alice"},
            "values": {"consumer_byte_rate": 2097152.0, "producer_byte_rate": 1048576.0, "request_percentage": 50.5},
        },
    ]  # in the order of their paths (/clients/app, /users/alice/clients/<default>)
    # what every process applies: the first entity in Kafka's precedence with the key
    assert manager.refresh() and manager.enabled
    applied = manager.applied("alice", "app", "producer_byte_rate")
    assert applied is not None and (applied.limit, applied.usage) == (1048576.0, ("alice", "app", "producer_byte_rate"))
    applied = manager.applied(None, "app", "producer_byte_rate")  # no one signed in: Kafka's ANONYMOUS user
    assert applied is not None and (applied.limit, applied.usage) == (1024.0, ("", "app", "producer_byte_rate"))

    code, _, _ = run(
        capsys,
        "quotas",
        "alter",
        "--user",
        "alice",
        "--client-default",
        "--delete",
        "consumer_byte_rate",
        "--database-url",
        db_url,
    )
    assert code == 0
    code, out, _ = run(capsys, "quotas", "describe", "--user", "alice", "--client-default", "--strict", "--database-url", db_url)
    assert out.splitlines() == ["/users/alice/clients/<default>: producer_byte_rate=1048576, request_percentage=50.5"]
    # Kafka's refusals, named
    code, _, err = run(
        capsys, "quotas", "alter", "--client-id", "app", "--add", "producer_byte_rate=1.5", "--database-url", db_url
    )
    assert code == 1 and "INVALID_REQUEST (code 42): producer_byte_rate cannot be a fractional value." in err
    code, _, err = run(capsys, "quotas", "alter", "--client-id", "app", "--add", "fetch_rate=1", "--database-url", db_url)
    assert code == 1 and "Invalid configuration key fetch_rate" in err
    code, _, err = run(capsys, "quotas", "alter", "--add", "producer_byte_rate=1", "--database-url", db_url)
    assert code == 2
    db.dispose()
