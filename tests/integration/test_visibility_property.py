"""Property: whatever the interleaving of plain, idempotent and transactional producers (committed,
aborted, fenced by a re-init or left open) over two partitions, what readers see matches a small
in-memory model of Kafka's visibility rules — read_committed fetches, the committed_records view,
the admin record browser, read_uncommitted fetches, and each partition's high watermark and last
stable offset. Some transactional producers get a new epoch per transaction (transactions V2, the
HTTP API); others keep one epoch for all their transactions (Kafka clients before V2), so
committed and aborted transactions of one (producer id, epoch) interleave on the partitions."""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass, field

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from app.domain.records import NewRecord
from app.services import fetch as fetch_service
from app.services import produce as produce_service
from app.services import topics, transactions
from app.services.inspect.topics import browse_partition
from app.services.produce import ProduceRequest
from app.storage import log as log_store
from tests.integration.test_transactions import Producer

PARTITIONS = 2
ACTORS = ("ta", "tb", "tc", "td")
KEEPS_EPOCH = {"tc", "td"}  # transaction version 1


# --- the model ------------------------------------------------------------------------------------


@dataclass
class Entry:
    offset: int
    value: bytes | None  # None: a control record
    txn: tuple[str, int] | None = None  # (actor, n-th transaction of the actor) for transactional data


@dataclass
class Model:
    logs: list[list[Entry]] = field(default_factory=lambda: [[] for _ in range(PARTITIONS)])
    outcome: dict[tuple[str, int], str] = field(default_factory=dict)  # "open" | "commit" | "abort"
    current: dict[str, int] = field(default_factory=dict)  # actor -> number of its current transaction
    joined: dict[tuple[str, int], set[int]] = field(default_factory=dict)  # transaction -> its partitions

    def hw(self, p: int) -> int:
        return len(self.logs[p])

    def append(self, p: int, value: bytes | None, txn: tuple[str, int] | None = None) -> int:
        self.logs[p].append(Entry(self.hw(p), value, txn))
        return self.hw(p) - 1

    def txn_of(self, actor: str) -> tuple[str, int]:
        return actor, self.current.setdefault(actor, 0)

    def send(self, actor: str, p: int, value: bytes) -> None:
        t = self.txn_of(actor)
        self.outcome[t] = "open"
        self.joined.setdefault(t, set()).add(p)
        self.append(p, value, t)

    def end(self, actor: str, result: str) -> None:
        t = self.txn_of(actor)
        for p in sorted(self.joined.get(t, ())):
            self.append(p, None)
        if t in self.outcome:
            self.outcome[t] = result
        self.current[actor] += 1

    def reinit(self, actor: str) -> None:
        t = self.txn_of(actor)
        if self.outcome.get(t) == "open":  # the fencing init aborts the open transaction
            self.end(actor, "abort")

    def lso(self, p: int) -> int:
        firsts = [e.offset for e in self.logs[p] if e.txn is not None and self.outcome[e.txn] == "open"]
        return min(firsts, default=self.hw(p))

    def committed(self, p: int) -> list[tuple[int, bytes]]:
        lso = self.lso(p)
        return [
            (e.offset, e.value)
            for e in self.logs[p]
            if e.value is not None and e.offset < lso and (e.txn is None or self.outcome[e.txn] == "commit")
        ]

    def data(self, p: int) -> list[tuple[int, bytes]]:
        return [(e.offset, e.value) for e in self.logs[p] if e.value is not None]


# --- the operations -------------------------------------------------------------------------------

step = st.one_of(
    st.tuples(st.just("plain"), st.integers(0, PARTITIONS - 1), st.integers(1, 3)),
    st.tuples(st.just("idempotent"), st.integers(0, PARTITIONS - 1), st.integers(1, 3), st.booleans()),
    st.tuples(st.just("send"), st.sampled_from(ACTORS), st.integers(0, PARTITIONS - 1), st.integers(1, 3)),
    st.tuples(st.just("send"), st.sampled_from(ACTORS), st.integers(0, PARTITIONS - 1), st.integers(1, 3)),
    st.tuples(st.just("end"), st.sampled_from(ACTORS), st.sampled_from(["commit", "abort"])),
    st.tuples(st.just("reinit"), st.sampled_from(ACTORS)),
)


def read_committed(broker, topic: str, p: int, page: int) -> tuple[list[tuple[int, bytes]], int]:  # type: ignore[no-untyped-def]
    """A read_committed consumer from offset 0, following next_offset with small fetches until it
    reaches the last stable offset. Returns what it saw and where it stopped."""
    seen: list[tuple[int, bytes]] = []
    offset = 0
    for _ in range(1000):
        got = fetch_service.fetch(broker, topic, p, offset, max_records=page, isolation_level="read_committed")
        assert len(got.records) <= page
        assert got.next_offset > offset or (got.next_offset == offset == got.last_stable_offset)
        seen += [(r.offset, r.value) for r in got.records]
        offset = got.next_offset
        if offset >= got.last_stable_offset:
            return seen, offset
    raise AssertionError("the reader never reached the last stable offset")


