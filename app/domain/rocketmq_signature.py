"""RocketMQ 5's request signature (``MQv2-HMAC-SHA1``), as pure functions.

A RocketMQ 5 client with credentials sends, on every gRPC call, the metadata
``x-mq-date-time: <yyyyMMdd'T'HHmmss'Z'>`` and
``authorization: MQv2-HMAC-SHA1 Credential=<access key>, SignedHeaders=x-mq-date-time,
Signature=<hex of HMAC-SHA1(secret key, the x-mq-date-time value)>`` (both UTF-8). The proxy
(``DefaultAuthenticationContextBuilder``) splits the header's scheme off at the first space, its
items at commas, each item at its first ``=``; the access key is the Credential's part before any
``/``; it compares the signature it computes with the one sent in constant time
(``signature_matches``).

RocketMQ's proxy does not look at the date at all, so a signature once seen is good forever. This
check also refuses a date further than ``MAX_SKEW_S`` (15 minutes) from the server's clock
(``check_date``), which bounds how long a captured signature can be replayed. The clients stamp
the date in UTC (the Java client) — but the Python client 5.1.x formats its LOCAL time with a
``Z``: a Python client on a machine whose time zone is not UTC is refused as skewed (run it with
``TZ=UTC``).
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from datetime import UTC, datetime
from hashlib import sha1

SCHEME = "MQv2-HMAC-SHA1"
DATE_TIME_HEADER = "x-mq-date-time"
AUTHORIZATION_HEADER = "authorization"
DATE_TIME_FORMAT = "%Y%m%dT%H%M%SZ"
# How far the signed date may be from the server's clock, either way (seconds).
MAX_SKEW_S = 15 * 60


class SignatureError(ValueError):
    """Why a request's signature is refused (RocketMQ's UNAUTHORIZED)."""


@dataclass(frozen=True)
class Authorization:
    """The parts of an ``authorization`` header: who claims to sign, and the signature sent."""

    access_key: str
    signature: str  # lower-case hex
    signed_headers: str


def sign(secret_key: str, date_time: str) -> str:
    """The signature a client with ``secret_key`` sends for ``date_time``: hex of HMAC-SHA1."""
    return hmac.new(secret_key.encode("utf-8"), date_time.encode("utf-8"), sha1).hexdigest()


def parse_authorization(header: str) -> Authorization:
    """The header's access key and signature, else ``SignatureError``."""
    scheme, _, rest = header.partition(" ")
    if scheme != SCHEME or not rest:
        raise SignatureError(f"the authorization header is not {SCHEME} Credential=..., SignedHeaders=..., Signature=...")
    items: dict[str, str] = {}
    for item in rest.split(","):
        key, sep, value = item.strip().partition("=")
        if not sep:
            raise SignatureError(f"authorization item {item.strip()!r} is not key=value")
        items[key] = value
    access_key = items.get("Credential", "").split("/")[0]
    signature = items.get("Signature", "").lower()
    if not access_key:
        raise SignatureError("the authorization header names no Credential")
    if not signature or any(c not in "0123456789abcdef" for c in signature):
        raise SignatureError("the authorization header's Signature is not hex")
    return Authorization(access_key, signature, items.get("SignedHeaders", ""))


def signed_at_s(date_time: str) -> float:
    """The instant ``x-mq-date-time`` names (UTC), else ``SignatureError``."""
    try:
        return datetime.strptime(date_time, DATE_TIME_FORMAT).replace(tzinfo=UTC).timestamp()
    except ValueError:
        raise SignatureError(f"{DATE_TIME_HEADER} {date_time!r} is not yyyyMMddTHHmmssZ") from None


def signature_matches(authorization: Authorization, date_time: str, secret_key: str) -> bool:
    """Does ``authorization`` sign ``date_time`` with ``secret_key``? Compared in constant time."""
    return hmac.compare_digest(sign(secret_key, date_time).encode(), authorization.signature.encode())


def check_date(date_time: str, now_s: float, max_skew_s: float = MAX_SKEW_S) -> None:
    """Raise ``SignatureError`` unless ``date_time`` is within ``max_skew_s`` of ``now_s``."""
    if abs(now_s - signed_at_s(date_time)) > max_skew_s:
        raise SignatureError(f"{DATE_TIME_HEADER} {date_time} is more than {int(max_skew_s)} s from the server's clock")
