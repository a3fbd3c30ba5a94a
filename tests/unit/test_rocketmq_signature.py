"""RocketMQ's MQv2-HMAC-SHA1 signature, checked against what RocketMQ's own Python client sends
(its ``Signature.metadata`` / ``Signature.sign``)."""

from __future__ import annotations

import calendar
import time
from types import SimpleNamespace

import pytest

from app.domain import rocketmq_signature as sig

rocketmq = pytest.importorskip("rocketmq")
from rocketmq.v5.util.signature import Signature  # noqa: E402

DATE = "20261127T120000Z"
AT = calendar.timegm(time.strptime(DATE, "%Y%m%dT%H%M%SZ"))


def test_a_known_vector_signed_by_the_client_itself() -> None:
    assert Signature.sign("s3cr3t", DATE) == sig.sign("s3cr3t", DATE)
    # the same vector from `printf 20261127T120000Z | openssl dgst -sha1 -hmac s3cr3t`
    assert sig.sign("s3cr3t", DATE) == "2accabff8a0d41b0da324b9e80c4cc2ccc4990f7"


def _client_metadata(ak: str, sk: str) -> dict[str, str]:
    config = SimpleNamespace(credentials=rocketmq.Credentials(ak, sk), namespace="")
    return dict(Signature.metadata(config, "client@1"))


def test_the_clients_header_parses_and_verifies() -> None:
    metadata = _client_metadata("alice", "the-key")
    auth = sig.parse_authorization(metadata[sig.AUTHORIZATION_HEADER])
    assert auth.access_key == "alice" and auth.signed_headers == sig.DATE_TIME_HEADER
    date_time = metadata[sig.DATE_TIME_HEADER]
    assert sig.signature_matches(auth, date_time, "the-key")
    assert not sig.signature_matches(auth, date_time, "another-key")
    assert not sig.signature_matches(auth, "20000101T000000Z", "the-key")


def test_upper_case_hex_and_a_scoped_credential_are_read_as_the_proxy_reads_them() -> None:
    signature = sig.sign("k", DATE).upper()
    auth = sig.parse_authorization(f"MQv2-HMAC-SHA1 Credential=bob/scope, SignedHeaders=x-mq-date-time, Signature={signature}")
    assert auth.access_key == "bob" and sig.signature_matches(auth, DATE, "k")


@pytest.mark.parametrize(
    "header",
    [
        "",
        "Bearer abc",
        "MQv2-HMAC-SHA1",
        "MQv2-HMAC-SHA1 Credential=, SignedHeaders=x-mq-date-time, Signature=00",
        "MQv2-HMAC-SHA1 Credential=alice, SignedHeaders=x-mq-date-time",
        "MQv2-HMAC-SHA1 Credential=alice, SignedHeaders=x-mq-date-time, Signature=not-hex",
        "MQv2-HMAC-SHA1 Credential=alice, junk",
    ],
)
def test_malformed_headers_are_refused(header: str) -> None:
    with pytest.raises(sig.SignatureError):
        sig.parse_authorization(header)


def test_the_date_must_be_within_the_skew_window() -> None:
    sig.check_date(DATE, AT)
    sig.check_date(DATE, AT + sig.MAX_SKEW_S)
    sig.check_date(DATE, AT - sig.MAX_SKEW_S)
    for now in (AT + sig.MAX_SKEW_S + 1, AT - sig.MAX_SKEW_S - 1):
        with pytest.raises(sig.SignatureError, match="from the server's clock"):
            sig.check_date(DATE, now)
    for bad in ("", "2026-11-27T12:00:00Z", "20261327T120000Z"):
        with pytest.raises(sig.SignatureError):
            sig.check_date(bad, AT)
