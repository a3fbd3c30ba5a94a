"""A small synchronous Kafka client for the admin pages: it asks a gateway about its consumer groups
over Kafka's own protocol, as Kafka's AdminClient does (ApiVersions, ListGroups, DescribeGroups).

Group membership lives only in the memory of the gateway that coordinates each group; asking the
gateways is how the HTTP server sees it, without a second copy. Everything a conversation with one
gateway does — connecting included — runs under one deadline, so a gateway that is gone, frozen or
slow costs at most that long: ``GatewayUnreachable`` says which and why.

Versions: the highest each side knows, from the gateway's ApiVersions answer (an API it does not
advertise is ``GatewayUnreachable`` too, with the reason). Answers are plain frozen values; member
metadata and assignments stay bytes (``app.domain.consumer_protocol`` reads them).
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from app.errors import ErrorCode
from app.wire.kafka.messages import ApiKey, api_name
from app.wire.kafka.structs import decode_response, encode_request

CLIENT_ID = "txlog-admin"
MAX_ANSWER_BYTES = 64 * 1024 * 1024  # a larger size prefix is not an answer
# The versions this client reads: (lowest, highest). ListGroups v4 adds the state, v5 the type;
# DescribeGroups v6 adds an error message per group.
CLIENT_VERSIONS: Mapping[int, tuple[int, int]] = {
    ApiKey.ApiVersions: (0, 0),
    ApiKey.ListGroups: (0, 5),
    ApiKey.DescribeGroups: (0, 6),
    ApiKey.DeleteGroups: (0, 2),
}
_SIZE = struct.Struct(">i")


def error_name(code: int) -> str:
    """Kafka's name of an error code (``"error 999"`` for one txlog does not know)."""
    for error in ErrorCode:
        if error.kafka_code == code:
            return error.name
    return f"error {code}"


class GatewayUnreachable(Exception):
    """The gateway did not answer (refused, closed, timed out, an unreadable answer) or does not
    serve what was asked; ``reason`` says which, in words."""

    def __init__(self, address: str, reason: str) -> None:
        self.address = address
        self.reason = reason
        super().__init__(f"{address}: {reason}")


@dataclass(frozen=True)
class ListedGroup:
    group_id: str
    protocol_type: str
    state: str | None  # None before ListGroups v4


@dataclass(frozen=True)
class DescribedMember:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes  # the chosen protocol's member metadata (a consumer's subscription); only while Stable
    assignment: bytes  # the member's assignment from the leader; only while Stable


@dataclass(frozen=True)
class DescribedGroup:
    group_id: str
    error: str | None  # Kafka's error name, None when described
    error_message: str | None
    state: str
    protocol_type: str
    protocol: str  # the chosen protocol (an assignor's name, "range", "roundrobin", ...); only while Stable
    members: tuple[DescribedMember, ...]


