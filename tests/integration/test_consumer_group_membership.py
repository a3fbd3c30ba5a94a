"""KIP-848 consumer groups in PostgreSQL: a heartbeat loads, decides and persists under the group
row's lock, so two brokers (processes) serve one group and neither holds its state; a member that
does not revoke within its rebalance timeout, or falls silent, is fenced by the sweeper."""

from __future__ import annotations

import functools
import threading

import pytest
from sqlalchemy import text

from app.domain.groups import consumer_group as cg
from app.domain.groups.offsets import GroupOffset
from app.errors import ErrorCode, TxlogError
from app.services import consumer_groups, groups, sweeper, topics
from app.services import transactions as txn_service
from app.storage import consumer_groups as store
from app.storage import groups as groups_store
from app.storage import topics as topics_store
from tests.conftest import make_broker
from tests.support import wait_until

G = "modern"


def _join(broker, member: str, *names: str) -> cg.HeartbeatAnswer:  # type: ignore[no-untyped-def]
    request = cg.HeartbeatRequest(G, member, 0, rebalance_timeout_ms=5_000, subscribed_topic_names=list(names), owned={})
    return consumer_groups.heartbeat(broker, request)


def _beat(broker, member: str, epoch: int, owned) -> cg.HeartbeatAnswer:  # type: ignore[no-untyped-def]
    return consumer_groups.heartbeat(broker, cg.HeartbeatRequest(G, member, epoch, owned=owned))


@pytest.fixture
def topic(clocked_broker) -> str:  # type: ignore[no-untyped-def]
    topics.create_topic(clocked_broker, "orders", 2)
    return "orders"


def test_two_brokers_serve_one_group(clocked_broker, clock, db_url, topic) -> None:  # type: ignore[no-untyped-def]
    other = make_broker(db_url, clock)
    try:
        first = _join(clocked_broker, "m1", topic)
        assert first.member_epoch == 1 and first.assignment is not None
        owned = first.assignment
        second = _join(other, "m2", topic)
        assert second.member_epoch == 2 and second.assignment == {}  # nothing released yet
        revoking = _beat(other, "m1", 1, owned)  # the other broker asks m1 to give one up
        assert revoking.member_epoch == 1 and revoking.assignment is not None and len(revoking.assignment[next(iter(owned))]) == 1
        done = _beat(clocked_broker, "m1", 1, revoking.assignment)
        assert done.member_epoch == 2
        given = _beat(clocked_broker, "m2", 2, {})
        assert given.assignment is not None and len(next(iter(given.assignment.values()))) == 1
        [described] = consumer_groups.describe(other, [G])
        assert described.group is not None and described.group.state == cg.STABLE
        assert consumer_groups.list_groups(other) == [(G, cg.STABLE)]
    finally:
        other.db.dispose()


def test_the_sweeper_fences_a_member_that_does_not_revoke_and_one_gone_silent(clocked_broker, clock, topic) -> None:  # type: ignore[no-untyped-def]
    b = clocked_broker
    owned = _join(b, "m1", topic).assignment
    _join(b, "m2", topic)
    _beat(b, "m1", 1, owned)  # asked to revoke; it never does
    clock.advance(5_000)
    assert sweeper.sweep(b).consumer_members_fenced == 1
    [described] = consumer_groups.describe(b, [G])
    assert described.group is not None and sorted(described.group.members) == ["m2"]
    clock.advance(cg.SESSION_TIMEOUT_MS)
    assert sweeper.sweep(b).consumer_members_fenced == 1
    [described] = consumer_groups.describe(b, [G])
    assert described.group is not None and described.group.state == cg.EMPTY
    assert consumer_groups.delete_group(b, G)


def _fencing_held(broker, member: str, holding: threading.Event, release: threading.Event) -> None:  # type: ignore[no-untyped-def]
    """A fencing of ``member`` as the sweeper does it, holding the group row's lock, written but
    not committed, until ``release``."""
    with broker.db.transaction() as conn:
        stored = store.GROUPS.lock(conn, G)
        assert stored is not None
        store.GROUPS.save(conn, stored, cg.remove_member(stored, member, {}))
        holding.set()
        release.wait(30)


def _waiting_on_a_lock(broker) -> bool:  # type: ignore[no-untyped-def]
    with broker.db.read() as conn:
        return bool(
            conn.execute(
                text("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'")
            ).scalar_one()
        )


