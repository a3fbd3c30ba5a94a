"""The Kafka groups pages and what they stand on: the consumer protocol's assignment and
subscription decoders (pure), the admin client against listeners that answer, freeze, refuse or
close, and the pages of a real ``txlog serve`` asking stand-in gateways registered in
``txlog.kafka_nodes`` — one answering with canned groups, one frozen, one gone. (Real gateways and
real consumer groups: tests/kafka/test_agree.py.)"""

from __future__ import annotations

import contextlib
import html as htmllib
import re
import socket
import struct
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.domain.consumer_protocol import Assignment, ConsumerProtocolError, Subscription, decode_assignment, decode_subscription
from app.errors import ErrorCode
from app.services import Broker, retention
from app.services.cluster import deregister_node, register_node
from app.services.kafka_groups import describe_kafka_groups
from app.wire.kafka.admin_client import AdminConnection, GatewayUnreachable, describe_all_groups, error_name
from app.wire.kafka.messages import ApiKey
from app.wire.kafka.requests import FrameError, decode_request
from app.wire.kafka.structs import encode_response
from tests.admin.conftest import ADMIN_TOKEN, sign_in
from tests.conftest import make_broker
from tests.support import ServerProcess, free_port

# -- the consumer protocol, encoded independently here ---------------------------------------------


def s16(text: str | None) -> bytes:
    if text is None:
        return struct.pack(">h", -1)
    data = text.encode()
    return struct.pack(">h", len(data)) + data


def b32(data: bytes | None) -> bytes:
    return struct.pack(">i", -1) if data is None else struct.pack(">i", len(data)) + data


def topic_partitions(tps: Any) -> bytes:
    out = struct.pack(">i", len(tps))
    for topic, parts in tps:
        out += s16(topic) + struct.pack(">i", len(parts)) + b"".join(struct.pack(">i", p) for p in parts)
    return out


def assignment_bytes(version: int, tps: Any, user_data: bytes | None = None) -> bytes:
    return struct.pack(">h", version) + topic_partitions(tps) + b32(user_data)


def subscription_bytes(
    version: int,
    topics: list[str],
    user_data: bytes | None = None,
    owned: Any = (),
    generation: int = -1,
    rack: str | None = None,
) -> bytes:
    out = struct.pack(">hi", version, len(topics)) + b"".join(s16(t) for t in topics) + b32(user_data)
    if version >= 1:
        out += topic_partitions(owned)
    if version >= 2:
        out += struct.pack(">i", generation)
    if version >= 3:
        out += s16(rack)
    return out


TOPICS = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=20)
TPS = st.lists(st.tuples(TOPICS, st.lists(st.integers(-(2**31), 2**31 - 1), max_size=8).map(tuple)), max_size=6).map(tuple)


@given(st.integers(0, 3), TPS, st.one_of(st.none(), st.binary(max_size=40)))
def test_an_assignment_reads_back_as_written(version: int, tps: Any, user_data: bytes | None) -> None:
    assert decode_assignment(assignment_bytes(version, tps, user_data)) == Assignment(version, tps, user_data)


@given(st.integers(0, 3), st.lists(TOPICS, max_size=5), TPS, st.integers(-1, 1000), st.one_of(st.none(), TOPICS))
def test_a_subscription_of_each_version_reads_back(
    version: int, topics: list[str], owned: Any, generation: int, rack: str | None
) -> None:
    got = decode_subscription(subscription_bytes(version, topics, b"ud", owned, generation, rack))
    assert got == Subscription(
        version,
        tuple(topics),
        b"ud",
        owned if version >= 1 else (),
        generation if version >= 2 else -1,
        rack if version >= 3 else None,
    )


