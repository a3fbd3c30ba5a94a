"""``txlog rocketmq``: the RocketMQ gateway, a proxy to RocketMQ 5's own clients (gRPC) over
txlog's database."""

from __future__ import annotations

import logging
import sys

import click

from app.cli.listeners import rocketmq_listener
from app.cli.server import DATABASE_URL, resolve_database_url

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


@click.command()
@click.option(
    "--listen",
    default=None,
    metavar="HOST:PORT",
    help="Address to listen on (default: $TXLOG_ROCKETMQ_LISTEN, else 127.0.0.1:8081, the port of RocketMQ's proxy)",
)
@click.option(
    "--advertised-host",
    default=None,
    metavar="HOST",
    help="Host clients are routed to (default: $TXLOG_ROCKETMQ_ADVERTISED_HOST, else the listen host)",
)
@DATABASE_URL
@click.option("--log-level", type=click.Choice(LOG_LEVELS), default="info", show_default=True)
@click.option("--insecure", is_flag=True, help="Serve beyond loopback without TXLOG_AUTH=token (no call authenticated)")
def rocketmq(listen: str | None, advertised_host: str | None, database_url: str | None, log_level: str, insecure: bool) -> int:
    """Run the RocketMQ gateway: RocketMQ 5's own clients route and send over gRPC, as to a
    RocketMQ proxy, into txlog's topics (docs/rocketmq.md)."""
    from app.config import load_settings
    from app.services import Broker
    from app.storage import migrate as migrations
    from app.storage.db import Database

    logging.basicConfig(
        level=logging.DEBUG if log_level == "trace" else log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    overrides = {"rocketmq_listen": listen, "rocketmq_advertised_host": advertised_host}
    settings = load_settings(**overrides)
    host, port = rocketmq_listener(settings, insecure)
    from api.rocketmq import server as gateway

    url, server = resolve_database_url(database_url)
    try:
        migrations.upgrade(url)
        settings = load_settings(database_url=url, **overrides)
        broker = Broker(Database.from_settings(settings), settings)
        if settings.auth == "token" and settings.admin_token:
            from app.services import security

            security.ensure_admin_principal(broker.db, settings.admin_token)
        print(f"txlog rocketmq: database {url}", file=sys.stderr)
        try:
            gateway.run(broker, host, port, settings.rocketmq_advertised_host)
        except gateway.ListenError as exc:
            raise click.ClickException(str(exc)) from None
        finally:
            broker.db.dispose()
    finally:
        if server is not None:
            server.stop()
    return 0
