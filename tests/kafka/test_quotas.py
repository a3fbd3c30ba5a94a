"""Client quotas on the wire: DescribeClientQuotas and AlterClientQuotas over raw frames (no
installed client has them: confluent-kafka 2.x, kafka-python and aiokafka lack both), and their
enforcement: a Produce over its producer_byte_rate is answered with throttle_time_ms and its
connection muted that long, one budget is shared by every gateway on the database, and a noisy
producer with a quota does not starve a quiet one without."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder

from app.services import topics
from app.wire.kafka.messages import ApiKey
from tests.conftest import fresh_database, make_broker
from tests.kafka.conftest import GatewayProcess, RawConnection
from tests.support import wait_until

EXACT, DEFAULT, ANY = 0, 1, 2


def alter(
    raw: RawConnection,
    entries: list[tuple[list[tuple[str, str | None]], list[tuple[str, float, bool]]]],
    validate_only: bool = False,
    version: int = 1,
) -> list[tuple[int, str | None]]:
    body = {
        "entries": [
            {
                "entity": [{"entity_type": t, "entity_name": n} for t, n in entity],
                "ops": [{"key": k, "value": v, "remove": r} for k, v, r in ops],
            }
            for entity, ops in entries
        ],
        "validate_only": validate_only,
    }
    got = raw.request(ApiKey.AlterClientQuotas, version, body)
    return [(e.error_code, e.error_message) for e in got.entries]


def describe(raw: RawConnection, components: list[tuple[str, int, str | None]], strict: bool = False, version: int = 1) -> Any:
    body = {"components": [{"entity_type": t, "match_type": m, "match": v} for t, m, v in components], "strict": strict}
    return raw.request(ApiKey.DescribeClientQuotas, version, body)


def entries_of(answer: Any) -> dict[tuple[tuple[str, str | None], ...], dict[str, float]]:
    return {
        tuple((e.entity_type, e.entity_name) for e in entry.entity): {v.key: v.value for v in entry.values}
        for entry in answer.entries
    }


@pytest.mark.parametrize("version", [0, 1])
def test_alter_then_describe_client_quotas(gateway: GatewayProcess, version: int) -> None:
    app = f"app-{uuid.uuid4().hex[:8]}"
    user = f"u-{uuid.uuid4().hex[:8]}"
    with gateway.connect() as raw:
        assert alter(
            raw,
            [
                ([("client-id", app)], [("producer_byte_rate", 1048576.0, False), ("consumer_byte_rate", 2097152.0, False)]),
                ([("user", user), ("client-id", None)], [("request_percentage", 12.5, False)]),
            ],
            version=version,
        ) == [(0, None), (0, None)]
        got = describe(raw, [("client-id", EXACT, app)], version=version)
        assert got.error_code == 0
        assert entries_of(got) == {(("client-id", app),): {"producer_byte_rate": 1048576.0, "consumer_byte_rate": 2097152.0}}
        # ANY matches named and default entities of the type; DEFAULT only the default; strict excludes other types
        got = describe(raw, [("user", EXACT, user), ("client-id", ANY, None)], version=version)
        assert entries_of(got) == {(("client-id", None), ("user", user)): {"request_percentage": 12.5}}
        got = describe(raw, [("user", EXACT, user), ("client-id", DEFAULT, None)], strict=True, version=version)
        assert len(got.entries) == 1
        assert describe(raw, [("user", EXACT, user)], strict=True, version=version).entries == []
        # validate_only changes nothing; removing a key
        assert alter(raw, [([("client-id", app)], [("producer_byte_rate", 5.0, False)])], validate_only=True) == [(0, None)]
        assert alter(raw, [([("client-id", app)], [("consumer_byte_rate", 0.0, True)])]) == [(0, None)]
        got = describe(raw, [("client-id", EXACT, app)])
        assert entries_of(got) == {(("client-id", app),): {"producer_byte_rate": 1048576.0}}
        assert alter(
            raw,
            [
                ([("client-id", app)], [("producer_byte_rate", 0.0, True)]),
                ([("user", user), ("client-id", None)], [("request_percentage", 0.0, True)]),
            ],
        ) == [(0, None), (0, None)]
        assert describe(raw, [("client-id", EXACT, app)]).entries == []


def test_kafkas_errors_for_entries_and_filters(gateway: GatewayProcess) -> None:
    app = f"app-{uuid.uuid4().hex[:8]}"
    with gateway.connect() as raw:
        got = alter(
            raw,
            [
                ([("client-id", app)], [("producer_byte_rate", 10.5, False)]),
                ([("client-id", app)], [("leader_replication_throttled_rate", 1.0, False)]),
                ([("user", app), ("user", "b")], [("producer_byte_rate", 1.0, False)]),
                ([("ip", "127.0.0.1")], [("connection_creation_rate", 10.0, False)]),
                ([], [("producer_byte_rate", 1.0, False)]),
                ([("client-id", app)], [("consumer_byte_rate", 1024.0, False)]),
            ],
        )
        assert got[:5] == [
            (42, "producer_byte_rate cannot be a fractional value."),
            (42, "Invalid configuration key leader_replication_throttled_rate"),
            (42, "Invalid client quota entity, duplicate entity entry user"),
            (42, "Quotas on ip entities (connection_creation_rate) are not supported"),
            (42, "Invalid empty client quota entity"),
        ]
        assert got[5] == (0, None)  # the valid entry is applied, the others change nothing
        assert entries_of(describe(raw, [("client-id", EXACT, app)])) == {(("client-id", app),): {"consumer_byte_rate": 1024.0}}
        bad = describe(raw, [("client-id", EXACT, app), ("client-id", ANY, None)])
        assert (bad.error_code, bad.error_message, bad.entries) == (
            42,
            "Entity type client-id cannot appear more than once in the filter.",
            None,
        )
        bad = describe(raw, [("group", EXACT, "g")])
        assert (bad.error_code, bad.error_message) == (35, "Unsupported entity type group")
        alter(raw, [([("client-id", app)], [("consumer_byte_rate", 0.0, True)])])


# --- enforcement ----------------------------------------------------------------------------------------

WINDOW = {"TXLOG_QUOTA_WINDOW_NUM": "5", "TXLOG_QUOTA_WINDOW_SIZE_SECONDS": "1"}


@pytest.fixture
def cluster(pg_admin_url: str, template_db: str, tmp_path: Path) -> Iterator[Callable[..., tuple[str, list[GatewayProcess]]]]:
    """Gateways sharing one fresh database, quota.window.num=5 (a burst allowance of four windows, which the tests measure after)."""
    stack = contextlib.ExitStack()

    def start(n: int, *quotas: tuple[list[tuple[str, str | None]], str, float]) -> tuple[str, list[GatewayProcess]]:
        """``n`` gateways, started once ``quotas`` are set."""
        url = stack.enter_context(fresh_database(pg_admin_url, template_db))
        for parts, key, value in quotas:
            set_quota(url, parts, key, value)
        gateways = []
        for node_id in range(n):
            g = GatewayProcess(url, env=WINDOW, log_path=tmp_path / f"gateway-{node_id}.log", node_id=node_id)
            stack.callback(g.stop)
            gateways.append(g.start())
        return url, gateways

    with stack:
        yield start


def batch(size: int, records: int = 10) -> bytes:
    b = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 24)
    for i in range(records):
        b.append(i, None, None, b"x" * (size // records), [])
    return bytes(b.build())


def produce(raw: RawConnection, topic: str, data: bytes, partition: int = 0) -> Any:
    body = {
        "acks": 1,
        "timeout_ms": 10_000,
        "topic_data": [{"name": topic, "partition_data": [{"index": partition, "records": data}]}],
    }
    got = raw.request(ApiKey.Produce, 9, body)
    assert got.responses[0].partition_responses[0].error_code == 0
    return got


def set_quota(url: str, parts: list[tuple[str, str | None]], key: str, value: float) -> None:
    from app.services import quotas

    b = make_broker(url)
    try:
        assert quotas.alter_quotas(b.db, [quotas.QuotaAlteration(parts, [quotas.QuotaOp(key, value)])]) == [None]
    finally:
        b.db.dispose()


def new_topic(url: str, partitions: int = 1) -> str:
    name = f"q-{uuid.uuid4().hex[:10]}"
    b = make_broker(url)
    try:
        topics.create_topic(b, name, partitions)
    finally:
        b.db.dispose()
    return name


def test_a_produce_over_its_quota_is_answered_with_throttle_time_and_the_connection_muted(cluster) -> None:  # type: ignore[no-untyped-def]
    url, (g,) = cluster(1)
    topic = new_topic(url)
    set_quota(url, [("client-id", "raw-test")], "producer_byte_rate", 20_000)
    data = batch(100_000)
    with g.connect(timeout=30) as raw:
        # the quota reaches the gateway within its poll; past the burst allowance (4 windows of
        # 20 kB), 100 kB more cost seconds
        first = wait_until(lambda: produce(raw, topic, data).throttle_time_ms or None, 10, 0.05, "a throttled Produce")
        assert 0 < first <= 60_000
        started = time.monotonic()
        produce(raw, topic, batch(100))
        muted_s = time.monotonic() - started
    print(f"throttle_time_ms={first}, next request answered after {muted_s * 1000:.0f} ms")
    assert muted_s >= first / 1000 * 0.9
    # another client id has no quota: never throttled
    with g.connect() as other:
        other.send(
            ApiKey.Produce,
            9,
            {"acks": 1, "timeout_ms": 1000, "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": data}]}]},
            client_id="free",
        )
        frame = other.read_frame()
        assert frame is not None


def _produce_for(g: GatewayProcess, topic: str, client_id: str, data: bytes, until: float, sent: list[tuple[float, int]]) -> None:
    """Produce ``data`` one request at a time until ``until`` (monotonic): each answer's time and size."""
    with g.connect(timeout=60) as raw:
        while time.monotonic() < until:
            body = {
                "acks": 1,
                "timeout_ms": 10_000,
                "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": data}]}],
            }
            raw.send(ApiKey.Produce, 9, body, client_id=client_id)
            assert raw.read_frame() is not None
            sent.append((time.monotonic(), len(data)))