def test_a_newer_version_reads_as_the_newest_known_and_trailing_bytes_are_ignored() -> None:
    data = subscription_bytes(3, ["t"], None, (("t", (0,)),), 7, "rack-a")
    assert decode_subscription(struct.pack(">h", 9) + data[2:] + b"\x00future") == Subscription(
        9, ("t",), None, (("t", (0,)),), 7, "rack-a"
    )
    assert decode_assignment(assignment_bytes(5, (("t", (1, 2)),)) + b"more").partitions == (("t", (1, 2)),)
    assert decode_assignment(assignment_bytes(0, ())).count == 0


def test_every_truncation_and_each_malformed_field_is_an_error() -> None:
    whole = assignment_bytes(1, (("orders", (0, 1)), ("payments", (2,))), b"x")
    for cut in range(len(whole)):
        with pytest.raises(ConsumerProtocolError, match=r"truncated|array"):
            decode_assignment(whole[:cut])
    bad = {
        "a negative version": struct.pack(">h", -1) + whole[2:],
        "an array count past the end": struct.pack(">hi", 0, 2**31 - 1),
        "a negative count": struct.pack(">hi", 0, -1),
        "a negative string length": struct.pack(">hih", 0, 1, -2) + bytes(8),
        "a topic that is not UTF-8": struct.pack(">hih", 0, 1, 2) + b"\xff\xfe" + struct.pack(">i", 0) + b32(None),
        "negative bytes length": assignment_bytes(0, ())[:-4] + struct.pack(">i", -5),
    }
    for what, data in bad.items():
        with pytest.raises(ConsumerProtocolError):
            decode_assignment(data)
            pytest.fail(what)
    with pytest.raises(ConsumerProtocolError):
        decode_subscription(struct.pack(">hi", 0, 1) + s16(None) + b32(None))  # a null topic name


# -- stand-in gateways ---------------------------------------------------------------------------------

GROUP_APIS = {ApiKey.ApiVersions: (0, 4), ApiKey.ListGroups: (0, 4), ApiKey.DescribeGroups: (0, 5)}


class StandIn:
    """A listener on a free port. ``answer``: a thread answers ApiVersions (``apis``), ListGroups
    and DescribeGroups (``groups``, DescribeGroups dicts); ``frozen``: connections are accepted
    by the kernel and never read, as a stopped process's are; ``closing``: each connection is
    closed at once."""

    def __init__(
        self, mode: str = "answer", groups: list[dict] | None = None, apis: dict[int, tuple[int, int]] = GROUP_APIS
    ) -> None:
        self.mode, self.groups, self.apis = mode, groups or [], apis
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=16)
        self.port = self.sock.getsockname()[1]
        self.requests: list[tuple[int, int]] = []
        if mode != "frozen":
            threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            if self.mode == "closing":
                conn.close()
            else:
                threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        # A client that gives up mid-request (the timeout tests) ends its connection quietly: this
        # daemon thread may outlive its test, and must not fail a later one.
        with conn, contextlib.suppress(OSError, FrameError):
            while True:
                prefix = conn.recv(4, socket.MSG_WAITALL)
                if len(prefix) < 4:
                    return
                frame = conn.recv(struct.unpack(">i", prefix)[0], socket.MSG_WAITALL)
                if len(frame) < struct.unpack(">i", prefix)[0]:
                    return
                request = decode_request(frame)
                header, body = request.header, request.body
                self.requests.append((header.api_key, header.api_version))
                if header.api_key == ApiKey.ApiVersions:
                    answer = {
                        "api_keys": [{"api_key": k, "min_version": lo, "max_version": hi} for k, (lo, hi) in self.apis.items()]
                    }
                elif header.api_key == ApiKey.ListGroups:
                    listed = [{k: g[k] for k in ("group_id", "protocol_type", "group_state")} for g in self.groups]
                    answer = {"groups": listed}
                else:
                    known = {g["group_id"]: g for g in self.groups}
                    not_here = {"error_code": ErrorCode.NOT_COORDINATOR.kafka_code}
                    answer = {"groups": [known.get(gid, {"group_id": gid, **not_here}) for gid in body.groups]}
                conn.sendall(encode_response(header, answer))

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def stand_ins() -> Iterator[Any]:
    made: list[StandIn] = []

    def make(*args: Any, **kwargs: Any) -> StandIn:
        made.append(StandIn(*args, **kwargs))
        return made[-1]

    yield make
    for s in made:
        s.close()


