"""The gateway's listeners as Kafka configures them, and what a set of listeners may not be."""

from __future__ import annotations

import pytest

from app.domain.listeners import Listener, ListenerConfigError, advertise, parse_listeners, parse_protocol_map, refusals, single

PROTOCOLS = parse_protocol_map(None)


def _loopback(host: str) -> bool:
    return host in ("127.0.0.1", "localhost", "::1")


def test_listener_names_are_security_protocols_by_default() -> None:
    found = parse_listeners("PLAINTEXT://127.0.0.1:9092, SASL_SSL://0.0.0.0:9094,SSL://[::1]:9095", PROTOCOLS)
    assert found == [
        Listener("PLAINTEXT", "127.0.0.1", 9092, "PLAINTEXT"),
        Listener("SASL_SSL", "0.0.0.0", 9094, "SASL_SSL"),
        Listener("SSL", "::1", 9095, "SSL"),
    ]
    assert str(found[2]) == "SSL://[::1]:9095"
    assert found[1].tls and found[1].sasl and not found[0].tls and not found[2].sasl


def test_named_listeners_through_the_protocol_map() -> None:
    protocols = parse_protocol_map("INTERNAL:SASL_PLAINTEXT, external:sasl_ssl")
    found = parse_listeners("INTERNAL://:9092,EXTERNAL://0.0.0.0:9094", protocols)
    assert [(x.name, x.host, x.security_protocol) for x in found] == [
        ("INTERNAL", "", "SASL_PLAINTEXT"),
        ("EXTERNAL", "0.0.0.0", "SASL_SSL"),
    ]
    with pytest.raises(ListenerConfigError, match="No security protocol defined for listener PLAINTEXT"):
        parse_listeners("PLAINTEXT://:9092", protocols)  # a map replaces the default names


@pytest.mark.parametrize(
    "text, message",
    [
        ("PLAINTEXT://127.0.0.1", "Unable to parse"),
        ("127.0.0.1:9092", "Unable to parse"),
        ("PLAINTEXT://127.0.0.1:99999", "Unable to parse"),
        ("HTTP://127.0.0.1:80", "No security protocol defined for listener HTTP"),
        ("PLAINTEXT://a:9092,PLAINTEXT://b:9093", "different name"),
        ("PLAINTEXT://a:9092,SSL://b:9092", "different port"),
        ("", "at least one"),
    ],
)
def test_listeners_kafka_refuses(text: str, message: str) -> None:
    with pytest.raises(ListenerConfigError, match=message):
        parse_listeners(text, PROTOCOLS)


def test_two_listeners_on_port_0_are_fine() -> None:
    assert len(parse_listeners("PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0", PROTOCOLS)) == 2


@pytest.mark.parametrize("text", ["X:PLAINTEXT,X:SSL", "X:HTTP", "X"])
def test_protocol_maps_kafka_refuses(text: str) -> None:
    with pytest.raises(ListenerConfigError):
        parse_protocol_map(text)


def test_advertised_listeners_default_to_each_listener_with_every_address_resolved() -> None:
    found = parse_listeners("PLAINTEXT://127.0.0.1:9092,SASL_SSL://0.0.0.0:9094", PROTOCOLS)

    def resolve(host: str) -> str:
        return "gw1.example" if host == "0.0.0.0" else host

    assert advertise(found, None, PROTOCOLS, resolve) == {"PLAINTEXT": ("127.0.0.1", 9092), "SASL_SSL": ("gw1.example", 9094)}
    assert advertise(found, "SASL_SSL://kafka.example:19094", PROTOCOLS, resolve) == {
        "PLAINTEXT": ("127.0.0.1", 9092),
        "SASL_SSL": ("kafka.example", 19094),
    }
    with pytest.raises(ListenerConfigError, match="subset"):
        advertise(found, "SSL://kafka.example:9093", PROTOCOLS, resolve)
    with pytest.raises(ListenerConfigError, match="nonroutable"):
        advertise(found, "SASL_SSL://0.0.0.0:9094", PROTOCOLS, resolve)


def test_the_one_listener_of_listen_signs_in_when_authenticating() -> None:
    assert single("127.0.0.1", 9092, False) == Listener("PLAINTEXT", "127.0.0.1", 9092, "PLAINTEXT")
    assert single("0.0.0.0", 9092, True) == Listener("SASL_PLAINTEXT", "0.0.0.0", 9092, "SASL_PLAINTEXT")


def _refusals(
    text: str, authenticated: bool, client_auth: str = "none", cert: bool = True, ca: bool = True
) -> tuple[list[str], list[str]]:
    return refusals(parse_listeners(text, PROTOCOLS), authenticated, client_auth, cert, ca, _loopback)  # type: ignore[arg-type]


def test_what_is_refused() -> None:
    # SASL needs principals to sign in against: never without TXLOG_AUTH=token.
    errors, _ = _refusals("SASL_PLAINTEXT://127.0.0.1:9092", authenticated=False)
    assert errors and "TXLOG_AUTH=token" in errors[0]
    # TLS needs a certificate; client certificates a CA.
    assert "CERTFILE" in _refusals("SSL://127.0.0.1:9093", True, "required", cert=False)[0][0]
    assert "CAFILE" in _refusals("SSL://127.0.0.1:9093", True, "required", ca=False)[0][0]
    # With TXLOG_AUTH=token: PLAINTEXT and SSL without required certificates let anyone in.
    assert _refusals("PLAINTEXT://127.0.0.1:9092", True) == (
        [],
        ["listener PLAINTEXT://127.0.0.1:9092 authenticates no one: anyone who can reach it is ANONYMOUS"],
    )
    assert _refusals("SSL://127.0.0.1:9093", True, "requested")[1]
    assert _refusals("SSL://0.0.0.0:9093,SASL_SSL://0.0.0.0:9094,SASL_PLAINTEXT://0.0.0.0:9095", True, "required") == ([], [])
    # Without authentication: loopback only.
    assert _refusals("PLAINTEXT://127.0.0.1:9092,SSL://localhost:9093", False) == ([], [])
    assert _refusals("PLAINTEXT://0.0.0.0:9092", False)[1]
    assert _refusals("SSL://:9093", False, "required")[1]


def test_session_lifetime_is_the_least_of_the_setting_and_the_credential() -> None:
    from api.kafka.handlers.sasl import session_lifetime_ms

    assert session_lifetime_ms(0, None, 1_000) == 0  # no re-authentication
    assert session_lifetime_ms(60_000, None, 1_000) == 60_000
    assert session_lifetime_ms(60_000, 31_000, 1_000) == 30_000
    assert session_lifetime_ms(0, 31_000, 1_000) == 30_000
    assert session_lifetime_ms(60_000, 500, 1_000) == 1  # a credential past its end: a session ending at once
