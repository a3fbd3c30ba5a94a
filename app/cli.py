"""``txlog serve | migrate | db-url``."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile

from app.config import load_settings


def _database_url(args: argparse.Namespace) -> tuple[str, object | None]:
    """The URL to use and, when it is the embedded server, the server object."""
    settings = load_settings(database_url=getattr(args, "database_url", None))
    if settings.database_url:
        return settings.database_url, None
    from app.storage.embedded import EmbeddedPostgres

    server = EmbeddedPostgres(settings.data_dir)
    return server.start(), server


def cmd_db_url(args: argparse.Namespace) -> int:
    url, _ = _database_url(args)
    print(url)
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    from app.storage import migrate

    url, _ = _database_url(args)
    migrate.upgrade(url)
    print(f"migrated to {migrate.head_revision(url)}", file=sys.stderr)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from app.storage import migrate

    url, server = _database_url(args)
    migrate.upgrade(url)
    os.environ["TXLOG_DATABASE_URL"] = url  # workers read their settings from the environment
    if args.workers > 1 and "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="txlog-metrics-")
    print(f"txlog serving on http://{args.host}:{args.port} (docs at /docs, admin at /admin), database {url}", file=sys.stderr)
    if server is not None:
        # uvicorn re-raises SIGTERM after its graceful shutdown; with the default handler the process
        # would die there and leave the embedded PostgreSQL running. Exit through `finally` instead.
        signal.signal(signal.SIGTERM, _exit_on_signal)
    try:
        uvicorn.run(
            "api.app:app_factory",
            factory=True,
            host=args.host,
            port=args.port,
            workers=args.workers,
            log_level=args.log_level,
            timeout_graceful_shutdown=5,
        )
    finally:
        if server is not None:
            server.stop()  # type: ignore[attr-defined]
    return 0


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="txlog", description="Kafka's exactly-once machinery on PostgreSQL")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the HTTP API and admin pages")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8080)
    serve.add_argument("--workers", type=int, default=1)
    serve.add_argument("--database-url", default=None)
    serve.add_argument("--log-level", default="info")
    serve.set_defaults(func=cmd_serve)

    mig = sub.add_parser("migrate", help="upgrade the schema to head")
    mig.add_argument("--database-url", default=None)
    mig.set_defaults(func=cmd_migrate)

    dburl = sub.add_parser("db-url", help="print the database URL serve would use")
    dburl.set_defaults(func=cmd_db_url)

    try:
        from spark.cli import register as register_spark
    except ImportError:
        pass
    else:
        register_spark(sub)

    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