def member(member_id: str, client_id: str, host: str, topics: list[str], tps: Any) -> dict:
    return {
        "member_id": member_id,
        "client_id": client_id,
        "client_host": host,
        "member_metadata": subscription_bytes(1, topics),
        "member_assignment": assignment_bytes(0, tps),
    }


def test_the_client_asks_at_the_highest_common_versions(stand_ins: Any) -> None:
    group = {
        "group_id": "g",
        "group_state": "Stable",
        "protocol_type": "consumer",
        "protocol_data": "range",
        "members": [member("m-1", "c-1", "/127.0.0.1", ["t"], (("t", (0,)),))],
    }
    gw = stand_ins(groups=[group])
    described = describe_all_groups("127.0.0.1", gw.port, 2)
    assert gw.requests == [(ApiKey.ApiVersions, 0), (ApiKey.ListGroups, 4), (ApiKey.DescribeGroups, 5)]
    (g,) = described
    assert (g.group_id, g.error, g.state, g.protocol_type, g.protocol) == ("g", None, "Stable", "consumer", "range")
    assert [(m.member_id, m.client_id, m.client_host) for m in g.members] == [("m-1", "c-1", "/127.0.0.1")]
    assert decode_assignment(g.members[0].assignment).partitions == (("t", (0,)),)
    old = stand_ins(groups=[group], apis={ApiKey.ApiVersions: (0, 2), ApiKey.ListGroups: (0, 2), ApiKey.DescribeGroups: (0, 3)})
    assert describe_all_groups("127.0.0.1", old.port, 2)[0].members[0].client_id == "c-1"
    assert old.requests[1:] == [(ApiKey.ListGroups, 2), (ApiKey.DescribeGroups, 3)]
    assert error_name(16) == "NOT_COORDINATOR" and error_name(12345) == "error 12345"


@pytest.mark.parametrize(
    "mode, apis, reason",
    [
        ("frozen", GROUP_APIS, r"no answer to ApiVersions within 0\.5 s"),
        ("closing", GROUP_APIS, "closed the connection"),
        ("answer", {ApiKey.ApiVersions: (0, 4)}, "does not serve ListGroups"),
        ("answer", {**GROUP_APIS, ApiKey.ListGroups: (7, 9)}, "no version of ListGroups in common"),
    ],
)
def test_a_gateway_that_does_not_answer_is_unreachable_within_the_timeout(
    stand_ins: Any, mode: str, apis: Any, reason: str
) -> None:
    gw = stand_ins(mode, apis=apis)
    started = time.monotonic()
    with pytest.raises(GatewayUnreachable, match=reason):
        describe_all_groups("127.0.0.1", gw.port, 0.5)
    assert time.monotonic() - started < 1.5


def test_a_gone_gateway_is_refused_at_once() -> None:
    started = time.monotonic()
    with pytest.raises(GatewayUnreachable, match="cannot connect"):
        AdminConnection("127.0.0.1", free_port(), 5)
    assert time.monotonic() - started < 1


# -- the pages ---------------------------------------------------------------------------------------


def text(html: str) -> str:
    """The page's text, tags removed, whitespace collapsed and none left before punctuation."""
    return re.sub(r" ([,;:])", r"\1", re.sub(r"\s+", " ", htmllib.unescape(re.sub(r"<[^>]+>", " ", html))))


@pytest.fixture(scope="module")
def store(admin_db: str) -> Iterator[Broker]:
    b = make_broker(admin_db)
    yield b
    b.db.dispose()


@pytest.fixture
def signed_in(token_server: ServerProcess) -> Iterator[httpx.Client]:
    with token_server.client() as client:
        assert sign_in(client).status_code == 303
        yield client


