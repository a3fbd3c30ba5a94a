"""Who may listen where: a listener that authenticates no one serves loopback only unless
``--insecure``. The rule of ``txlog serve`` and of the Kafka gateway (``txlog kafka``, and
``txlog serve --kafka``, which checks it before starting either)."""

from __future__ import annotations

import ipaddress

import click


def refuse_open_listener(host: str, authenticated: bool, insecure: bool, remedy: str) -> None:
    """The rule of every listener: without authentication, loopback only, unless ``--insecure``."""
    if not authenticated and not insecure and not is_loopback_host(host):
        raise click.UsageError(
            f"refusing to serve {host} without authentication: anyone who can reach it could read and write "
            f"every topic. {remedy}, or pass --insecure to serve it open anyway."
        )


def is_loopback_host(host: str) -> bool:
    """``localhost`` or a loopback address (127.0.0.0/8, ::1): reachable only from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def refuse_open_gateway(listen: str, auth: str, insecure: bool) -> None:
    """The gateway's rule is every listener's: with TXLOG_AUTH=token its clients sign in with SASL
    and may connect from anywhere; without authentication it serves loopback only unless
    ``--insecure``."""
    from api.kafka.server import parse_listen

    try:
        host, _ = parse_listen(listen)
    except ValueError as exc:
        raise click.UsageError(f"--listen: {exc}") from None
    refuse_open_listener(
        host, auth != "none", insecure,
        "Set TXLOG_AUTH=token so that clients sign in with SASL (docs/security.md)",
    )
