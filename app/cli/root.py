"""The ``txlog`` command line (click): ``serve``, ``kafka``, ``rocketmq``, ``migrate`` and ``db-url`` run the
servers or reach their database; ``topics``, ``produce``, ``consume``, ``transactions``,
``producers`` and ``groups`` are clients of its HTTP API, as Kafka's own tools are of a broker;
``spark`` runs Spark jobs over its tables."""

from __future__ import annotations

import importlib
from typing import ClassVar

import click

from app.cli.common import EXIT_CODES_HELP, EXIT_INTERRUPTED
from app.cli.consume import consume
from app.cli.groups import groups
from app.cli.kafka import kafka
from app.cli.produce import produce
from app.cli.producers import producers
from app.cli.quotas import quotas
from app.cli.rocketmq import rocketmq
from app.cli.security import acls, principals
from app.cli.server import db_url, migrate, serve
from app.cli.share_groups import share_groups
from app.cli.topics import topics
from app.cli.transactions import transactions


class Commands(click.Group):
    """The commands, those of ``LAZY`` imported only when named (``spark`` brings SQLAlchemy and the
    Spark helpers, which the client commands do not need)."""

    LAZY: ClassVar[dict[str, tuple[str, str]]] = {"spark": ("spark.cli", "spark")}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.LAZY])

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.LAZY:
            module, attr = self.LAZY[name]
            return getattr(importlib.import_module(module), attr)
        return super().get_command(ctx, name)


@click.group(
    cls=Commands, epilog=EXIT_CODES_HELP, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100}
)
def cli() -> None:
    """Kafka's exactly-once machinery on PostgreSQL."""


for command in (
    serve,
    kafka,
    rocketmq,
    migrate,
    db_url,
    topics,
    produce,
    consume,
    transactions,
    producers,
    groups,
    share_groups,
    principals,
    acls,
    quotas,
):
    cli.add_command(command)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; answer its exit code (see ``app.cli.common``)."""
    try:
        result = cli.main(args=argv, prog_name="txlog", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.Abort:
        click.echo("interrupted", err=True)
        return EXIT_INTERRUPTED
    return result if isinstance(result, int) else 0