@pytest.fixture
def register(store: Broker) -> Iterator[Any]:
    """Register stand-ins as live gateway nodes; each deregistered after the test."""
    held = []

    def add(node_id: int, port: int) -> None:
        held.append(register_node(store, node_id, "127.0.0.1", port, 60_000))

    yield add
    for reg in held:
        deregister_node(store, reg)


def test_without_a_registered_gateway_the_page_says_so(signed_in: httpx.Client) -> None:
    r = signed_in.get("/admin/kafka-groups")
    assert r.status_code == 200, r.text
    assert "No live Kafka gateway is registered" in text(r.text)
    assert 'href="/admin/kafka-groups"' in signed_in.get("/admin/groups").text  # linked from the groups page


@pytest.fixture
def scene(signed_in: httpx.Client, stand_ins: Any, register: Any) -> tuple[str, str]:
    """A topic of three partitions (10, 4 and 6 records) and three registered nodes: node 1 answers
    with a Stable group of three members (one assignment unreadable) and a rebalancing group, node 2
    is frozen, node 3 is gone. The Stable group committed partition 0 at 7 (lag 3) and partition 2
    at 6 (lag 0), never partition 1. Its topic and group id."""
    topic, group = f"kg-{uuid.uuid4().hex[:8]}", f"kg-app-{uuid.uuid4().hex[:6]}"
    assert signed_in.post("/v1/topics", json={"name": topic, "partitions": 3}).status_code == 201
    for partition, n in ((0, 10), (1, 4), (2, 6)):
        r = signed_in.post(
            f"/v1/topics/{topic}/partitions/{partition}/records", json={"records": [{"value": str(i)} for i in range(n)]}
        )
        assert r.status_code == 200, r.text
    offsets = {"offsets": [{"topic": topic, "partition": 0, "offset": 7}, {"topic": topic, "partition": 2, "offset": 6}]}
    assert signed_in.post(f"/v1/groups/{group}/offsets", json=offsets).status_code == 200
    stable = {
        "group_id": group,
        "group_state": "Stable",
        "protocol_type": "consumer",
        "protocol_data": "range",
        "members": [
            member("c-one-4f1e", "c-one", "/10.1.2.3", [topic], ((topic, (0, 1)),)),
            member("c-two-9a0b", "c-two", "/10.1.2.4", [topic], ((topic, (2,)),)),
            {
                "member_id": "odd-1",
                "client_id": "odd",
                "client_host": "/10.1.2.5",
                "member_metadata": b"",
                "member_assignment": b"\x00\x00\x7f",
            },
        ],
    }
    rebalancing = {
        "group_id": "kg-other",
        "group_state": "PreparingRebalance",
        "protocol_type": "consumer",
        "protocol_data": "",
        "members": [{"member_id": "m", "client_id": "late", "client_host": "/10.9.9.9"}],
    }
    register(1, stand_ins(groups=[stable, rebalancing]).port)
    register(2, stand_ins("frozen").port)
    register(3, free_port())  # registered, but no process listens any more
    return topic, group


