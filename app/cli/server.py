"""``txlog serve | migrate | db-url``: the commands that run the server or reach its database
directly (every other command is a client of the HTTP API)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from typing import TYPE_CHECKING

import click

from app.cli.listeners import gateway_listeners, refuse_open_listener, rocketmq_listener

if TYPE_CHECKING:
    from app.storage.embedded import EmbeddedPostgres


def resolve_database_url(given: str | None) -> tuple[str, EmbeddedPostgres | None]:
    """The database URL to use (``given``, else ``$TXLOG_DATABASE_URL``, else the embedded
    server's, started if needed) and, when it is the embedded server, the server object."""
    from app.config import load_settings

    settings = load_settings(database_url=given)
    if settings.database_url:
        return settings.database_url, None
    from app.storage.embedded import EmbeddedPostgres

    server = EmbeddedPostgres(settings.data_dir)
    return server.start(), server


DATABASE_URL = click.option(
    "--database-url",
    default=None,
    metavar="URL",
    help="PostgreSQL URL (default: $TXLOG_DATABASE_URL, else the embedded database)",
)


@click.command("db-url")
def db_url() -> int:
    """Print the URL of the database serve would use (starting the embedded one if needed)."""
    url, _ = resolve_database_url(None)
    click.echo(url)
    return 0


@click.command()
@DATABASE_URL
def migrate(database_url: str | None) -> int:
    """Upgrade the database schema to head."""
    from app.storage import migrate as migrations

    url, _ = resolve_database_url(database_url)
    migrations.upgrade(url)
    click.echo(f"migrated to {migrations.head_revision(url)}", err=True)
    return 0


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=8080, show_default=True)
@click.option("--workers", type=int, default=1, show_default=True)
@DATABASE_URL
@click.option("--log-level", default="info", show_default=True)
@click.option(
    "--auth", type=click.Choice(["none", "token"]), default=None, help="Authentication (default: $TXLOG_AUTH, else none)"
)
@click.option("--insecure", is_flag=True, help="Serve without authentication on an address other than loopback")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), default=None, help="PEM certificate: serve HTTPS")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), default=None, help="PEM private key of --tls-cert")
@click.option(
    "--kafka", is_flag=True, help="Also run the Kafka wire gateway (`txlog kafka`) on $TXLOG_KAFKA_LISTEN, same database"
)
@click.option(
    "--rocketmq", is_flag=True, help="Also run the RocketMQ gateway (`txlog rocketmq`) on $TXLOG_ROCKETMQ_LISTEN, same database"
)
def serve(
    host: str,
    port: int,
    workers: int,
    database_url: str | None,
    log_level: str,
    auth: str | None,
    insecure: bool,
    tls_cert: str | None,
    tls_key: str | None,
    kafka: bool,
    rocketmq: bool,
) -> int:
    """Run the HTTP API and the admin pages (and, with --kafka, the Kafka wire gateway; with
    --rocketmq, the RocketMQ gateway)."""
    import uvicorn

    from app.config import load_settings
    from app.storage import migrate as migrations

    if (tls_cert is None) != (tls_key is None):
        raise click.UsageError("--tls-cert and --tls-key go together")
    settings = load_settings()
    auth = auth or settings.auth
    refuse_open_listener(
        host,
        auth != "none",
        insecure,
        "Set TXLOG_AUTH=token (or --auth token) and create principals with `txlog principals create`",
    )
    if kafka:
        gateway_listeners(settings.model_copy(update={"auth": auth}), insecure)
    if rocketmq:
        rocketmq_listener(settings.model_copy(update={"auth": auth}), insecure)
    os.environ["TXLOG_AUTH"] = auth  # workers read their settings from the environment
    url, server = resolve_database_url(database_url)
    migrations.upgrade_when_writable(url, settings.startup_database_wait_ms / 1000)
    os.environ["TXLOG_DATABASE_URL"] = url  # workers read their settings from the environment
    if workers > 1 and "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="txlog-metrics-")
    scheme = "https" if tls_cert else "http"
    print(
        f"txlog serving on {scheme}://{host}:{port} (docs at /docs, admin at /admin), auth {auth}, database {url}",
        file=sys.stderr,
    )
    if server is not None or kafka or rocketmq:
        # uvicorn re-raises SIGTERM after its graceful shutdown; with the default handler the process
        # would die there and leave the embedded PostgreSQL (and the gateway) running. Exit through
        # `finally` instead.
        signal.signal(signal.SIGTERM, _exit_on_signal)
    # Each gateway is a process of its own (the Kafka gateway's consumer groups need one owner,
    # not one per worker), on this database: it neither starts nor stops the embedded PostgreSQL.
    gateways = [
        _start_gateway(command, insecure, log_level) for command, wanted in (("kafka", kafka), ("rocketmq", rocketmq)) if wanted
    ]
    try:
        uvicorn.run(
            "api.app:app_factory",
            factory=True,
            host=host,
            port=port,
            workers=workers,
            log_level=log_level,
            access_log=settings.access_log,
            timeout_graceful_shutdown=5,
            ssl_certfile=tls_cert,
            ssl_keyfile=tls_key,
        )
    finally:
        for gateway in gateways:
            _stop_gateway(gateway)
        if server is not None:
            server.stop()
    return 0


def _start_gateway(command: str, insecure: bool, log_level: str) -> subprocess.Popen[bytes]:
    """``txlog kafka`` or ``txlog rocketmq`` as a child process, on the database serve uses
    (``$TXLOG_DATABASE_URL``)."""
    argv = [sys.executable, "-m", "app.cli", command, "--log-level", log_level, *(["--insecure"] if insecure else [])]
    return subprocess.Popen(argv, env=os.environ.copy())


def _stop_gateway(gateway: subprocess.Popen[bytes]) -> None:
    if gateway.poll() is None:
        gateway.send_signal(signal.SIGTERM)
        try:
            gateway.wait(timeout=15)
        except subprocess.TimeoutExpired:
            gateway.kill()
            gateway.wait()


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)
