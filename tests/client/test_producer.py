"""The client's Producer against a real ``txlog serve``: configuration checked as Kafka checks it,
idempotent batches in order with their offsets, murmur2 partitioning, exact bytes and headers,
transactions (commit, abort, a new epoch each), fencing as a fatal error that names its reason, a
failed batch as an abortable one."""

from __future__ import annotations

import threading
import uuid

import httpx
import pytest

from app.domain.partitioner import partition_for_key
from tests.client.logs import create_topic, group_offsets, read_partition, read_topic
from tests.client.proxy import LossyProxy
from tests.support import wait_until
from txlog import KafkaError, KafkaException, Producer, TopicPartition


def _tid() -> str:
    return f"tid-{uuid.uuid4().hex[:10]}"


class Reports:
    """Delivery reports as confluent-kafka hands them: ``on_delivery(err, msg)``."""

    def __init__(self) -> None:
        self.items: list[tuple[KafkaError | None, object]] = []

    def __call__(self, err, msg) -> None:  # type: ignore[no-untyped-def]
        self.items.append((err, msg))

    @property
    def errors(self) -> list[KafkaError]:
        return [e for e, _ in self.items if e is not None]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"transactional.id": "t", "enable.idempotence": False}, "`transactional.id` requires `enable.idempotence=true`"),
        ({"enable.idempotence": True, "acks": 1}, "`acks` must be set to `all` when `enable.idempotence` is true"),
        ({"enable.idempotence": "true", "retries": 0}, "`retries` must be set >= 1 when `enable.idempotence` is true"),
        ({"enable.idempotence": True, "max.in.flight": 6}, "`max.in.flight` must be set <= 5 when `enable.idempotence` is true"),
        ({"no.such.property": 1}, 'No such configuration property: "no.such.property"'),
        ({"linger.ms": "soon"}, 'Invalid value "soon" for configuration property "linger.ms"'),
    ],
)
def test_configuration_is_refused_with_kafkas_messages(config, message):
    with pytest.raises(KafkaException) as info:
        Producer({"url": "http://127.0.0.1:1", **config})
    err = info.value.args[0]
    assert err.code() == KafkaError._INVALID_ARG
    assert message in err.str()


def test_transactional_id_turns_idempotence_on_and_the_transactional_api_needs_it():
    p = Producer({"url": "http://127.0.0.1:1", "transactional.id": "t", "acks": "all", "max.in.flight": 5})
    try:
        assert p._idempotent
    finally:
        p.close()
    plain = Producer({"url": "http://127.0.0.1:1", "acks": 1, "retries": 0})
    try:
        with pytest.raises(KafkaException) as info:
            plain.begin_transaction()
        assert info.value.args[0].code() == KafkaError._NOT_CONFIGURED
    finally:
        plain.close()


def test_idempotent_producer_delivers_every_record_once_in_order_with_its_offset(server, topic_name):
    create_topic(server.url, topic_name, 3)
    reports = Reports()
    p = Producer({"bootstrap.servers": server.url, "enable.idempotence": True, "linger.ms": 2, "batch.num.messages": 7})
    keys = [f"user-{i % 17}".encode() for i in range(400)]
    for i, key in enumerate(keys):
        p.produce(topic_name, value=f"v{i}".encode(), key=key, on_delivery=reports)
        if i % 50 == 0:
            p.poll(0)
    assert p.flush(30) == 0
    p.close()

    assert reports.errors == []
    assert len(reports.items) == len(keys)
    by_partition: dict[int, list] = {}
    for _, msg in reports.items:
        assert msg.partition() == partition_for_key(msg.key(), 3)  # Kafka's murmur2 partitioner
        by_partition.setdefault(msg.partition(), []).append(msg)
    log = read_topic(server.url, topic_name, 3, "read_uncommitted")
    for partition, msgs in by_partition.items():
        # reports come per partition in offset order, and the offsets are the log's
        assert [m.offset() for m in msgs] == list(range(len(msgs)))
        assert [(r["key"], r["value"]) for r in log[partition]] == [(m.key(), m.value()) for m in msgs]
    produced = sorted(int(m.value()[1:]) for _, m in reports.items)
    assert produced == list(range(len(keys)))