def test_groups_members_assignments_offsets_and_lag_and_unreachable_nodes(
    signed_in: httpx.Client, store: Broker, scene: tuple[str, str]
) -> None:
    topic, group = scene
    started = time.monotonic()
    listing = signed_in.get("/admin/kafka-groups")
    elapsed = time.monotonic() - started
    assert listing.status_code == 200, listing.text
    assert elapsed < 5  # the frozen node costs its timeout (2 s), not the page
    page = text(listing.text)
    assert "Node 2 (127.0.0.1:" in page and "is unreachable: no answer to ApiVersions within 2 s" in page
    assert re.search(r"Node 3 \(127\.0\.0\.1:\d+\) is unreachable: cannot connect: Connection refused", page)
    assert f"{group} Stable consumer · range 1 c-one, c-two, odd 3 3" in page
    assert "kg-other PreparingRebalance consumer 1 late 0 0" in page

    detail = signed_in.get(f"/admin/kafka-groups/{group}")
    assert detail.status_code == 200, detail.text
    page = text(detail.text)
    assert "State Stable" in page and "Protocol range" in page and "Coordinator node 1" in page and "Lag (to LSO) 3" in page
    assert f"c-one /10.1.2.3 c-one-4f1e {topic} {topic}: 0, 1 3" in page
    assert f"c-two /10.1.2.4 c-two-9a0b {topic} {topic}: 2 0" in page
    assert "odd /10.1.2.5 odd-1 unreadable, 3 bytes" in page
    assert f"{topic}-0 c-one /10.1.2.3 7 10 10 3" in page
    assert f"{topic}-1 c-one /10.1.2.3 — 4 4 nothing committed" in page
    assert f"{topic}-2 c-two /10.1.2.4 6 6 6 0" in page
    assert f'href="/admin/topics/{topic}/0?offset=7"' in detail.text

    view = describe_kafka_groups(store, "kg-missing", timeout_s=0.5)
    assert view.groups == [] and [g.node_id for g in view.unreachable] == [2, 3]
    missing = text(signed_in.get("/admin/kafka-groups/kg-missing").text)
    assert "No gateway that answered coordinates group kg-missing" in missing


def test_the_pages_in_a_browser(
    token_server: ServerProcess, scene: tuple[str, str], signed_in: httpx.Client, store: Broker, tmp_path: Path
) -> None:
    """In headless Chromium without JavaScript: from the navigation to a group and on to a
    partition and its topic, whose page shows each partition's log size as DescribeLogDirs answers
    it (``retention.log_sizes``), after records were deleted from one; no console error (the pages
    keep to the content security policy)."""
    from playwright.sync_api import sync_playwright

    from tests.e2e.test_admin_browser import CHROMIUM, CHROMIUM_ARGS, Problems

    topic, group = scene
    r = signed_in.post(f"/v1/topics/{topic}/partitions/0/delete-records", json={"before_offset": 3})
    assert r.status_code == 200, r.text
    # one-byte values: partition 0 keeps 7 of its 10 records, the others all theirs
    assert [(s.partition, s.size_bytes) for s in retention.log_sizes(store, [topic])] == [(0, 7), (1, 4), (2, 6)]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_context(
                base_url=token_server.url, java_script_enabled=False, viewport={"width": 1400, "height": 900}
            ).new_page()
            problems = Problems(page)
            page.goto("/admin/sign-in?next=/admin/groups")
            page.fill("input[name=token]", ADMIN_TOKEN)
            page.click("button[type=submit]")
            page.get_by_role("link", name="Kafka groups", exact=True).first.click()
            assert page.url == token_server.url + "/admin/kafka-groups"
            assert page.locator("nav a.active").inner_text() == "Kafka groups"
            assert page.locator(".notice.unreachable").count() == 2
            assert page.locator("table.kafka-groups .badge").all_inner_texts() == ["Stable", "PreparingRebalance"]
            page.screenshot(path=str(tmp_path / "kafka-groups.png"), full_page=True)
            page.get_by_role("link", name=group).click()
            assert page.locator("table.members td.client-id").all_inner_texts() == ["c-one", "c-two", "odd"]
            assert page.locator("table.members td.assigned").first.inner_text() == f"{topic}: 0, 1"
            page.screenshot(path=str(tmp_path / "kafka-group.png"), full_page=True)
            page.get_by_role("link", name=f"{topic}-0").click()
            assert page.url == f"{token_server.url}/admin/topics/{topic}/0?offset=7"
            page.locator(".crumbs").get_by_role("link", name=topic).click()
            assert page.url == f"{token_server.url}/admin/topics/{topic}"
            assert page.locator("table.data td.log-size").all_inner_texts() == ["7 B", "4 B", "6 B"]
            assert page.locator("table.data th", has_text="Log size").count() == 1
            assert problems.seen == []
        finally:
            browser.close()