class AdminConnection:
    """One connection to one gateway, every exchange within ``timeout_s`` of its opening."""

    def __init__(self, host: str, port: int, timeout_s: float, client_id: str = CLIENT_ID) -> None:
        self.address = f"{host}:{port}"
        self.client_id = client_id
        self._timeout_s = timeout_s
        self._deadline = time.monotonic() + timeout_s
        self._correlation_id = 0
        self._versions: dict[int, tuple[int, int]] | None = None
        try:
            self._sock = socket.create_connection((host, port), timeout=self._remaining())
        except TimeoutError:
            raise GatewayUnreachable(self.address, f"no connection within {timeout_s:g} s") from None
        except OSError as exc:
            raise GatewayUnreachable(self.address, f"cannot connect: {exc.strerror or exc}") from None
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> AdminConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- frames ------------------------------------------------------------------------------------

    def _remaining(self) -> float:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        return left

    def request(self, api_key: int, version: int, body: Mapping[str, Any]) -> Any:
        """Send one request and wait for its answer (kafka-python's response struct)."""
        self._correlation_id += 1
        frame = encode_request(api_key, version, body, self._correlation_id, self.client_id)
        name = api_name(api_key)
        try:
            self._sock.settimeout(self._remaining())
            self._sock.sendall(frame)
            size = _SIZE.unpack(self._read(_SIZE.size))[0]
            if not 0 < size <= MAX_ANSWER_BYTES:
                raise GatewayUnreachable(self.address, f"{name}: an answer of {size} bytes")
            answer = self._read(size)
        except TimeoutError:
            raise GatewayUnreachable(self.address, f"no answer to {name} within {self._timeout_s:g} s") from None
        except ConnectionError as exc:  # reset, broken pipe: as good as closed
            raise GatewayUnreachable(self.address, f"the gateway closed the connection ({exc.strerror or exc})") from None
        except OSError as exc:
            raise GatewayUnreachable(self.address, f"{name}: {exc.strerror or exc}") from None
        try:
            correlation_id, response = decode_response(api_key, version, answer)
        except Exception as exc:  # anything the generated decoder raises: the answer is unreadable
            raise GatewayUnreachable(self.address, f"{name}: an unreadable answer ({type(exc).__name__})") from None
        if correlation_id != self._correlation_id:
            raise GatewayUnreachable(
                self.address, f"{name}: answered correlation id {correlation_id}, not {self._correlation_id}"
            )
        return response

    def _read(self, n: int) -> bytes:
        chunks = bytearray()
        while len(chunks) < n:
            self._sock.settimeout(self._remaining())
            chunk = self._sock.recv(min(n - len(chunks), 1 << 20))
            if not chunk:
                raise GatewayUnreachable(self.address, "the gateway closed the connection")
            chunks += chunk
        return bytes(chunks)

    # -- APIs --------------------------------------------------------------------------------------

    def api_versions(self) -> dict[int, tuple[int, int]]:
        """The gateway's advertised ``{api_key: (min, max)}`` (asked once per connection)."""
        if self._versions is None:
            answer = self.request(ApiKey.ApiVersions, 0, {})
            if answer.error_code:
                raise GatewayUnreachable(self.address, f"ApiVersions: {error_name(answer.error_code)}")
            self._versions = {k.api_key: (k.min_version, k.max_version) for k in answer.api_keys}
        return self._versions

    def version_of(self, api_key: int) -> int:
        """The highest version of ``api_key`` both sides have."""
        ours = CLIENT_VERSIONS[api_key]
        theirs = self.api_versions().get(api_key)
        name = api_name(api_key)
        if theirs is None:
            raise GatewayUnreachable(self.address, f"the gateway does not serve {name}")
        version = min(ours[1], theirs[1])
        if version < max(ours[0], theirs[0]):
            raise GatewayUnreachable(self.address, f"no version of {name} in common (gateway {theirs[0]}–{theirs[1]})")
        return version

    def list_groups(self) -> list[ListedGroup]:
        version = self.version_of(ApiKey.ListGroups)
        answer = self.request(ApiKey.ListGroups, version, {})
        if answer.error_code:
            raise GatewayUnreachable(self.address, f"ListGroups: {error_name(answer.error_code)}")
        return [ListedGroup(g.group_id, g.protocol_type, g.group_state if version >= 4 else None) for g in answer.groups]

    def describe_groups(self, group_ids: Iterable[str]) -> list[DescribedGroup]:
        ids = list(group_ids)
        if not ids:
            return []
        version = self.version_of(ApiKey.DescribeGroups)
        answer = self.request(ApiKey.DescribeGroups, version, {"groups": ids})
        return [
            DescribedGroup(
                group_id=g.group_id,
                error=error_name(g.error_code) if g.error_code else None,
                error_message=(g.error_message or None) if version >= 6 else None,
                state=g.group_state,
                protocol_type=g.protocol_type,
                protocol=g.protocol_data,
                members=tuple(
                    DescribedMember(
                        m.member_id,
                        m.group_instance_id if version >= 4 else None,
                        m.client_id,
                        m.client_host,
                        bytes(m.member_metadata or b""),
                        bytes(m.member_assignment or b""),
                    )
                    for m in g.members
                ),
            )
            for g in answer.groups
        ]

    def delete_groups(self, group_ids: Iterable[str]) -> dict[str, str | None]:
        """DeleteGroups: each group's error name, None where it was deleted."""
        version = self.version_of(ApiKey.DeleteGroups)
        answer = self.request(ApiKey.DeleteGroups, version, {"groups_names": list(group_ids)})
        return {r.group_id: error_name(r.error_code) if r.error_code else None for r in answer.results}


def delete_groups_at(host: str, port: int, group_ids: Iterable[str], timeout_s: float) -> dict[str, str | None]:
    """DeleteGroups of ``group_ids`` at the gateway at ``host:port``, within ``timeout_s``."""
    with AdminConnection(host, port, timeout_s) as conn:
        return conn.delete_groups(group_ids)


def describe_all_groups(host: str, port: int, timeout_s: float) -> list[DescribedGroup]:
    """Every group the gateway at ``host:port`` coordinates, described: ListGroups, then one
    DescribeGroups of them all, within ``timeout_s`` in all."""
    with AdminConnection(host, port, timeout_s) as conn:
        return conn.describe_groups(g.group_id for g in conn.list_groups())


def describe_some_groups(host: str, port: int, group_ids: Iterable[str], timeout_s: float) -> list[DescribedGroup]:
    """DescribeGroups of ``group_ids`` at the gateway at ``host:port``, within ``timeout_s``."""
    with AdminConnection(host, port, timeout_s) as conn:
        return conn.describe_groups(group_ids)
