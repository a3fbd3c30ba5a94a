"""What ``txlog kafka`` and ``txlog rocketmq`` share: their ``--log-level``, and the start-up of a
gateway on txlog's database (migrated, the admin principal ensured) and its shutdown."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

from app.cli.server import resolve_database_url

if TYPE_CHECKING:
    from app.config import Settings
    from app.services import Broker

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")

LOG_LEVEL = click.option("--log-level", type=click.Choice(LOG_LEVELS), default="info", show_default=True)


def configure_logging(log_level: str) -> None:
    """Log at ``log_level`` (``trace`` is Python's DEBUG) to stderr."""
    logging.basicConfig(
        level=logging.DEBUG if log_level == "trace" else log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )


@contextmanager
def gateway_broker(command: str, database_url: str | None, overrides: dict[str, Any]) -> Iterator[tuple[Broker, Settings]]:
    """The broker ``txlog <command>`` serves, with its settings (``overrides`` on the environment's),
    on the database ``--database-url`` names (else the embedded one, started here and stopped on
    leaving), migrated to head; its connections are disposed of on leaving."""
    from app.config import load_settings
    from app.services import Broker, security
    from app.storage import migrate as migrations
    from app.storage.db import Database

    url, server = resolve_database_url(database_url)
    try:
        settings = load_settings(database_url=url, **overrides)
        migrations.upgrade_when_writable(url, settings.startup_database_wait_ms / 1000)
        broker = Broker(Database.from_settings(settings), settings)
        if settings.auth == "token" and settings.admin_token:
            security.ensure_admin_principal(broker.db, settings.admin_token)
        print(f"txlog {command}: database {url}", file=sys.stderr)
        try:
            yield broker, settings
        finally:
            broker.db.dispose()
    finally:
        if server is not None:
            server.stop()
