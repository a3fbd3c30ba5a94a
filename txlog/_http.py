"""The one HTTP transport of the client, the CLI and the half-message producer.

It finds the server (``url`` setting, else ``$TXLOG_URL``, else http://127.0.0.1:8080), sends the
token when one is given (``token`` setting, else ``$TXLOG_TOKEN``) as ``Authorization: Bearer``,
keeps connections alive, and turns every failure into a ``KafkaException``: the server's error
object keeps its Kafka code and fields (``reason`` of a fencing error is in the message and in
``details``); a connection that fails is ``_TRANSPORT`` and one that does not answer in time
``_TIMED_OUT``, both retriable. One ``Transport`` may be shared by threads.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import quote

import httpx
import orjson

from txlog.errors import KafkaError, KafkaException

DEFAULT_URL = "http://127.0.0.1:8080"


def resolve_url(url: str | None = None) -> str:
    """``url``, else ``$TXLOG_URL``, else the default; a bare ``host:port`` gets ``http://``."""
    url = url or os.environ.get("TXLOG_URL") or DEFAULT_URL
    url = url.split(",")[0].strip()  # bootstrap.servers may list several; the first is used
    if "://" not in url:
        url = "http://" + url
    return url.rstrip("/")


def resolve_token(token: str | None = None) -> str | None:
    return token or os.environ.get("TXLOG_TOKEN") or None


def segment(name: str) -> str:
    """One path segment, escaped (transactional ids and group ids may hold any character)."""
    return quote(str(name), safe="")


def server_error(status: int, body: bytes) -> KafkaError:
    """The error a non-2xx answer carries (or one built from the status when it carries none)."""
    try:
        err = orjson.loads(body)["error"]
        code = int(err.get("kafka_code", -1))
        message = str(err.get("message") or err.get("code"))
        details = {k: v for k, v in err.items() if k not in ("kafka_code", "message")}
    except (ValueError, KeyError, TypeError, AttributeError):
        code, message, details = -1, f"HTTP {status}: {body[:200].decode('utf-8', 'replace')}", {}
    if details.get("reason"):
        message = f"{message} (reason: {details['reason']})"
    retriable = bool(details.get("retriable", status == 503))
    return KafkaError(code, message, retriable=retriable, details={"http_status": status, **details})


class Transport:
    def __init__(self, url: str | None = None, token: str | None = None, timeout_s: float = 30.0, **client_options: Any) -> None:
        self.url = resolve_url(url)
        token = resolve_token(token)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s, **client_options)

    def request(
        self, method: str, path: str, body: Any = None, params: dict | None = None, timeout_s: float | None = None
    ) -> Any:
        """Send one request and answer its decoded JSON; raise ``KafkaException`` on any failure."""
        content = orjson.dumps(body) if body is not None else None
        headers = {"Content-Type": "application/json"} if content is not None else None
        if params:
            params = {k: v for k, v in params.items() if v is not None}
        try:
            response = self._client.request(
                method,
                path,
                content=content,
                headers=headers,
                params=params,
                timeout=timeout_s if timeout_s is not None else httpx.USE_CLIENT_DEFAULT,
            )
        except httpx.TimeoutException as exc:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"{method} {path}: no answer in time ({exc})")) from None
        except httpx.HTTPError as exc:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, f"{method} {path}: {type(exc).__name__}: {exc}")) from None
        if response.status_code >= 400:
            raise KafkaException(server_error(response.status_code, response.content))
        if not response.content:
            return None
        return orjson.loads(response.content)

    def get(self, path: str, params: dict | None = None, timeout_s: float | None = None) -> Any:
        return self.request("GET", path, params=params, timeout_s=timeout_s)

    def post(self, path: str, body: Any = None, timeout_s: float | None = None) -> Any:
        return self.request("POST", path, body=body, timeout_s=timeout_s)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> "Transport":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