def test_one_producer_shared_by_threads(server, topic_name):
    create_topic(server.url, topic_name, 2)
    reports = Reports()
    p = Producer(
        {"url": server.url, "enable.idempotence": True, "linger.ms": 1, "batch.num.messages": 25, "on_delivery": reports}
    )

    def produce_some(thread: int) -> None:
        for i in range(250):
            p.produce(topic_name, value=f"{thread}-{i}".encode(), key=str(thread).encode())
            if i % 100 == 0:
                p.poll(0)

    threads = [threading.Thread(target=produce_some, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert p.flush(60) == 0
    p.close()
    assert reports.errors == []
    log = read_topic(server.url, topic_name, 2, "read_uncommitted")
    values = [r["value"].decode() for part in log.values() for r in part]
    assert sorted(values) == sorted(f"{t}-{i}" for t in range(4) for i in range(250))
    for t in range(4):  # each thread's records keep their order (one key, one partition)
        mine = [int(v.split("-")[1]) for v in values if v.startswith(f"{t}-")]
        assert mine == list(range(250))


def test_bytes_headers_and_timestamps_arrive_exactly(server, topic_name):
    create_topic(server.url, topic_name, 1)
    reports = Reports()
    p = Producer({"url": server.url, "enable.idempotence": True, "on_delivery": reports})
    value = bytes(range(256))
    headers = [("h", b"\x00\xff"), ("h", None), ("text", "caf\u00e9")]
    p.produce(topic_name, value=value, key=b"\xfe", headers=headers, timestamp=1_700_000_000_123)
    p.produce(topic_name, value=None, key=None, headers={"only": b"one"})
    p.flush(30)
    p.close()
    assert reports.errors == []
    first, _second = (m for _, m in reports.items)
    assert first.timestamp() == (1, 1_700_000_000_123)
    assert first.headers() == [("h", b"\x00\xff"), ("h", None), ("text", "caf\u00e9".encode())]
    log = read_partition(server.url, topic_name, 0, "read_uncommitted")
    assert log[0]["key"] == b"\xfe" and log[0]["value"] == value
    assert log[0]["headers"] == [("h", b"\x00\xff"), ("h", None), ("text", "caf\u00e9".encode())]
    assert log[1]["key"] is None and log[1]["value"] is None and log[1]["headers"] == [("only", b"one")]


def test_produce_refuses_unknown_partitions_and_topics(server, topic_name):
    create_topic(server.url, topic_name, 2)
    p = Producer({"url": server.url})
    try:
        with pytest.raises(KafkaException) as info:
            p.produce(topic_name, value=b"x", partition=2)
        assert info.value.args[0].code() == KafkaError._UNKNOWN_PARTITION
        with pytest.raises(KafkaException) as info:
            p.produce(topic_name + "-missing", value=b"x")
        assert info.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PARTITION
        reports = Reports()
        for _ in range(10):
            p.produce(topic_name, value=b"x", partition=1, on_delivery=reports)
        assert p.flush(30) == 0
        assert reports.errors == [] and {m.partition() for _, m in reports.items} == {1}
    finally:
        p.close()


def test_pipelined_batches_overtaking_each_other_keep_the_partition_in_order(server, topic_name):
    """Tiny batches, five in flight on separate connections: requests overtake each other and the
    server refuses them with OUT_OF_ORDER_SEQUENCE_NUMBER until the earlier batch is in; they are
    sent again and the log holds every record once, in produce order."""
    create_topic(server.url, topic_name, 2)
    reports = Reports()
    p = Producer({"url": server.url, "enable.idempotence": True, "linger.ms": 0, "batch.num.messages": 3, "on_delivery": reports})
    n = 1500
    for i in range(n):
        p.produce(topic_name, value=str(i).encode(), partition=i % 2)
    assert p.flush(60) == 0
    p.close()
    assert reports.errors == []
    for partition in range(2):
        values = [int(r["value"]) for r in read_partition(server.url, topic_name, partition, "read_uncommitted")]
        assert values == list(range(partition, n, 2))


def test_transactions_commit_abort_and_each_start_a_new_epoch(server, topic_name):
    create_topic(server.url, topic_name, 2)
    tid = _tid()
    reports = Reports()
    p = Producer({"url": server.url, "transactional.id": tid, "on_delivery": reports})
    p.init_transactions()
    outcomes = ["commit", "abort", "commit", "commit", "abort"]
    for n, outcome in enumerate(outcomes):
        p.begin_transaction()
        for i in range(6):
            p.produce(topic_name, value=f"t{n}-{i}".encode(), partition=i % 2)
        if outcome == "commit":
            p.commit_transaction()
        else:
            p.flush()
            p.abort_transaction()
    p.close()
    assert reports.errors == []
    committed = sorted(r["value"].decode() for part in read_topic(server.url, topic_name, 2).values() for r in part)
    expected = sorted(f"t{n}-{i}" for n, o in enumerate(outcomes) if o == "commit" for i in range(6))
    assert committed == expected
    everything = sum(len(v) for v in read_topic(server.url, topic_name, 2, "read_uncommitted").values())
    assert everything == 6 * len(outcomes)
    txn = httpx.get(f"{server.url}/v1/transactions/{tid}", timeout=10).json()
    assert txn["state"] == "CompleteAbort"
    assert txn["producer_epoch"] == len(outcomes)  # init gave epoch 0; each end moved it on


def test_abort_drops_records_not_sent_yet(server, topic_name):
    create_topic(server.url, topic_name, 1)
    reports = Reports()
    p = Producer({"url": server.url, "transactional.id": _tid(), "linger.ms": 60_000, "on_delivery": reports})
    p.init_transactions()
    p.begin_transaction()
    for _i in range(5):
        p.produce(topic_name, value=b"never")
    p.abort_transaction()
    assert [e.code() for e in reports.errors] == [KafkaError._PURGE_QUEUE] * 5
    p.begin_transaction()
    p.produce(topic_name, value=b"kept")
    p.commit_transaction()
    p.close()
    assert [r["value"] for r in read_partition(server.url, topic_name, 0)] == [b"kept"]
    assert [r["value"] for r in read_partition(server.url, topic_name, 0, "read_uncommitted")] == [b"kept"]


def test_a_newer_instance_fences_the_older_one_fatally_and_says_why(server, topic_name):
    create_topic(server.url, topic_name, 1)
    tid = _tid()
    fatal_errors: list[KafkaError] = []
    old = Producer({"url": server.url, "transactional.id": tid, "error_cb": fatal_errors.append})
    old.init_transactions()
    old.begin_transaction()
    old.produce(topic_name, value=b"zombie")
    old.flush()
    new = Producer({"url": server.url, "transactional.id": tid})
    new.init_transactions()  # aborts the old instance's transaction

    with pytest.raises(KafkaException) as info:
        old.commit_transaction()
    err = info.value.args[0]
    assert err.code() in (KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH)
    assert err.fatal() and not err.retriable() and not err.txn_requires_abort()
    assert "newer_epoch" in err.str()
    # the producer stays poisoned
    for call in (old.begin_transaction, old.abort_transaction, lambda: old.produce(topic_name, value=b"x")):
        with pytest.raises(KafkaException) as again:
            call()
        assert again.value.args[0].fatal()
    old.poll(0)
    assert [e.code() for e in fatal_errors] == [err.code()] and fatal_errors[0].fatal()

    new.begin_transaction()
    new.produce(topic_name, value=b"live")
    new.commit_transaction()
    new.close()
    old.close()
    assert [r["value"] for r in read_partition(server.url, topic_name, 0)] == [b"live"]


def test_transaction_timed_out_by_the_server_is_fenced_with_reason_timed_out(server, topic_name):
    create_topic(server.url, topic_name, 1)
    tid = _tid()
    p = Producer({"url": server.url, "transactional.id": tid, "transaction.timeout.ms": 1000})
    p.init_transactions()
    p.begin_transaction()
    p.produce(topic_name, value=b"late")
    p.flush()
    wait_until(
        lambda: httpx.get(f"{server.url}/v1/transactions/{tid}", timeout=10).json()["state"] == "CompleteAbort",
        timeout=30,
        interval=0.1,
        message="the server to abort the timed-out transaction",
    )
    with pytest.raises(KafkaException) as info:
        p.commit_transaction()
    err = info.value.args[0]
    assert err.fatal() and "timed_out" in err.str()
    p.close()
    assert read_partition(server.url, topic_name, 0) == []


def test_a_failed_batch_makes_the_transaction_abortable_not_fatal(server, topic_name):
    create_topic(server.url, topic_name, 2)
    reports = Reports()
    p = Producer({"url": server.url, "transactional.id": _tid(), "message.max.bytes": 4_000_000, "on_delivery": reports})
    p.init_transactions()
    p.begin_transaction()
    p.produce(topic_name, value=b"small", partition=0)
    p.produce(topic_name, value=b"x" * 2_000_000, partition=1)  # larger than the server takes
    with pytest.raises(KafkaException) as info:
        p.commit_transaction()
    err = info.value.args[0]
    assert err.code() == KafkaError.MESSAGE_TOO_LARGE
    assert err.txn_requires_abort() and not err.fatal()
    with pytest.raises(KafkaException) as again:
        p.produce(topic_name, value=b"more")
    assert again.value.args[0].txn_requires_abort()
    p.abort_transaction()
    assert KafkaError.MESSAGE_TOO_LARGE in [e.code() for e in reports.errors]

    p.begin_transaction()
    p.produce(topic_name, value=b"after", partition=1)
    p.commit_transaction()
    p.close()
    assert [r["value"] for r in read_partition(server.url, topic_name, 1)] == [b"after"]
    assert read_partition(server.url, topic_name, 0) == []


def test_a_transaction_of_one_batch_is_committed_with_it_in_one_request(server, topic_name):
    """A transaction whose records are one batch not sent yet is committed with that batch
    (``"commit": true``): one request, where two batches and their end are three. Through a proxy
    that loses a third of the answers, every such transaction is committed once, its records once."""
    create_topic(server.url, topic_name, 2)
    with LossyProxy(server.port, drop_answer=0.0) as proxy:
        reports = Reports()
        p = Producer({"url": proxy.url, "transactional.id": _tid(), "linger.ms": 60_000, "on_delivery": reports})
        p.init_transactions()
        for n, partitions in enumerate([(0,), (0, 1), (1,)]):
            p.begin_transaction()
            for partition in partitions:
                p.produce(topic_name, value=f"a{n}-{partition}".encode(), partition=partition)
            before = proxy.answers  # (the first produce to a topic asks for its partitions)
            p.commit_transaction()
            assert proxy.answers - before == (1 if len(partitions) == 1 else 3)
        p.close()
        assert reports.errors == [] and all(msg.offset() is not None for _, msg in reports.items)
    tid = _tid()
    with LossyProxy(server.port, drop_answer=0.3, seed=5) as proxy:
        reports = Reports()
        p = Producer({"url": proxy.url, "transactional.id": tid, "linger.ms": 60_000, "on_delivery": reports})
        p.init_transactions()
        for n in range(30):
            p.begin_transaction()
            p.produce(topic_name, value=f"b{n}".encode(), partition=n % 2)
            p.commit_transaction()
        p.close()
        assert proxy.dropped_answers > 0
    assert reports.errors == []
    committed = [r["value"].decode() for part in read_topic(server.url, topic_name, 2).values() for r in part]
    assert sorted(v for v in committed if v.startswith("b")) == sorted(f"b{n}" for n in range(30))
    txn = httpx.get(f"{server.url}/v1/transactions/{tid}", timeout=10).json()
    assert (txn["state"], txn["producer_epoch"]) == ("CompleteCommit", 30)


def test_offsets_sent_to_a_transaction_commit_with_it(server, topic_name):
    create_topic(server.url, topic_name, 2)
    group = f"g-{uuid.uuid4().hex[:8]}"
    p = Producer({"url": server.url, "transactional.id": _tid()})
    p.init_transactions()
    p.begin_transaction()
    p.produce(topic_name, value=b"a", partition=0)
    p.send_offsets_to_transaction([TopicPartition(topic_name, 0, 7), TopicPartition(topic_name, 1, 3)], group)
    assert group_offsets(server.url, group) == {}
    p.abort_transaction()
    assert group_offsets(server.url, group) == {}
    p.begin_transaction()
    p.produce(topic_name, value=b"b", partition=0)
    p.send_offsets_to_transaction([TopicPartition(topic_name, 0, 9)], group)
    p.commit_transaction()
    p.close()
    assert group_offsets(server.url, group) == {(topic_name, 0): 9}


def test_transactional_calls_out_of_order_are_state_errors(server, topic_name):
    create_topic(server.url, topic_name, 1)
    p = Producer({"url": server.url, "transactional.id": _tid()})
    try:
        with pytest.raises(KafkaException) as info:
            p.begin_transaction()
        assert info.value.args[0].code() == KafkaError._STATE
        p.init_transactions()
        with pytest.raises(KafkaException) as info:
            p.produce(topic_name, value=b"outside")
        assert info.value.args[0].code() == KafkaError._STATE
        with pytest.raises(KafkaException):
            p.commit_transaction()
        p.begin_transaction()
        with pytest.raises(KafkaException) as info:
            p.begin_transaction()
        assert info.value.args[0].code() == KafkaError._STATE
        p.commit_transaction()  # an empty transaction commits
    finally:
        p.close()


def test_the_server_is_found_by_txlog_url_when_no_url_is_given(server, topic_name, monkeypatch):
    create_topic(server.url, topic_name, 1)
    monkeypatch.setenv("TXLOG_URL", server.url.removeprefix("http://"))
    reports = Reports()
    p = Producer({"enable.idempotence": True, "on_delivery": reports})
    p.produce(topic_name, value=b"found")
    assert p.flush(30) == 0
    p.close()
    assert reports.errors == [] and [r["value"] for r in read_partition(server.url, topic_name, 0)] == [b"found"]
