"""Schema migrations (Alembic) run from code: ``txlog migrate`` and ``txlog serve`` call these."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
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


def head_revision(url: str) -> str | None:
    return ScriptDirectory.from_config(alembic_config(url)).get_current_head()


def current_revision(conn: Connection) -> str | None:
    ctx = MigrationContext.configure(conn, opts={"version_table_schema": SCHEMA})
    return ctx.get_current_revision()
