"""Half messages of the ``rocketmq`` check channel, as a RocketMQ gateway drives them through the
store's services: claimed only by the gateways' claims (never by the HTTP checker, and the other way
round), only for the producer groups named, once per slot however many claim at once; a claim
released uncounted; a producer's answer to a check-back applied as an HTTP answer is; a message's
own immunity before its first check."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import pytest

from app.domain.half_messages import CheckChannel, DecidedBy, HalfMessage, HalfState, LocalTransactionState
from app.domain.records import NewRecord
from app.errors import TxlogError
from app.services import Broker, topics
from app.services import half_messages as hs
from app.services.produce import ProduceResult
from tests.conftest import make_broker
from tests.support import wait_until

TOPIC = "payments"


@pytest.fixture
def b(db_url: str) -> Iterator[Broker]:
    broker = make_broker(db_url, half_check_poll_interval_ms=50, half_check_timeout_ms=300)
    topics.create_topic(broker, TOPIC, 2)
    hs.register_producer_group(broker, TOPIC, None, check_interval_ms=60_000, max_checks=3)
    yield broker
    broker.db.dispose()


def send(b: Broker, channel: CheckChannel = CheckChannel.ROCKETMQ, immunity_ms: int | None = 0, group: str = TOPIC) -> str:
    record = NewRecord(None, b"paid", (("UNIQ_KEY", b"01"),))
    msg = hs.send_half_message(b, group, TOPIC, None, record, check_immunity_ms=immunity_ms, check_channel=channel)
    return msg.transaction_id


def test_each_checker_claims_only_its_own_channels_half_messages(b: Broker) -> None:
    rocketmq_tid = send(b)
    http_tid = send(b, CheckChannel.HTTP)
    with hs.new_http_client() as http, ThreadPoolExecutor(2) as pool:
        report = hs.check_round(b, http, pool)
    assert report.checked == 1  # the HTTP one (no endpoint: an undecided check)
    assert hs.describe(b, rocketmq_tid).stored.msg.check_count == 0
    claimed, _ = hs.claim_checks(b, [TOPIC], 10)
    assert [(c.stored.msg.transaction_id, c.check_no) for c in claimed] == [(rocketmq_tid, 1)]
    assert hs.describe(b, http_tid).stored.msg.check_count == 1
    assert hs.describe(b, rocketmq_tid).stored.msg.check_channel is CheckChannel.ROCKETMQ


def test_only_the_groups_named_are_claimed(b: Broker) -> None:
    hs.register_producer_group(b, "other", None)
    send(b, group="other")
    assert hs.claim_checks(b, [TOPIC], 10)[0] == []
    assert len(hs.claim_checks(b, ["other", TOPIC], 10)[0]) == 1


def test_a_message_waits_its_own_immunity_before_its_first_check(b: Broker) -> None:
    tid = send(b, immunity_ms=3_600_000)
    msg = hs.describe(b, tid).stored.msg
    assert msg.next_check_at_ms == msg.created_at_ms + 3_600_000
    assert hs.claim_checks(b, [TOPIC], 10)[0] == []
    default = hs.describe(b, send(b, immunity_ms=None)).stored.msg
    assert default.next_check_at_ms == default.created_at_ms + hs.producer_group(b, TOPIC).check_immunity_ms


def test_a_released_claim_is_not_counted_and_is_due_again(b: Broker) -> None:
    tid = send(b)
    [claimed], _ = hs.claim_checks(b, [TOPIC], 10)
    assert hs.describe(b, tid).checks[0].check_no == 1
    assert hs.release_check(b, tid, claimed.check_no)
    detail = hs.describe(b, tid)
    assert detail.stored.msg.check_count == 0 and detail.checks == []
    assert not hs.release_check(b, tid, claimed.check_no)  # moved on: nothing to release
    again: list[hs.ClaimedCheck] = []
    wait_until(lambda: again.extend(hs.claim_checks(b, [TOPIC], 10)[0]) or bool(again), 10, 0.02, "the released check due again")
    assert [(c.stored.msg.transaction_id, c.check_no) for c in again] == [(tid, 1)]


def test_racing_claims_take_each_slot_once(b: Broker) -> None:
    tids = {send(b) for _ in range(20)}
    barrier = threading.Barrier(6)

    def claim() -> list[tuple[str, int]]:
        barrier.wait()
        return [(c.stored.msg.transaction_id, c.check_no) for c in hs.claim_checks(b, [TOPIC], 20)[0]]

    with ThreadPoolExecutor(6) as pool:
        claims = [slot for part in pool.map(lambda _: claim(), range(6)) for slot in part]
    assert sorted(claims) == sorted((tid, 1) for tid in tids)


def test_a_producers_answer_decides_once_and_a_late_one_is_ignored(b: Broker) -> None:
    tid = send(b)
    assert hs.answer_check(b, tid, LocalTransactionState.COMMIT) == "unexpected"  # never asked
    hs.claim_checks(b, [TOPIC], 10)
    assert hs.answer_check(b, tid, LocalTransactionState.UNKNOWN) == "undecided"
    assert hs.answer_check(b, tid, LocalTransactionState.COMMIT) == "committed"
    # another answer to that check, after the decision it took: late, nothing done
    assert hs.answer_check(b, tid, LocalTransactionState.ROLLBACK) == "late"
    detail = hs.describe(b, tid)
    assert detail.stored.msg.state is HalfState.COMMITTED
    assert detail.stored.msg.decided_by is not None and detail.stored.msg.decided_by.value == "check_back"
    assert [c.answer for c in detail.checks] == ["COMMIT"]  # the check's record keeps the answer that counted


def test_an_answer_for_a_half_message_decided_before_its_check_is_unexpected(b: Broker) -> None:
    tid = send(b)
    hs.claim_checks(b, [TOPIC], 10)
    hs.commit(b, tid)  # the producer's own decision, after the check was sent: the answer is late
    assert hs.answer_check(b, tid, LocalTransactionState.COMMIT) == "late"
    other = send(b)
    hs.commit(b, other)
    assert hs.answer_check(b, other, LocalTransactionState.COMMIT) == "unexpected"  # decided, never checked


def test_the_last_check_without_a_decision_rolls_back(b: Broker) -> None:
    hs.register_producer_group(b, TOPIC, None, check_interval_ms=1, max_checks=2)
    tid = send(b)
    for n in (1, 2):
        wait_until(lambda: bool(hs.claim_checks(b, [TOPIC], 10)[0]), 10, 0.01, f"check {n} claimed")
        hs.answer_check(b, tid, LocalTransactionState.UNKNOWN)
    detail = hs.describe(b, tid)
    assert detail.stored.msg.state is HalfState.ROLLED_BACK
    assert detail.stored.msg.decided_by is not None and detail.stored.msg.decided_by.value == "max_checks"


def test_a_delayed_message_is_held_then_delivered_once_however_many_claim(b: Broker) -> None:
    record = NewRecord(None, b"later", (("UNIQ_KEY", b"02"),))
    sent = hs.send_delayed_message(b, TOPIC, record, b.now() + 300, "DELAYED-1")
    assert isinstance(sent, HalfMessage) and sent.check_channel is CheckChannel.DELAY
    assert hs.deliver_due(b, 10).committed == 0  # not yet
    with hs.new_http_client() as http, ThreadPoolExecutor(2) as pool:
        assert hs.check_round(b, http, pool).checked == 0  # the HTTP checker asks nobody about it
    assert hs.claim_checks(b, [TOPIC], 10)[0] == []  # nor do the gateways' check-backs
    wait_until(lambda: b.now() >= sent.next_check_at_ms, 10, 0.02, "the delivery time")
    start = threading.Barrier(4)

    def deliver() -> int:
        start.wait()
        return hs.deliver_due(b, 10).committed

    with ThreadPoolExecutor(4) as pool:
        delivered = list(pool.map(lambda _: deliver(), range(4)))
    assert sum(delivered) == 1
    msg = hs.describe(b, "DELAYED-1").stored.msg
    assert msg.state is HalfState.COMMITTED and msg.decided_by is DecidedBy.DELIVERY_TIME and msg.offset is not None
    assert msg.check_count == 0


def test_a_delivery_time_not_in_the_future_appends_at_once(b: Broker) -> None:
    sent = hs.send_delayed_message(b, TOPIC, NewRecord(None, b"now", ()), b.now() - 1000, "DELAYED-2")
    assert isinstance(sent, ProduceResult)
    with pytest.raises(TxlogError):
        hs.describe(b, "DELAYED-2")  # never held


def test_the_http_servers_checker_delivers_delayed_messages_too(b: Broker) -> None:
    checker = hs.CheckerThread(b)
    checker.start()
    try:
        hs.send_delayed_message(b, TOPIC, NewRecord(None, b"soon", ()), b.now() + 200, "DELAYED-3")
        wait_until(lambda: hs.describe(b, "DELAYED-3").stored.msg.state is HalfState.COMMITTED, 10, 0.02, "the delivery")
    finally:
        checker.stop()
        checker.join(10)
    assert checker.totals.committed == 1 and checker.totals.checked == 0


def test_a_check_no_gateway_could_send_is_counted_once_the_grace_has_passed(b: Broker) -> None:
    tid = send(b)
    http_tid = send(b, CheckChannel.HTTP)
    report = hs.count_orphaned_checks(b, 60_000, 10)
    assert (report.checked, hs.describe(b, tid).stored.msg.check_count) == (0, 0)  # due for less than the grace
    report = hs.count_orphaned_checks(b, 0, 10)
    assert (report.checked, hs.describe(b, tid).stored.msg.check_count) == (1, 1)
    assert hs.describe(b, http_tid).stored.msg.check_count == 0  # the HTTP checker's own
    # counted and leased for one check interval, as a check sent is: not counted again meanwhile
    assert hs.count_orphaned_checks(b, 0, 10).checked == 0
    assert hs.claim_checks(b, [TOPIC], 10)[0] == []
