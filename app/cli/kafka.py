"""``txlog kafka``: the Kafka wire gateway, a broker to Kafka's own clients over txlog's database."""

from __future__ import annotations

import click

from app.cli.gateway import LOG_LEVEL, configure_logging, gateway_broker
from app.cli.listeners import gateway_listeners
from app.cli.server import DATABASE_URL


@click.command()
@click.option(
    "--listen", default=None, metavar="HOST:PORT", help="Address to listen on (default: $TXLOG_KAFKA_LISTEN, else 127.0.0.1:9092)"
)
@click.option(
    "--advertised-host",
    default=None,
    metavar="HOST",
    help="Host clients are told to connect to (default: $TXLOG_KAFKA_ADVERTISED_HOST, else the listen host)",
)
@click.option(
    "--listeners",
    default=None,
    metavar="NAME://HOST:PORT,…",
    help="Kafka's listeners, e.g. PLAINTEXT://127.0.0.1:9092,SASL_SSL://0.0.0.0:9094 (default: $TXLOG_KAFKA_LISTENERS; "
    "in place of --listen)",
)
@click.option(
    "--advertised-listeners",
    default=None,
    metavar="NAME://HOST:PORT,…",
    help="Kafka's advertised.listeners (default: $TXLOG_KAFKA_ADVERTISED_LISTENERS, else each listener's address)",
)
@click.option(
    "--ssl-certfile", default=None, metavar="PEM", help="The gateway's TLS certificate (default: $TXLOG_KAFKA_SSL_CERTFILE)"
)
@click.option("--ssl-keyfile", default=None, metavar="PEM", help="Its private key (default: $TXLOG_KAFKA_SSL_KEYFILE)")
@click.option(
    "--ssl-cafile", default=None, metavar="PEM", help="The CA that signs client certificates (default: $TXLOG_KAFKA_SSL_CAFILE)"
)
@click.option(
    "--ssl-client-auth",
    type=click.Choice(["none", "requested", "required"]),
    default=None,
    help="Client certificates on SSL listeners, Kafka's ssl.client.auth (default: $TXLOG_KAFKA_SSL_CLIENT_AUTH, else none)",
)
@click.option(
    "--node-id", type=click.IntRange(min=0), default=None, help="This gateway's broker id (default: $TXLOG_KAFKA_NODE_ID, else 0)"
)
@DATABASE_URL
@LOG_LEVEL
@click.option(
    "--insecure",
    is_flag=True,
    help="Serve a listener that authenticates no one: beyond loopback with TXLOG_AUTH=none, or PLAINTEXT (or SSL without "
    "required client certificates) with TXLOG_AUTH=token, whose clients are ANONYMOUS",
)
def kafka(
    listen: str | None,
    advertised_host: str | None,
    listeners: str | None,
    advertised_listeners: str | None,
    ssl_certfile: str | None,
    ssl_keyfile: str | None,
    ssl_cafile: str | None,
    ssl_client_auth: str | None,
    node_id: int | None,
    database_url: str | None,
    log_level: str,
    insecure: bool,
) -> int:
    """Run the Kafka wire gateway: Kafka clients (librdkafka, kafka-python, aiokafka, Java) produce
    and consume over Kafka's protocol, with the same guarantees as the HTTP API."""
    from api.kafka import process as gateway
    from app.config import load_settings
    from app.services.sweeper import SweeperThread

    configure_logging(log_level)
    overrides = {
        "kafka_listen": listen,
        "kafka_advertised_host": advertised_host,
        "kafka_node_id": node_id,
        "kafka_listeners": listeners,
        "kafka_advertised_listeners": advertised_listeners,
        "kafka_ssl_certfile": ssl_certfile,
        "kafka_ssl_keyfile": ssl_keyfile,
        "kafka_ssl_cafile": ssl_cafile,
        "kafka_ssl_client_auth": ssl_client_auth,
    }
    found, advertised = gateway_listeners(load_settings(**overrides), insecure)
    with gateway_broker("kafka", database_url, overrides) as (broker, settings):
        # Transactions begun over the wire time out as those begun over HTTP: the sweeper aborts them.
        # A read replica (TXLOG_REPLICA_DATABASE_URL) runs none: the gateways of the primary do.
        sweeper = None if settings.replica_database_url else SweeperThread(broker)
        if sweeper is not None:
            sweeper.start()
        try:
            gateway.run(broker, found, advertised, settings.kafka_node_id)
        except (gateway.ListenError, gateway.NodeIdInUse) as exc:
            raise click.ClickException(str(exc)) from None
        finally:
            if sweeper is not None:
                sweeper.stop()
    return 0
