"""Alembic environment: the schema source is app.storage.tables; migrations run under an advisory
lock so several hosts starting at once migrate one after another."""

from alembic import context
from sqlalchemy import text

from app.storage.db import create_engine
from app.storage.tables import SCHEMA, metadata

MIGRATION_LOCK = 0x7478_6C6F  # "txlo"

config = context.config


def include_name(name, type_, parent_names):  # type: ignore[no-untyped-def]
    if type_ == "schema":
        return name == SCHEMA
    return True


def run_migrations_online() -> None:
    connectable = config.attributes.get("connection")
    if connectable is None:
        # No session limits: a migration may wait for locks and run long.
        engine = create_engine(config.get_main_option("sqlalchemy.url"), pool_size=1, max_overflow=0, limits=None)
        with engine.connect() as connection:
            _run(connection)
        engine.dispose()
    else:
        _run(connectable)


def _run(connection) -> None:  # type: ignore[no-untyped-def]
    connection.execute(text("SELECT pg_advisory_lock(:k)"), {"k": MIGRATION_LOCK})
    connection.execute(text(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}"))
    connection.commit()
    try:
        context.configure(
            connection=connection,
            target_metadata=metadata,
            version_table_schema=SCHEMA,
            include_schemas=True,
            include_name=include_name,
            compare_type=True,
        )
        with context.begin_transaction():
            context.run_migrations()
        connection.commit()
    finally:
        connection.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": MIGRATION_LOCK})
        connection.commit()


if context.is_offline_mode():
    raise SystemExit("offline migrations are not supported; run `txlog migrate`")
run_migrations_online()