def test_one_budget_across_two_gateways(cluster) -> None:  # type: ignore[no-untyped-def]
    """Two producers sharing a client id, each on its own gateway, are held near the quota in total:
    each gateway alone would let each producer have all of it."""
    quota = 50_000
    url, gateways = cluster(2, ([("client-id", "shared")], "producer_byte_rate", quota))
    topic = new_topic(url)
    data = batch(10_000)
    # quota.window.num=5: the burst allowance (four windows of the quota) is spent in the first
    # second; the rate is measured after it, while its window is still counted
    started = time.monotonic()
    steady, until = started + 3.0, started + 9.0
    sent: list[list[tuple[float, int]]] = [[], []]
    threads = [
        threading.Thread(target=_produce_for, args=(g, topic, "shared", data, until, out)) for g, out in zip(gateways, sent)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    each = [sum(n for at, n in out if at >= steady) for out in sent]
    rate = sum(each) / (until - steady)
    first = sum(n for out in sent for at, n in out if at < steady)
    print(
        f"quota {quota} B/s: {first} B in the first 3 s (the burst allowance), then {each[0]} B through gateway 0 "
        f"and {each[1]} B through gateway 1 in 6 s: {rate:.0f} B/s in total"
    )
    assert each[0] and each[1]
    # a quota per gateway would let each producer have all of it: twice the quota in total
    assert quota * 0.5 < rate < quota * 1.4


def test_a_noisy_producer_with_a_quota_does_not_starve_a_quiet_one(cluster) -> None:  # type: ignore[no-untyped-def]
    from confluent_kafka import Producer

    url, (g,) = cluster(1, ([("client-id", "noisy")], "producer_byte_rate", 100_000))
    topic = new_topic(url, partitions=2)

    def quiet_rate(seconds: float) -> float:
        """Records a second a quiet producer (no quota) gets acknowledged, one at a time."""
        done = 0
        with g.connect(timeout=30) as raw:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                body = {
                    "acks": 1,
                    "timeout_ms": 10_000,
                    "topic_data": [{"name": topic, "partition_data": [{"index": 1, "records": batch(100, 1)}]}],
                }
                raw.send(ApiKey.Produce, 9, body, client_id="quiet")
                assert raw.read_frame() is not None
                done += 1
        return done / seconds

    def beside(client_id: str, throttled: threading.Event | None) -> float:
        """The quiet producer's rate while a producer with ``client_id`` sends 10 kB records as
        fast as it is let; with ``throttled``, measured once that one was throttled."""
        running = threading.Event()
        stop = threading.Event()

        def noisy() -> None:
            p = Producer(
                {
                    "bootstrap.servers": g.bootstrap,
                    "client.id": client_id,
                    "linger.ms": 5,
                    "acks": 1,
                    "queue.buffering.max.kbytes": 2048,
                    "throttle_cb": lambda event: throttled is not None and event.throttle_time > 0 and throttled.set(),
                    "on_delivery": lambda err, msg: running.set(),
                }
            )
            value = b"n" * 10_000
            while not stop.is_set():
                try:
                    p.produce(topic, value, partition=0)
                except BufferError:  # the queue is full: wait for deliveries
                    p.poll(0.05)
            p.purge()
            p.flush(10)

        t = threading.Thread(target=noisy)
        t.start()
        try:
            assert running.wait(60), "the noisy producer delivered nothing"
            if throttled is not None:
                assert throttled.wait(60), "the noisy producer was never throttled"
            return quiet_rate(4.0)
        finally:
            stop.set()
            t.join(30)

    quiet_rate(1.0)  # the first appends warm the topic up
    alone = quiet_rate(4.0)
    with_quota = beside("noisy", threading.Event())
    without_quota = beside("loud", None)
    ratio = with_quota / alone
    print(
        f"quiet producer: {alone:.0f} records/s alone, {with_quota:.0f} beside the noisy one throttled "
        f"({ratio:.2f} of alone), {without_quota:.0f} beside a noisy one without a quota ({without_quota / alone:.2f})"
    )
    assert ratio > 0.5


# --- signed-in users ---------------------------------------------------------------------------------

ADMIN_TOKEN = "admin-" + uuid.uuid4().hex


def _signed_in(g: GatewayProcess, user: str, token: str) -> RawConnection:
    conn = g.connect(timeout=30)
    assert conn.request(ApiKey.SaslHandshake, 1, {"mechanism": "PLAIN"}).error_code == 0
    auth = conn.request(ApiKey.SaslAuthenticate, 2, {"auth_bytes": b"\x00" + user.encode() + b"\x00" + token.encode()})
    assert auth.error_code == 0, auth.error_message
    return conn


def test_user_quotas_and_who_may_see_and_change_them(pg_admin_url: str, template_db: str, tmp_path: Path) -> None:
    """With TXLOG_AUTH=token the quota's user is the signed-in principal: bob's quota throttles bob,
    not carol on the same client id; quotas are read with DescribeConfigs and changed with
    AlterConfigs on the cluster, which carol lacks."""
    from app.domain.acl_bindings import AclBinding, Operation, PatternType, PermissionType, ResourceType
    from app.services import security

    with fresh_database(pg_admin_url, template_db) as url:
        b = make_broker(url)
        try:
            bob = security.create_principal(b.db, "bob").token
            carol = security.create_principal(b.db, "carol").token
            for name in ("bob", "carol"):
                security.add_acls(
                    b.db, [AclBinding(name, ResourceType.TOPIC, "*", PatternType.LITERAL, Operation.ALL, PermissionType.ALLOW)]
                )
        finally:
            b.db.dispose()
        set_quota(url, [("user", "bob")], "producer_byte_rate", 20_000)
        topic = new_topic(url)
        env = {"TXLOG_AUTH": "token", "TXLOG_ADMIN_TOKEN": ADMIN_TOKEN, **WINDOW}
        with GatewayProcess(url, env=env, log_path=tmp_path / "gateway.log") as g:
            with _signed_in(g, "carol", carol) as raw:
                refused = describe(raw, [])
                assert refused.error_code == 31  # CLUSTER_AUTHORIZATION_FAILED
                assert alter(raw, [([("user", "carol")], [("producer_byte_rate", 1.0, False)])])[0][0] == 31
                data = batch(100_000)
                for _ in range(10):  # 1 MB, far past bob's quota: carol has none
                    assert produce(raw, topic, data).throttle_time_ms == 0
            with _signed_in(g, "bob", bob) as raw:
                first = wait_until(lambda: produce(raw, topic, data).throttle_time_ms or None, 10, 0.0, "bob throttled")
                assert first > 0
            with _signed_in(g, "admin", ADMIN_TOKEN) as raw:
                assert entries_of(describe(raw, [("user", ANY, None)])) == {(("user", "bob"),): {"producer_byte_rate": 20_000.0}}


def test_a_fetch_over_its_quota_is_answered_without_records(cluster) -> None:  # type: ignore[no-untyped-def]
    """consumer_byte_rate: a Fetch takes at most quota × (quota.window.num − 1) windows' bytes, and
    one over the quota is answered with no records and its throttle time, as Kafka answers it."""
    url, (g,) = cluster(1, ([("client-id", "raw-test")], "consumer_byte_rate", 10_000))
    topic = new_topic(url)
    with g.connect(timeout=30) as raw:
        for _ in range(20):
            raw.send(
                ApiKey.Produce,
                9,
                {
                    "acks": 1,
                    "timeout_ms": 10_000,
                    "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": batch(10_000)}]}],
                },
                client_id="producer",
            )
            assert raw.read_frame() is not None
        fetched: list[tuple[int, int]] = []  # (throttle_time_ms, bytes of records)
        offset = 0
        while not fetched or fetched[-1][0] == 0:
            got = raw.request(
                ApiKey.Fetch,
                11,
                {
                    "replica_id": -1,
                    "max_wait_ms": 0,
                    "min_bytes": 1,
                    "max_bytes": 1 << 20,
                    "isolation_level": 0,
                    "session_id": 0,
                    "session_epoch": -1,
                    "rack_id": "",
                    "forgotten_topics_data": [],
                    "topics": [
                        {
                            "topic": topic,
                            "partitions": [
                                {
                                    "partition": 0,
                                    "current_leader_epoch": -1,
                                    "fetch_offset": offset,
                                    "log_start_offset": -1,
                                    "partition_max_bytes": 1 << 20,
                                }
                            ],
                        }
                    ],
                },
            )
            size = sum(len(p.records or b"") for t in got.responses for p in t.partitions)
            fetched.append((got.throttle_time_ms, size))
            offset += 10 * (size // 10_000)  # 10 records a batch
            assert len(fetched) < 50
    print(f"fetches (throttle_time_ms, bytes): {fetched}")
    # 4 windows × 10 kB at most per Fetch (and one batch at least), before the throttled one
    assert all(size <= 40_000 + 10_200 for _, size in fetched[:-1])
    assert fetched[-1][0] > 0 and fetched[-1][1] == 0
