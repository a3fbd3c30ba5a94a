"""``txlog rocketmq``: the RocketMQ gateway, a proxy to RocketMQ 5's own clients (gRPC) over
txlog's database."""

from __future__ import annotations

import click

from app.cli.gateway import LOG_LEVEL, configure_logging, gateway_broker
from app.cli.listeners import rocketmq_listener
from app.cli.server import DATABASE_URL


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
@LOG_LEVEL
@click.option("--insecure", is_flag=True, help="Serve beyond loopback without TXLOG_AUTH=token (no call authenticated)")
def rocketmq(listen: str | None, advertised_host: str | None, database_url: str | None, log_level: str, insecure: bool) -> int:
    """Run the RocketMQ gateway: RocketMQ 5's own clients route and send over gRPC, as to a
    RocketMQ proxy, into txlog's topics (docs/rocketmq.md)."""
    from app.config import load_settings

    configure_logging(log_level)
    overrides = {"rocketmq_listen": listen, "rocketmq_advertised_host": advertised_host}
    host, port = rocketmq_listener(load_settings(**overrides), insecure)
    from api.rocketmq import server as gateway

    with gateway_broker("rocketmq", database_url, overrides) as (broker, settings):
        try:
            gateway.run(broker, host, port, settings.rocketmq_advertised_host)
        except gateway.ListenError as exc:
            raise click.ClickException(str(exc)) from None
    return 0
