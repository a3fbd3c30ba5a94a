"""Pure parts of the admin pages: who may do what, signed sessions, durations, and the geometry of
the drawings."""

from __future__ import annotations

import pytest
from starlette.requests import Request

from api.admin import svg
from api.admin.auth import (
    CLUSTER,
    SESSION_COOKIE,
    Action,
    Principal,
    Resource,
    SessionSigner,
    TokenAuthorizer,
    is_loopback_connection,
)
from api.admin.deps import parse_duration_ms
from api.admin.fmt import duration, show_bytes
from app.domain.log import PartitionStatus
from app.domain.transactions import TxnEvent, TxnState
from app.errors import TxlogError
from app.services.inspect.rates import RatePoint, bucket_bounds
from app.services.inspect.transactions import epoch_history

ABORT = Action.ABORT_TRANSACTION
TID = Resource("transactional_id", "t")


def request(server: str, client: str, headers: dict[str, str] | None = None, cookie: str | None = None) -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    if cookie is not None:
        raw.append((b"cookie", f"{SESSION_COOKIE}={cookie}".encode()))
    return Request(
        {
            "type": "http",
            "method": "GET",
            "path": "/admin/",
            "headers": raw,
            "server": (server, 8080),
            "client": (client, 50123),
            "query_string": b"",
        }
    )


@pytest.mark.parametrize(
    "server, client, headers, local",
    [
        ("127.0.0.1", "127.0.0.1", None, True),
        ("::1", "::1", None, True),
        ("127.0.0.1", "127.0.0.5", None, True),  # all of 127/8 is loopback
        ("0.0.0.0", "127.0.0.1", None, False),
        ("192.0.2.10", "127.0.0.1", None, False),
        ("127.0.0.1", "192.0.2.7", None, False),
        ("127.0.0.1", "127.0.0.1", {"X-Forwarded-For": "203.0.113.9"}, False),
        ("127.0.0.1", "127.0.0.1", {"Forwarded": "for=203.0.113.9"}, False),
        ("127.0.0.1", "testclient", None, False),
    ],
)
def test_loopback_connection(server: str, client: str, headers: dict | None, local: bool) -> None:
    assert is_loopback_connection(request(server, client, headers)) is local


def test_without_token_everyone_views_and_only_local_operators_act() -> None:
    auth = TokenAuthorizer(None)
    assert not auth.sign_in_required
    remote = auth.principal_for(request("0.0.0.0", "192.0.2.7"))
    local = auth.principal_for(request("127.0.0.1", "127.0.0.1"))
    assert remote == Principal("anonymous", authenticated=False, local=False)
    assert auth.can(remote, Action.VIEW, CLUSTER) and not auth.can(remote, ABORT, TID)
    assert auth.can(local, Action.VIEW, CLUSTER) and auth.can(local, ABORT, TID)
    assert auth.authenticate("") is None and auth.authenticate("anything") is None
    assert auth.form_token(request("127.0.0.1", "127.0.0.1")) is None


def test_with_token_only_signed_in_principals_view_and_act() -> None:
    auth = TokenAuthorizer("s3cret")
    assert auth.sign_in_required
    assert auth.principal_for(request("127.0.0.1", "127.0.0.1")) is None  # loopback is no pass here
    assert not auth.can(None, Action.VIEW, CLUSTER)
    assert auth.authenticate("wrong") is None and auth.authenticate("s3cre") is None
    admin = auth.authenticate("s3cret")
    assert admin is not None and admin.authenticated
    cookie = auth.session_for(admin)
    signed_in = request("192.0.2.1", "192.0.2.7", cookie=cookie)
    principal = auth.principal_for(signed_in)
    assert principal is not None and principal.name == "admin"
    assert auth.can(principal, ABORT, TID)
    assert auth.form_token(signed_in) and auth.form_token(signed_in) == auth.form_token(signed_in)
    # Another token's sessions are not valid here: changing the token signs everyone out.
    assert TokenAuthorizer("other").principal_for(signed_in) is None


def test_sessions_are_signed_and_expire() -> None:
    signer = SessionSigner(b"k" * 32, ttl_s=60)
    cookie = signer.issue("admin", now_s=1000)
    session = signer.read(cookie, now_s=1059)
    assert session is not None and session.subject == "admin" and session.expires_at == 1060 and len(session.csrf) >= 24
    assert signer.read(cookie, now_s=1060) is None  # expired
    payload, signature = cookie.split(".")
    forged = signer.issue("admin", now_s=5000).split(".")[0]
    assert signer.read(f"{forged}.{signature}", now_s=1001) is None  # payload swapped
    flipped = signature[:-1] + ("A" if signature[-1] != "A" else "B")
    assert signer.read(f"{payload}.{flipped}", now_s=1001) is None
    assert SessionSigner(b"x" * 32).read(cookie, now_s=1001) is None  # another key
    for junk in ("", "abc", "a.b.c", "é.é", f"{payload}.", ".{signature}"):
        assert signer.read(junk, now_s=1001) is None


def test_parse_duration() -> None:
    assert parse_duration_ms("90s") == 90_000
    assert parse_duration_ms("5m") == 300_000
    assert parse_duration_ms(" 2h ") == 7_200_000
    assert parse_duration_ms("1d") == 86_400_000
    assert parse_duration_ms("250ms") == 250
    assert parse_duration_ms("30") == 30_000
    assert parse_duration_ms("") is None and parse_duration_ms(None) is None
    for bad in ("-5m", "5 minutes", "1e3", "m"):
        with pytest.raises(TxlogError):
            parse_duration_ms(bad)


