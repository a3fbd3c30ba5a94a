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
    """The gateway authenticates no one yet (no SASL): like an HTTP server without authentication
    it listens on loopback only unless ``--insecure``; and with TXLOG_AUTH=token it would let any
    client past the ACLs, so it then runs only with ``--insecure`` too."""
    from api.kafka.server import parse_listen

    try:
        host, _ = parse_listen(listen)
    except ValueError as exc:
        raise click.UsageError(f"--listen: {exc}") from None
    if auth != "none" and not insecure:
        raise click.UsageError(
            "refusing to run the Kafka gateway with TXLOG_AUTH=token: it has no SASL yet, so its clients would "
            "bypass the principals' ACLs. Pass --insecure to run it anyway (on a trusted network)."
        )
    refuse_open_listener(host, False, insecure, "The Kafka gateway has no authentication yet (no SASL)")
