"""Schema migrations (Alembic) run from code: ``txlog migrate`` and ``txlog serve`` call these."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import psycopg
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection

import migrations
from app.storage.db import sqlalchemy_url
from app.storage.tables import SCHEMA


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    cfg.set_main_option("sqlalchemy.url", sqlalchemy_url(url).replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def upgrade_when_writable(url: str, wait_s: float, revision: str = "head") -> None:
    """``upgrade``, once a primary accepts the connection: a server or gateway started while its
    database is away or failing over (refused, shutting down, or only standbys reachable, none
    writable yet) waits for it, up to ``wait_s``, as a running one rides through the same outage;
    then the last failure is raised. Any other failure is raised at once."""
    deadline = time.monotonic() + wait_s
    delay = 0.2
    while True:
        try:
            upgrade(url, revision)
            return
        except (sa_exc.OperationalError, sa_exc.InternalError) as exc:
            unreachable = isinstance(exc.orig, (psycopg.OperationalError, psycopg.errors.ReadOnlySqlTransaction))
            if not unreachable or time.monotonic() + delay > deadline:
                raise
            print(f"txlog: waiting for the database to accept writes: {str(exc.orig).strip().splitlines()[0]}", file=sys.stderr)
        time.sleep(delay)
        delay = min(delay * 2, 2.0)


def head_revision(url: str) -> str | None:
    return ScriptDirectory.from_config(alembic_config(url)).get_current_head()


def current_revision(conn: Connection) -> str | None:
    ctx = MigrationContext.configure(conn, opts={"version_table_schema": SCHEMA})
    return ctx.get_current_revision()
