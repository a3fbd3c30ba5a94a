"""The Kafka gateway's listeners, configured as Kafka configures a broker's.

- ``listeners`` (TXLOG_KAFKA_LISTENERS): ``NAME://HOST:PORT`` comma-separated, e.g.
  ``PLAINTEXT://127.0.0.1:9092,SASL_SSL://0.0.0.0:9094``. A name is a security protocol, or any
  name the ``listener.security.protocol.map`` (TXLOG_KAFKA_LISTENER_SECURITY_PROTOCOL_MAP,
  ``INTERNAL:SASL_PLAINTEXT,EXTERNAL:SASL_SSL``) maps to one. An empty host listens on every
  address; port 0 takes a free port.
- ``advertised.listeners`` (TXLOG_KAFKA_ADVERTISED_LISTENERS): where clients are told to connect,
  per listener name; a listener not named there is advertised at its own address (Kafka's
  default), its host resolved when it listens on every address.
- The security protocols: PLAINTEXT, SSL (TLS; with client certificates, mutual TLS), SASL_PLAINTEXT
  and SASL_SSL (SASL sign-in, over TLS for the latter).

What a set of listeners may not be (``refusals``) is one rule for every way to start a gateway.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Literal

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
ClientAuth = Literal["none", "requested", "required"]


class ListenerConfigError(ValueError):
    """A listener setting Kafka would refuse; the message names it."""


@dataclass(frozen=True)
class Listener:
    name: str
    host: str
    port: int
    security_protocol: str

    @property
    def tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.name}://{host}:{self.port}"


def parse_protocol_map(text: str | None) -> dict[str, str]:
    """``NAME:PROTOCOL,…`` (Kafka's listener.security.protocol.map); empty: every security
    protocol is a listener name of its own."""
    out = {p: p for p in SECURITY_PROTOCOLS}
    if not text or not text.strip():
        return out
    named: dict[str, str] = {}
    for entry in text.split(","):
        name, sep, protocol = entry.strip().partition(":")
        name, protocol = name.strip().upper(), protocol.strip().upper()
        if not sep or not name or protocol not in SECURITY_PROTOCOLS:
            raise ListenerConfigError(
                f"Invalid listener.security.protocol.map entry {entry.strip()!r}: expected NAME:PROTOCOL, "
                f"the protocol one of {', '.join(SECURITY_PROTOCOLS)}"
            )
        if name in named:
            raise ListenerConfigError(f"listener.security.protocol.map names {name} twice")
        named[name] = protocol
    return named


def _endpoints(text: str, setting: str) -> list[tuple[str, str, int]]:
    out = []
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        name, sep, address = entry.partition("://")
        host, colon, port = address.rpartition(":")
        if not sep or not name or not colon or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ListenerConfigError(f"Unable to parse {entry} to a broker endpoint in {setting}: expected NAME://HOST:PORT")
        if host.startswith("[") != host.endswith("]"):
            raise ListenerConfigError(f"Unable to parse {entry} to a broker endpoint in {setting}: unbalanced brackets")
        out.append((name.upper(), host.strip("[]"), int(port)))
    return out


def parse_listeners(text: str, protocol_map: dict[str, str]) -> list[Listener]:
    """Kafka's ``listeners``: each name once, each a known listener name, each port once (but 0)."""
    listeners = []
    for name, host, port in _endpoints(text, "listeners"):
        if name not in protocol_map:
            raise ListenerConfigError(
                f"No security protocol defined for listener {name}: name a security protocol "
                f"({', '.join(SECURITY_PROTOCOLS)}) or map the name in listener.security.protocol.map"
            )
        listeners.append(Listener(name, host, port, protocol_map[name]))
    if not listeners:
        raise ListenerConfigError("listeners must name at least one listener")
    names = [listener.name for listener in listeners]
    if len(set(names)) != len(names):
        raise ListenerConfigError(f"Each listener must have a different name, listeners: {text}")
    ports = [listener.port for listener in listeners if listener.port]
    if len(set(ports)) != len(ports):
        raise ListenerConfigError(f"Each listener must have a different port, listeners: {text}")
    return listeners


def advertise(
    listeners: Iterable[Listener], text: str | None, protocol_map: dict[str, str], resolve: Callable[[str], str]
) -> dict[str, tuple[str, int]]:
    """Where clients are told to connect, by listener name (``advertised.listeners``): the one given
    there, else the listener's own address, ``resolve`` turning a host that means every address
    into this machine's name. A port 0 stays 0 here: it is the bound port once listening."""
    bound = {listener.name: listener for listener in listeners}
    out = {name: (resolve(listener.host), listener.port) for name, listener in bound.items()}
    for name, host, port in _endpoints(text or "", "advertised.listeners"):
        if name not in bound:
            raise ListenerConfigError(
                f"advertised.listeners listener names must be equal to or a subset of the ones defined in listeners: {name}"
            )
        if protocol_map.get(name) != bound[name].security_protocol:
            raise ListenerConfigError(f"advertised.listeners names {name} with another security protocol")
        if host in ("0.0.0.0", "::", ""):
            raise ListenerConfigError(f"advertised.listeners cannot use the nonroutable meta-address {host or '(empty)'}: {name}")
        out[name] = (host, port or bound[name].port)
    return out


def single(listen_host: str, listen_port: int, authenticated: bool) -> Listener:
    """The one listener of ``--listen``/TXLOG_KAFKA_LISTEN: PLAINTEXT, or SASL_PLAINTEXT when the
    gateway authenticates (TXLOG_AUTH=token), where clients sign in with SASL."""
    protocol = "SASL_PLAINTEXT" if authenticated else "PLAINTEXT"
    return Listener(protocol, listen_host, listen_port, protocol)


def refusals(
    listeners: Iterable[Listener],
    authenticated: bool,
    client_auth: ClientAuth,
    has_certificate: bool,
    has_ca: bool,
    is_loopback: Callable[[str], bool],
) -> tuple[list[str], list[str]]:
    """What is wrong with serving these listeners: (always refused, refused unless ``--insecure``).

    - SASL_* listeners sign clients in against the principals: TXLOG_AUTH=token is needed.
    - SSL and SASL_SSL need a certificate and its key; client certificates need a CA to check them.
    - With TXLOG_AUTH=token, a PLAINTEXT listener, or an SSL one whose clients need no certificate,
      lets anyone in as ANONYMOUS: ``--insecure`` only.
    - Without authentication, a listener beyond loopback lets anyone in: ``--insecure`` only."""
    errors: list[str] = []
    insecure: list[str] = []
    for listener in listeners:
        if listener.sasl and not authenticated:
            errors.append(f"listener {listener} signs clients in with SASL: set TXLOG_AUTH=token")
        if listener.tls and not has_certificate:
            errors.append(f"listener {listener} is TLS: set TXLOG_KAFKA_SSL_CERTFILE and TXLOG_KAFKA_SSL_KEYFILE")
        if listener.security_protocol == "SSL" and client_auth != "none" and not has_ca:
            errors.append(f"listener {listener} asks for client certificates: set TXLOG_KAFKA_SSL_CAFILE to check them")
        if authenticated and listener.security_protocol == "PLAINTEXT":
            insecure.append(f"listener {listener} authenticates no one: anyone who can reach it is ANONYMOUS")
        elif authenticated and listener.security_protocol == "SSL" and client_auth != "required":
            insecure.append(
                f"listener {listener} takes clients without a certificate (TXLOG_KAFKA_SSL_CLIENT_AUTH={client_auth}) as ANONYMOUS"
            )
        elif not authenticated and not is_loopback(listener.host):
            insecure.append(
                f"listener {listener} serves {listener.host or 'every address'} without authentication (TXLOG_AUTH=none): "
                "anyone who can reach it could read and write every topic"
            )
    return errors, insecure