@pytest.mark.parametrize("commit", ["OffsetCommit", "TxnOffsetCommit"])
def test_an_offset_commit_checked_while_its_member_is_fenced_writes_nothing(clocked_broker, db_url, clock, topic, commit) -> None:  # type: ignore[no-untyped-def]
    """The member check of a commit and its write are one database transaction under the group
    row's lock: a commit checked while a fencing of its member is under way waits for it, then
    sees the member gone (UNKNOWN_MEMBER_ID) and writes nothing."""
    b = clocked_broker
    joined = _join(b, "m1", topic)
    assert joined.member_epoch == 1 and joined.assignment
    partitions = [(topic, 0)]
    fence = functools.partial(consumer_groups.offset_commit_fence, b, G, "m1", 1, partitions, commit != "OffsetCommit", 9)
    producer = txn_service.init_producer_id(b, "tid") if commit == "TxnOffsetCommit" else None

    def write() -> None:
        offsets = [GroupOffset(topic, 0, 5, "")]
        if producer is None:
            groups.offset_commit(b, G, offsets, fence)
        else:
            txn_service.txn_offset_commit(b, "tid", producer.producer_id, producer.producer_epoch, G, offsets, fence=fence)

    holding, release = threading.Event(), threading.Event()
    fencing = threading.Thread(target=_fencing_held, args=(make_broker(db_url, clock), "m1", holding, release))
    fencing.start()
    errors: list[BaseException] = []
    committing = threading.Thread(target=lambda: _record_error(write, errors))
    try:
        assert holding.wait(30)
        # The check alone, before the fencing commits, still finds the member: the window.
        assert consumer_groups.check_offset_commit(b, G, "m1", 1, partitions, commit != "OffsetCommit", 9) == (True, None)
        committing.start()
        wait_until(lambda: _waiting_on_a_lock(b), message="the commit waiting on the group's row")
        assert committing.is_alive()
    finally:
        release.set()
        fencing.join(30)
    committing.join(30)
    assert [type(e) for e in errors] == [TxlogError] and errors[0].code is ErrorCode.UNKNOWN_MEMBER_ID  # type: ignore[attr-defined]
    assert groups.offset_fetch_partitions(b, G, partitions)[0].offset is None
    with b.db.read() as conn:
        assert groups_store.pending_offsets_of_group(conn, G) == []


def test_a_fencing_waits_for_an_offset_commit_checked_before_it(clocked_broker, db_url, clock, topic) -> None:  # type: ignore[no-untyped-def]
    """The other order: a commit that passed its check holds the group row (FOR SHARE) until its
    offsets are written; a fencing of its member waits for it, and the commit stands."""
    b = clocked_broker
    _join(b, "m1", topic)
    checked, release = threading.Event(), threading.Event()

    def fence_then_wait(conn) -> None:  # type: ignore[no-untyped-def]
        consumer_groups.offset_commit_fence(b, G, "m1", 1, [(topic, 0)], False, 9, conn)
        checked.set()
        release.wait(30)

    errors: list[BaseException] = []
    committing = threading.Thread(
        target=lambda: _record_error(lambda: groups.offset_commit(b, G, [GroupOffset(topic, 0, 7, "")], fence_then_wait), errors)
    )
    committing.start()
    other = make_broker(db_url, clock)
    fenced: list[str] = []

    def fence_member() -> None:
        with other.db.transaction() as conn:
            stored = store.GROUPS.lock(conn, G)
            assert stored is not None
            store.GROUPS.save(conn, stored, cg.remove_member(stored, "m1", {}))
        fenced.append("m1")

    fencing = threading.Thread(target=fence_member)
    try:
        assert checked.wait(30)
        fencing.start()
        wait_until(lambda: _waiting_on_a_lock(b), message="the fencing waiting on the group's row")
        assert fenced == []
    finally:
        release.set()
        committing.join(30)
        fencing.join(30)
    assert errors == [] and fenced == ["m1"]
    assert groups.offset_fetch_partitions(b, G, [(topic, 0)])[0].offset == 7


def _record_error(step, errors: list[BaseException]) -> None:  # type: ignore[no-untyped-def]
    try:
        step()
    except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
        errors.append(exc)


def test_a_regex_group_reads_every_topic_only_after_the_catalogue_changed(clocked_broker, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A heartbeat of a group subscribed by regular expression reads every topic's metadata only
    when a topic was created or deleted, or grew, since the group last did; a topic created later
    is still picked up at the next heartbeat."""
    b = clocked_broker
    for name in ("orders-1", "audit", "payments"):
        topics.create_topic(b, name, 2)
    read: list[object] = []
    real = topics_store.topics_metadata
    monkeypatch.setattr(
        topics_store, "topics_metadata", lambda conn, names=None, **kw: read.append(names) or real(conn, names, **kw)
    )
    request = cg.HeartbeatRequest(G, "m1", 0, rebalance_timeout_ms=5_000, subscribed_topic_regex="orders-.*", owned={})
    answer = consumer_groups.heartbeat(b, request)
    assert read == [None] and answer.assignment is not None and len(answer.assignment) == 1
    for _ in range(3):
        answer = _beat(b, "m1", answer.member_epoch, {t: ps for t, ps in (answer.assignment or {}).items()})
    assert read[1:] == [["orders-1"]] * 3  # the topics the group knows, not every topic
    owned = {t: ps for t, ps in (answer.assignment or {}).items()} if answer.assignment else None
    topics.create_topic(b, "orders-2", 1)
    read.clear()
    moved = _beat(b, "m1", answer.member_epoch, owned)
    assert read == [None] and moved.member_epoch == answer.member_epoch + 1
    assert moved.assignment is not None and sum(len(ps) for ps in moved.assignment.values()) == 3
    read.clear()
    _beat(b, "m1", moved.member_epoch, moved.assignment)
    assert read == [["orders-1", "orders-2"]]
