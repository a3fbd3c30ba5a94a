"""``txlog kafka``: the Kafka wire gateway, a broker to Kafka's own clients over txlog's database."""

from __future__ import annotations

import logging
import sys

import click

from app.cli.listeners import refuse_open_gateway
from app.cli.server import DATABASE_URL, resolve_database_url

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


@click.command()
@click.option(
    "--listen", default=None, metavar="HOST:PORT", help="Address to listen on (default: $TXLOG_KAFKA_LISTEN, else 127.0.0.1:9092)"
)
@click.option(
    "--advertised-host", default=None, metavar="HOST",
    help="Host clients are told to connect to (default: $TXLOG_KAFKA_ADVERTISED_HOST, else the listen host)",
)
@click.option(
    "--node-id", type=click.IntRange(min=0), default=None, help="This gateway's broker id (default: $TXLOG_KAFKA_NODE_ID, else 0)"
)
@DATABASE_URL
@click.option("--log-level", type=click.Choice(LOG_LEVELS), default="info", show_default=True)
@click.option("--insecure", is_flag=True, help="Listen beyond loopback without authenticating clients (TXLOG_AUTH=none)")
def kafka(
    listen: str | None, advertised_host: str | None, node_id: int | None, database_url: str | None, log_level: str,
    insecure: bool,
) -> int:
    """Run the Kafka wire gateway: Kafka clients (librdkafka, kafka-python, aiokafka, Java) produce
    and consume over Kafka's protocol, with the same guarantees as the HTTP API."""
    from api.kafka import server as gateway
    from app.config import load_settings
    from app.services import Broker, security
    from app.services.sweeper import SweeperThread
    from app.storage import migrate as migrations
    from app.storage.db import Database

    logging.basicConfig(
        level=logging.DEBUG if log_level == "trace" else log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    overrides = {"kafka_listen": listen, "kafka_advertised_host": advertised_host, "kafka_node_id": node_id}
    settings = load_settings(**overrides)
    refuse_open_gateway(settings.kafka_listen, settings.auth, insecure)
    host, port = gateway.parse_listen(settings.kafka_listen)
    url, server = resolve_database_url(database_url)
    try:
        migrations.upgrade(url)
        settings = load_settings(database_url=url, **overrides)
        broker = Broker(Database.from_settings(settings), settings)
        if settings.auth == "token" and settings.admin_token:
            security.ensure_admin_principal(broker.db, settings.admin_token)
        print(f"txlog kafka: database {url}", file=sys.stderr)
        # Transactions begun over the wire time out as those begun over HTTP: the sweeper aborts them.
        sweeper = SweeperThread(broker)
        sweeper.start()
        try:
            gateway.run(broker, host, port, settings.kafka_node_id, settings.kafka_advertised_host)
        except (gateway.ListenError, gateway.NodeIdInUse) as exc:
            raise click.ClickException(str(exc)) from None
        finally:
            sweeper.stop()
            broker.db.dispose()
    finally:
        if server is not None:
            server.stop()
    return 0
