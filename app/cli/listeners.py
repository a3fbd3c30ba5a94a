"""Who may listen where: a listener that authenticates no one serves loopback only unless
``--insecure``. The rule of ``txlog serve`` and of the Kafka gateway (``txlog kafka``, and
``txlog serve --kafka``, which checks it before starting either), whose listeners also follow
``app.domain.listeners.refusals``."""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING

import click

from app.domain.listeners import Listener, ListenerConfigError, advertise, parse_listeners, parse_protocol_map, refusals, single
from app.domain.ssl_principal import MappingRuleError, parse_rules

if TYPE_CHECKING:
    from app.config import Settings


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


def gateway_listeners(settings: Settings, insecure: bool) -> tuple[list[Listener], dict[str, tuple[str, int]]]:
    """The gateway's listeners and where each is advertised, from TXLOG_KAFKA_LISTENERS (Kafka's
    listeners, advertised.listeners, listener.security.protocol.map) or else the one listener of
    TXLOG_KAFKA_LISTEN (PLAINTEXT, SASL_PLAINTEXT with TXLOG_AUTH=token); refused as
    ``app.domain.listeners.refusals`` says, some unless ``--insecure``."""
    from api.kafka.process import advertised_host, parse_listen

    authenticated = settings.auth != "none"
    try:
        if settings.kafka_listeners:
            if "kafka_listen" in settings.model_fields_set or "kafka_advertised_host" in settings.model_fields_set:
                raise ListenerConfigError(
                    "give the listeners either as TXLOG_KAFKA_LISTENERS (--listeners) or as TXLOG_KAFKA_LISTEN (--listen), not both"
                )
            protocols = parse_protocol_map(settings.kafka_listener_security_protocol_map)
            found = parse_listeners(settings.kafka_listeners, protocols)
            advertised = advertise(found, settings.kafka_advertised_listeners, protocols, advertised_host)
        else:
            try:
                host, port = parse_listen(settings.kafka_listen)
            except ValueError as exc:
                raise ListenerConfigError(f"--listen: {exc}") from None
            found = [single(host, port, authenticated)]
            advertised = {found[0].name: (settings.kafka_advertised_host or advertised_host(host), port)}
    except ListenerConfigError as exc:
        raise click.UsageError(str(exc)) from None
    try:
        parse_rules(settings.kafka_ssl_principal_mapping_rules)
    except MappingRuleError as exc:
        raise click.UsageError(f"TXLOG_KAFKA_SSL_PRINCIPAL_MAPPING_RULES (ssl.principal.mapping.rules): {exc}") from None
    errors, open_ = refusals(
        found,
        authenticated,
        settings.kafka_ssl_client_auth,
        bool(settings.kafka_ssl_certfile and settings.kafka_ssl_keyfile),
        bool(settings.kafka_ssl_cafile),
        is_loopback_host,
    )
    if errors:
        raise click.UsageError("refusing to start the Kafka gateway: " + "; ".join(errors))
    if open_ and not insecure:
        remedy = (
            "Use SASL_PLAINTEXT or SASL_SSL listeners, or SSL with TXLOG_KAFKA_SSL_CLIENT_AUTH=required"
            if authenticated
            else "Set TXLOG_AUTH=token so that clients sign in with SASL (docs/security.md)"
        )
        raise click.UsageError(f"refusing to serve: {'; '.join(open_)}. {remedy}, or pass --insecure to serve it anyway.")
    return found, advertised


def refuse_open_gateway(listen: str, auth: str, insecure: bool) -> None:
    """The rule for the one listener of ``--listen``: with TXLOG_AUTH=token its clients sign in
    with SASL and may connect from anywhere; without authentication it serves loopback only
    unless ``--insecure``."""
    from app.config import Settings

    gateway_listeners(Settings.model_construct(kafka_listen=listen, auth="none" if auth == "none" else "token"), insecure)


def rocketmq_listener(settings: Settings, insecure: bool) -> tuple[str, int]:
    """The RocketMQ gateway's address (TXLOG_ROCKETMQ_LISTEN): with TXLOG_AUTH=token every call is
    signed by a principal (``api.rocketmq.identity``); without, loopback only unless ``--insecure``."""
    from api.kafka.process import parse_listen

    try:
        host, port = parse_listen(settings.rocketmq_listen)
    except ValueError as exc:
        raise click.UsageError(f"--listen: {exc}") from None
    refuse_open_listener(
        host, settings.auth != "none", insecure, "Listen on loopback (TXLOG_ROCKETMQ_LISTEN), or set TXLOG_AUTH=token"
    )
    return host, port