def test_duration_and_bytes_display() -> None:
    assert [duration(v) for v in (0, 850, 4_200, 42_000, 192_000, 4 * 3_600_000 + 180_000, 3 * 86_400_000 + 3_600_000)] == [
        "0 ms",
        "850 ms",
        "4.2 s",
        "42 s",
        "3m 12s",
        "4h 03m",
        "3d 1h",
    ]
    assert duration(-2_000) == "-2.0 s" and duration(None) == "—"
    assert show_bytes(None).kind == "null"
    assert show_bytes(b"plain").kind == "text" and show_bytes(b"plain").preview == "plain"
    js = show_bytes(b'{"a":1}')
    assert js.kind == "json" and js.full == '{\n  "a": 1\n}'
    binary = show_bytes(b"\xff\x00\x01")
    assert binary.kind == "binary" and binary.full == "/wAB"
    long = show_bytes(b"x" * 500)
    assert long.truncated and len(long.preview) == 120 and long.full == "x" * 500


def test_partition_bar_segments() -> None:
    bar = svg.partition_bar(PartitionStatus("t", 0, 0, 64, 59), 100)
    assert [(s.cls, s.x, s.width) for s in bar.segments] == [("seg-stable", 0.0, 590.0), ("seg-unstable", 590.0, 50.0)]
    assert bar.lso_x == 590.0 and bar.hw_x == 640.0
    # A one-record gap in a million stays visible; the segments still end at the bar's end.
    huge = svg.partition_bar(PartitionStatus("t", 0, 10, 1_000_000, 999_999), 1_000_000)
    assert [s.cls for s in huge.segments] == ["seg-removed", "seg-stable", "seg-unstable"]
    assert all(s.width >= svg.MIN_VISIBLE for s in huge.segments)
    assert huge.hw_x == pytest.approx(svg.BAR_WIDTH)
    assert svg.partition_bar(PartitionStatus("t", 0, 0, 0, 0), 0).segments == []
    stable = svg.partition_bar(PartitionStatus("t", 0, 0, 100, 100), 100)
    assert stable.lso_x is None and [s.cls for s in stable.segments] == ["seg-stable"]


def test_rate_chart_scale_and_bars() -> None:
    assert [svg.nice_ceiling(v) for v in (0, 0.3, 1, 1.2, 2.2, 4, 7, 12, 260)] == [1, 1, 1, 2, 2.5, 5, 10, 20, 500]
    bounds = bucket_bounds(1_700_000_030_000)
    assert len(bounds) == 16 and bounds[-1] == 1_700_000_030_000 and bounds[-2] == 1_700_000_020_000 - 1_700_000_020_000 % 60_000
    points = [RatePoint(bounds[i], bounds[i + 1], n) for i, n in enumerate([0] * 13 + [120, 3])]
    chart = svg.rate_chart(points)
    assert chart.peak == pytest.approx(2.0) and chart.total == 123 and chart.grid[-1][1] == "2"
    assert chart.bars[0].height == 0 and chart.bars[13].height == pytest.approx(chart.plot_height)
    assert chart.bars[-1].partial and chart.bars[-1].height >= 1.5
    assert chart.xlabels[-1][1] == "now"


def ev(version: int, frm: TxnState | None, to: TxnState, epoch: int, at: int, **kw: object) -> TxnEvent:
    return TxnEvent("t", version, frm, to, 1000, epoch, 60_000, at, **kw)  # type: ignore[arg-type]


S = TxnState
HISTORY = [
    ev(1, None, S.EMPTY, 0, 0),
    ev(2, S.EMPTY, S.ONGOING, 0, 10, partitions_added=(("a", 0),)),
    ev(3, S.ONGOING, S.ONGOING, 0, 20, partitions_added=(("a", 1),), groups_added=("g",)),
    ev(4, S.ONGOING, S.PREPARE_ABORT, 0, 90_000, reason="aborted_by_operator"),
    ev(5, S.PREPARE_ABORT, S.COMPLETE_ABORT, 1, 90_005, reason="aborted_by_operator", result="abort"),
    ev(6, S.COMPLETE_ABORT, S.EMPTY, 2, 100_000, reason="newer_epoch"),
]


def test_timeline_merges_steps_within_a_state_and_marks_the_deadline() -> None:
    tl = svg.timeline(HISTORY, now_ms=160_000)
    assert [n.state for n in tl.nodes] == ["Empty", "Ongoing", "PrepareAbort", "CompleteAbort", "Empty"]
    assert tl.nodes[1].note == "+2 partitions, +1 group" and tl.nodes[2].note == "aborted by operator"
    assert [n.epoch for n in tl.nodes] == ["pid 1000 · e0", None, None, "pid 1000 · e1", "pid 1000 · e2"]
    assert [s.label for s in tl.spans] == ["10 ms", "1m 29s", "5 ms", "9.9 s", "1m 00s so far"]
    assert tl.spans[-1].current and tl.deadline_x is None and tl.hidden == 0
    ongoing = svg.timeline(HISTORY[:3], now_ms=70_010, deadline_ms=60_010)
    assert ongoing.deadline_label == "timed out 10 s ago"
    assert svg.timeline(HISTORY[:3], now_ms=30_010, deadline_ms=60_010).deadline_label == "times out in 30 s"
    short = svg.timeline(HISTORY, now_ms=160_000, max_steps=2)
    assert short.hidden == 3 and [n.state for n in short.nodes] == ["CompleteAbort", "Empty"]
    assert short.nodes[0].epoch == "pid 1000 · e1"  # compared with the hidden step before it


def test_epoch_history() -> None:
    spans = epoch_history(HISTORY)
    assert [(s.producer_epoch, s.since_ms, s.cause, s.reason) for s in spans] == [
        (0, 0, "InitProducerId (new id)", None),
        (1, 90_005, "after an abort", "aborted_by_operator"),
        (2, 100_000, "InitProducerId (fences older)", None),
    ]