def read_uncommitted(broker, topic: str, p: int) -> list[tuple[int, bytes]]:  # type: ignore[no-untyped-def]
    got = fetch_service.fetch(broker, topic, p, 0, max_records=10_000)
    assert got.next_offset == got.high_watermark
    return [(r.offset, r.value) for r in got.records]


def check(broker, topic: str, model: Model, page: int) -> None:  # type: ignore[no-untyped-def]
    with broker.db.read() as conn:
        view = [
            (r[0], r[1], r[2])
            for r in conn.execute(
                text(
                    'SELECT partition, "offset", value FROM txlog.committed_records WHERE topic = :t ORDER BY partition, "offset"'
                ),
                {"t": topic},
            )
        ]
        statuses = log_store.partition_status_all(conn, topic)
    assert view == [(p, o, v) for p in range(PARTITIONS) for o, v in model.committed(p)]
    for p in range(PARTITIONS):  # the admin record browser, as a read_committed reader
        page_ = browse_partition(broker, topic, p, "read_committed", offset=0, limit=1000)
        assert [(r.offset, r.value) for r in page_.records] == model.committed(p)
    assert [(s.high_watermark, s.last_stable_offset) for s in statuses] == [
        (model.hw(p), model.lso(p)) for p in range(PARTITIONS)
    ]
    for p in range(PARTITIONS):
        seen, stopped = read_committed(broker, topic, p, page)
        assert seen == model.committed(p)
        assert stopped == model.lso(p)
        assert read_uncommitted(broker, topic, p) == model.data(p)


# An empty transaction right after one with partitions must not mark those partitions again.
@example(steps=[("send", "ta", 0, 1), ("end", "ta", "commit"), ("end", "ta", "abort")], page=1, check_every=True)
# One epoch, an aborted transaction and then a committed one on both partitions, interleaved with
# another producer of one epoch: the committed records stay visible, the second abort is indexed.
@example(
    steps=[
        ("send", "tc", 0, 2),
        ("send", "td", 1, 1),
        ("send", "tc", 1, 1),
        ("end", "tc", "abort"),
        ("send", "td", 0, 1),
        ("send", "tc", 0, 1),
        ("send", "tc", 1, 2),
        ("end", "tc", "commit"),
        ("end", "td", "abort"),
        ("send", "tc", 1, 1),
        ("send", "td", 1, 1),
        ("end", "tc", "abort"),
        ("end", "td", "commit"),
    ],
    page=2,
    check_every=True,
)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(step, min_size=8, max_size=30), page=st.integers(1, 4), check_every=st.booleans())
def test_readers_see_exactly_what_the_model_allows(broker, steps, page, check_every):
    run = uuid.uuid4().hex[:8]
    topic = f"vis-{run}"
    topics.create_topic(broker, topic, PARTITIONS)
    model = Model()
    counter = itertools.count()
    producers: dict[str, Producer] = {}
    idempotent = transactions.init_producer_id(broker, None).producer_id
    idempotent_seq = [0] * PARTITIONS

    def new_producer(actor: str) -> Producer:
        return Producer(broker, f"{run}-{actor}", transaction_version=1 if actor in KEEPS_EPOCH else 2)

    def values(who: str, n: int) -> list[bytes]:
        return [f"{who}-{next(counter)}".encode() for _ in range(n)]

    for op in steps:
        kind = op[0]
        if kind == "plain":
            _, p, n = op
            batch = values("plain", n)
            r = produce_service.produce(broker, topic, p, ProduceRequest([NewRecord(None, v) for v in batch]))
            assert r.base_offset == model.hw(p)
            for v in batch:
                model.append(p, v)
        elif kind == "idempotent":
            _, p, n, retried = op
            batch = values("idem", n)
            req = ProduceRequest([NewRecord(None, v) for v in batch], idempotent, 0, idempotent_seq[p])
            r = produce_service.produce(broker, topic, p, req)
            assert (r.base_offset, r.duplicate) == (model.hw(p), False)
            for v in batch:
                model.append(p, v)
            idempotent_seq[p] += n
            if retried:
                again = produce_service.produce(broker, topic, p, req)
                assert again.duplicate and again.base_offset == r.base_offset
        elif kind == "send":
            _, actor, p, n = op
            producer = producers.get(actor) or producers.setdefault(actor, new_producer(actor))
            batch = values(actor, n)
            r = producer.send(topic, p, *[v.decode() for v in batch])
            assert r.base_offset == model.hw(p)
            for v in batch:
                model.send(actor, p, v)
        elif kind == "end":
            _, actor, result = op
            producer = producers.get(actor) or producers.setdefault(actor, new_producer(actor))
            if actor not in KEEPS_EPOCH or model.txn_of(actor) in model.outcome:
                # (a client before transactions V2 ends an empty transaction without asking)
                producer.end(result)
            model.end(actor, result)
        else:
            _, actor = op
            producer = producers.get(actor) or producers.setdefault(actor, new_producer(actor))
            producer.init()
            model.reinit(actor)
        if check_every:
            check(broker, topic, model, page)
    check(broker, topic, model, page)
