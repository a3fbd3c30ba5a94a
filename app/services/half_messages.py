"""Half messages with check-back, as RocketMQ's transactional messages: "run my local database
transaction and send the message — both or neither".

A producer sends a half message (stored invisibly, in ``half_messages``, not in its partition), runs
its local transaction, then commits or rolls the half message back. A commit appends the message
to its topic and partition through the produce path, in the same database transaction that marks
it Committed, under the half message's row lock: however many commits, rollbacks and check-back
decisions race, the first decision wins and a commit appends exactly once. When the producer goes
quiet, the checker asks the producer group's check-back endpoint (the message itself, as RocketMQ's
``checkLocalTransaction(MessageExt)`` receives it) and applies its answer; after ``max_checks``
check-backs without a decision it rolls the half message back and records why.

The checker runs in every worker of every host: a due half message is claimed with ``FOR UPDATE
SKIP LOCKED`` and leased for one check interval (its check counted and recorded) in one short
database transaction; the endpoint is called outside any transaction, bounded by
``TXLOG_HALF_CHECK_TIMEOUT_MS``; its answer is applied in another, under the row lock.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
from sqlalchemy.engine import Connection

from app import faults
from app.domain import half_messages as hm
from app.domain.half_messages import (
    Contradicted,
    Decided,
    DecidedBy,
    HalfMessage,
    HalfState,
    LocalTransactionState,
    ProducerGroup,
    Repeated,
)
from app.domain.limits import RecordLimits, check_record
from app.domain.records import Encoding, NewRecord, encode_bytes, headers_object
from app.errors import ErrorCode, TxlogError
from app.services import Broker, produce
from app.services.rounds import RoundReport
from app.storage import half_messages as q
from app.storage.half_messages import CheckRecord, StoredHalfMessage

log = logging.getLogger("txlog.half_messages")

# An answer longer than this is not a check-back answer.
MAX_ANSWER_BYTES = 65_536
BATCH_ROWS = 1000


# --- producer groups ------------------------------------------------------------------------------


def register_producer_group(
    broker: Broker,
    producer_group: str,
    check_url: str | None,
    check_interval_ms: int | None = None,
    check_immunity_ms: int | None = None,
    max_checks: int | None = None,
) -> ProducerGroup:
    """Set a producer group's check-back endpoint and knobs (RocketMQ's defaults for those not
    given). The URL must be one the server may call (``TXLOG_HALF_CHECK_ALLOWED_HOSTS``)."""
    hm.validate_names(producer_group)
    group = ProducerGroup(
        producer_group,
        check_url,
        hm.DEFAULT_CHECK_INTERVAL_MS if check_interval_ms is None else check_interval_ms,
        hm.DEFAULT_CHECK_IMMUNITY_MS if check_immunity_ms is None else check_immunity_ms,
        hm.DEFAULT_MAX_CHECKS if max_checks is None else max_checks,
    )
    hm.validate_group_settings(group.check_interval_ms, group.check_immunity_ms, group.max_checks)
    if check_url is not None:
        problem = hm.check_url_problem(check_url, broker.settings.half_check_allowed_hosts)
        if problem:
            raise TxlogError(ErrorCode.INVALID_CONFIG, f"check_url refused: {problem}")
    with broker.db.transaction() as conn:
        return q.producer_group_put(conn, group, broker.now())


def producer_group(broker: Broker, name: str) -> ProducerGroup:
    """A producer group's settings; a group nobody registered has the defaults and no endpoint."""
    hm.validate_producer_group(name)
    with broker.db.read() as conn:
        return q.producer_group_get(conn, name) or ProducerGroup(name)


def producer_groups(broker: Broker) -> list[ProducerGroup]:
    with broker.db.read() as conn:
        return q.producer_group_list(conn)


# --- the producer's side: send, commit, rollback --------------------------------------------------


def send_half_message(
    broker: Broker,
    producer_group: str,
    topic: str,
    partition: int | None,
    record: NewRecord,
    encoding: Encoding = "utf8",
    transaction_id: str | None = None,
    check_immunity_ms: int | None = None,
    check_channel: hm.CheckChannel = hm.CheckChannel.HTTP,
) -> HalfMessage:
    """Store a half message, invisible to every reader and outside its partition. Without a
    partition the key picks it as a plain produce does. A ``transaction_id`` chosen by the producer
    makes the send safe to retry: the same message again answers the half message stored first.
    ``check_immunity_ms``: this message's own wait before its first check-back (else its group's);
    ``check_channel``: how its check-backs reach the producer group."""
    hm.validate_names(producer_group, transaction_id)
    if record.size() > broker.settings.max_request_bytes:
        raise TxlogError(ErrorCode.MESSAGE_TOO_LARGE, f"The message is larger than {broker.settings.max_request_bytes} bytes")
    check_record(record.key, record.value, record.headers, RecordLimits.from_settings(broker.settings), "the message")
    n = produce.partition_count(broker, topic)
    if partition is not None and not 0 <= partition < n:
        raise TxlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"Topic {topic!r} has no partition {partition} (it has {n})")
    chosen = partition if partition is not None else produce.choose_partition(broker, topic, record.key)
    now = broker.now()
    tid = transaction_id or uuid.uuid4().hex.upper()
    with broker.db.transaction() as conn:
        group = q.producer_group_get(conn, producer_group) or ProducerGroup(producer_group)
        first_check = hm.first_check_at(now, group, check_immunity_ms)
        msg = HalfMessage(
            tid, producer_group, topic, chosen, HalfState.PREPARED, 0, now, first_check, check_channel=check_channel
        )
        stored = StoredHalfMessage(msg, NewRecord(record.key, record.value, record.headers, now), encoding)
        if q.half_message_insert(conn, stored):
            return msg
        existing = q.half_message_get(conn, tid)
    assert existing is not None
    same = (
        existing.msg.producer_group == producer_group
        and existing.msg.topic == topic
        and (partition is None or existing.msg.partition == partition)
        and (existing.record.key, existing.record.value, existing.record.headers) == (record.key, record.value, record.headers)
    )
    if not same:
        raise TxlogError(ErrorCode.INVALID_REQUEST, f"Transaction id {tid} is taken by another half message")
    return existing.msg


def send_delayed_message(
    broker: Broker, topic: str, record: NewRecord, deliver_at_ms: int, message_id: str | None = None
) -> HalfMessage | produce.ProduceResult:
    """A message to be appended at ``deliver_at_ms``, not before (RocketMQ's DELAY message). Until
    then it is a half message of the ``delay`` check channel, invisible to every reader, whose next
    check is its delivery time: ``deliver_due`` commits it then, through the produce path, once,
    whichever server claims it. A delivery time not in the future appends at once."""
    delay_ms = deliver_at_ms - broker.now()
    if delay_ms <= 0:
        return produce.produce_to_topic(broker, topic, [record])
    return send_half_message(
        broker,
        topic,
        topic,
        None,
        record,
        transaction_id=message_id,
        check_immunity_ms=delay_ms,
        check_channel=hm.CheckChannel.DELAY,
    )


def _not_found(transaction_id: str) -> TxlogError:
    return TxlogError(ErrorCode.TRANSACTIONAL_ID_NOT_FOUND, f"No half message has transaction id {transaction_id!r}")


def _apply(conn: Connection, broker: Broker, stored: StoredHalfMessage, decision: Decided) -> HalfMessage:
    """Carry out a decision in the caller's database transaction (the half message's row locked):
    a commit appends the message to its partition through the produce path."""
    faults.crash_point(faults.SERVER_CRASH_ENV, "half_message_decided")  # tests only: die between the decision and the append
    offset = None
    if decision.to is HalfState.COMMITTED:
        m = stored.msg
        result = produce.append(conn, broker, m.topic, m.partition, produce.ProduceRequest([stored.record]), decision.at_ms)
        offset = result.base_offset
    decided = decision.applied(stored.msg, offset)
    q.half_message_decide(conn, decided)
    return decided


def end_transaction(broker: Broker, transaction_id: str, to: HalfState) -> HalfMessage:
    """The producer's commit (``to`` = Committed) or rollback (RolledBack). Safe to lose, repeat or
    race: the first decision wins, the same one again answers the half message as decided, the
    opposite one is INVALID_TXN_STATE saying who decided and why."""
    hm.validate_transaction_id(transaction_id)
    with broker.db.transaction() as conn:
        stored = q.half_message_get(conn, transaction_id, for_update=True)
        if stored is None:
            raise _not_found(transaction_id)
        decision = hm.decide(stored.msg, to, DecidedBy.PRODUCER, broker.now())
        if isinstance(decision, Repeated):
            return decision.msg
        if isinstance(decision, Contradicted):
            raise decision.error()
        decided = _apply(conn, broker, stored, decision)
    faults.crash_point(faults.SERVER_CRASH_ENV, "half_message_ended")  # tests only: decided and committed, not answered
    return decided


def commit(broker: Broker, transaction_id: str) -> HalfMessage:
    return end_transaction(broker, transaction_id, HalfState.COMMITTED)


def rollback(broker: Broker, transaction_id: str) -> HalfMessage:
    return end_transaction(broker, transaction_id, HalfState.ROLLED_BACK)


@dataclass(frozen=True)
class HalfMessageDetail:
    stored: StoredHalfMessage
    group: ProducerGroup
    checks: list[CheckRecord]


def describe(broker: Broker, transaction_id: str) -> HalfMessageDetail:
    hm.validate_transaction_id(transaction_id)
    with broker.db.read() as conn:
        stored = q.half_message_get(conn, transaction_id)
        if stored is None:
            raise _not_found(transaction_id)
        group = q.producer_group_get(conn, stored.msg.producer_group) or ProducerGroup(stored.msg.producer_group)
        return HalfMessageDetail(stored, group, q.half_checks(conn, transaction_id))


def list_half_messages(
    broker: Broker, state: str | None = None, producer_group: str | None = None, after: str | None = None, limit: int = 100
) -> list[StoredHalfMessage]:
    if state is not None and state not in {s.value for s in HalfState}:
        raise TxlogError(ErrorCode.INVALID_REQUEST, f"Unknown state {state!r}: one of Prepared, Committed, RolledBack")
    with broker.db.read() as conn:
        return q.half_messages_page(conn, state, producer_group, after, limit)


@dataclass(frozen=True)
class HalfMessagesPage:
    items: list[tuple[StoredHalfMessage, list[CheckRecord]]]
    counts: dict[str, int]
    next_after: str | None


def half_messages_page(
    broker: Broker, state: str | None, producer_group: str | None, after: str | None, limit: int = 100
) -> HalfMessagesPage:
    """A page of half messages with their check histories, and how many there are in each state
    (the admin pages)."""
    page = list_half_messages(broker, state, producer_group, after, limit)
    with broker.db.read() as conn:
        checks = q.half_checks_of(conn, [x.msg.transaction_id for x in page])
        totals = q.half_message_counts(conn)
    next_after = page[-1].msg.transaction_id if len(page) == limit else None
    return HalfMessagesPage([(x, checks[x.msg.transaction_id]) for x in page], totals, next_after)


def counts(broker: Broker) -> dict[str, int]:
    with broker.db.read() as conn:
        return q.half_message_counts(conn)


# --- the checker ----------------------------------------------------------------------------------


def check_payload(stored: StoredHalfMessage, check_no: int) -> dict[str, Any]:
    """What the check-back endpoint receives: the message itself, as RocketMQ's
    ``checkLocalTransaction(MessageExt)`` does, key, value and headers in the producer's encoding."""
    m, r, enc = stored.msg, stored.record, stored.encoding
    return {
        "transaction_id": m.transaction_id,
        "producer_group": m.producer_group,
        "topic": m.topic,
        "partition": m.partition,
        "encoding": enc,
        "key": encode_bytes(r.key, enc),
        "value": encode_bytes(r.value, enc),
        "headers": headers_object(r.headers),
        "header_list": [{"key": k, "value": encode_bytes(v, enc)} for k, v in r.headers],
        "timestamp_ms": m.created_at_ms,
        "check_count": check_no,
    }


def ask_producer_group(
    http: httpx.Client, url: str | None, payload: dict[str, Any], allowed_hosts: str, timeout_ms: int
) -> tuple[LocalTransactionState | None, str | None]:
    """POST one check-back; its answer, or why there is none (no endpoint, a refused URL, a refused
    connection, no answer in time, an HTTP error, an unreadable answer). Never raises; the whole
    call — connect, send, answer — is bounded by ``timeout_ms``."""
    if url is None:
        return None, "the producer group has no check-back endpoint (PUT /v1/producer-groups/{group})"
    problem = hm.check_url_problem(url, allowed_hosts)
    if problem:
        return None, f"check-back URL refused: {problem}"
    deadline = time.monotonic() + timeout_ms / 1000
    try:
        with http.stream(
            "POST",
            url,
            content=orjson.dumps(payload),
            headers={"content-type": "application/json"},
            timeout=httpx.Timeout(timeout_ms / 1000),
        ) as response:
            body = bytearray()
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > MAX_ANSWER_BYTES:
                    return None, f"the answer is longer than {MAX_ANSWER_BYTES} bytes"
                if time.monotonic() > deadline:
                    return None, f"no complete answer within {timeout_ms} ms"
        if response.status_code != 200:
            return None, f"HTTP {response.status_code}: {bytes(body[:200]).decode('utf-8', 'replace')}"
        return hm.read_check_answer(orjson.loads(bytes(body))), None
    except httpx.TimeoutException:
        return None, f"no answer within {timeout_ms} ms"
    except httpx.HTTPError as exc:
        return None, f"{type(exc).__name__}: {exc}"
    except orjson.JSONDecodeError as exc:
        return None, f"the answer is not JSON ({exc})"
    except hm.BadAnswer as exc:
        return None, f"unreadable answer: {exc}"


@dataclass
class CheckReport(RoundReport):
    checked: int = 0
    committed: int = 0
    rolled_back: int = 0
    undecided: int = 0
    failed: int = 0
    forgotten: int = 0
    more_due: bool = False


@dataclass(frozen=True)
class _Claimed:
    stored: StoredHalfMessage
    group: ProducerGroup
    check_no: int


def _claim_due(
    broker: Broker,
    limit: int,
    report: CheckReport,
    channel: hm.CheckChannel = hm.CheckChannel.HTTP,
    producer_groups: list[str] | None = None,
    due_for_ms: int = 0,
) -> list[_Claimed]:
    """One short database transaction: claim the half messages of one check channel (of the
    producer groups named, if any) due for at least ``due_for_ms``, count and record their checks
    (leasing each for one check interval), and roll back those past max_checks."""
    claimed = []
    now = broker.now()
    with broker.db.transaction() as conn:
        due = q.half_messages_due(conn, now - due_for_ms, limit, channel, producer_groups)
        report.more_due = len(due) >= limit
        for stored, group in due:
            group = group or ProducerGroup(stored.msg.producer_group)
            action = hm.claim(stored.msg, group, now)
            if isinstance(action, hm.GiveUp):
                decision = hm.decide(stored.msg, HalfState.ROLLED_BACK, DecidedBy.MAX_CHECKS, now, action.reason)
                assert isinstance(decision, Decided)
                _apply(conn, broker, stored, decision)
                report.rolled_back += 1
                log.info("rolled back half message %s: %s", stored.msg.transaction_id, action.reason)
            elif isinstance(action, hm.Deliver):
                decision = hm.decide(stored.msg, HalfState.COMMITTED, DecidedBy.DELIVERY_TIME, now, "its delivery time came")
                assert isinstance(decision, Decided)
                _apply(conn, broker, stored, decision)
                report.committed += 1
            elif isinstance(action, hm.Check):
                q.half_check_start(conn, stored.msg.transaction_id, action.check_no, action.lease_until_ms, now, group.check_url)
                claimed.append(_Claimed(stored, group, action.check_no))
    return claimed


def _record_check(broker: Broker, c: _Claimed, answer: LocalTransactionState | None, problem: str | None) -> str:
    """Apply a check-back's outcome to the half message as it is now (its row locked); what it did:
    ``committed``, ``rolled_back``, ``undecided`` or ``ignored`` (decided meanwhile)."""
    tid = c.stored.msg.transaction_id
    with broker.db.transaction() as conn:
        stored = q.half_message_get(conn, tid, for_update=True)
        if stored is None:  # forgotten meanwhile
            return "ignored"
        kind = _apply_check(conn, broker, stored, c.group, c.check_no, answer, problem)
    faults.crash_point(faults.SERVER_CRASH_ENV, "half_message_checked")
    return kind


def _apply_check(
    conn: Connection,
    broker: Broker,
    stored: StoredHalfMessage,
    group: ProducerGroup,
    check_no: int,
    answer: LocalTransactionState | None,
    problem: str | None,
) -> str:
    """``_record_check``'s work in the caller's transaction, the half message's row locked."""
    tid = stored.msg.transaction_id
    now = broker.now()
    decision = hm.after_check(stored.msg, group, check_no, answer, problem, now)
    if isinstance(decision, Decided):
        decided = _apply(conn, broker, stored, decision)
        if decided.state is HalfState.COMMITTED:
            kind, outcome = "committed", f"Committed at offset {decided.offset}"
        else:
            kind = "rolled_back"
            outcome = "RolledBack" + (f": {decided.reason}" if decision.by is DecidedBy.MAX_CHECKS else "")
    elif decision is None and not stored.msg.state.is_decided:
        kind, outcome = "undecided", f"no decision; check {check_no} of {group.max_checks}"
    else:
        kind, outcome = "ignored", f"ignored: already {stored.msg.state.value}"
    q.half_check_finish(conn, tid, check_no, now, answer.value if answer else None, problem, outcome)
    return kind


# --- check-backs sent by a RocketMQ gateway ------------------------------------------------------


@dataclass(frozen=True)
class ClaimedCheck:
    """A check-back a RocketMQ gateway claimed: counted and leased, to be sent to a live producer
    of ``stored``'s group (or released, ``release_check``, if there is none)."""

    stored: StoredHalfMessage
    check_no: int


def claim_checks(broker: Broker, producer_groups: list[str], limit: int) -> tuple[list[ClaimedCheck], CheckReport]:
    """Claim the due check-backs of the ``rocketmq`` channel's half messages of the producer groups
    given (those with a live producer where the caller runs), as the HTTP checker claims its own:
    one slot, one claim, however many gateways ask at once. Half messages past max_checks are
    rolled back here, as there."""
    report = CheckReport()
    claimed = _claim_due(broker, limit, report, hm.CheckChannel.ROCKETMQ, producer_groups)
    report.checked = len(claimed)
    return [ClaimedCheck(c.stored, c.check_no) for c in claimed], report


def count_orphaned_checks(broker: Broker, grace_ms: int, limit: int) -> CheckReport:
    """The ``rocketmq`` channel's check-backs that no gateway with a live producer of their group
    claimed within ``grace_ms`` of falling due: counted as checks sent to nobody, as a RocketMQ
    broker counts a check it found no producer channel for, so that a half message whose
    producers are all gone is rolled back after max_checks like any other (``rolled_back``), not
    left undecided. ``checked``: the checks counted so."""
    report = CheckReport()
    report.checked = len(_claim_due(broker, limit, report, hm.CheckChannel.ROCKETMQ, due_for_ms=grace_ms))
    return report


def deliver_due(broker: Broker, limit: int) -> CheckReport:
    """Commit the delayed messages whose delivery time came (up to ``limit``, the earliest first),
    claimed as check-backs are: a message is delivered once, by one server, however many run this
    at once. ``committed`` counts them; ``more_due``: more were due than taken."""
    report = CheckReport()
    _claim_due(broker, limit, report, hm.CheckChannel.DELAY)
    return report


def release_check(broker: Broker, transaction_id: str, check_no: int) -> bool:
    """A claimed check-back that could not be sent (its producer left meanwhile): not counted, due
    again after one poll interval, for whichever gateway has a producer of the group then."""
    retry_at = broker.now() + broker.settings.half_check_poll_interval_ms
    with broker.db.transaction() as conn:
        return q.half_check_release(conn, transaction_id, check_no, retry_at)


def answer_check(broker: Broker, transaction_id: str, answer: LocalTransactionState) -> str:
    """A producer's answer to the latest check-back of a half message (RocketMQ's EndTransaction
    from SOURCE_SERVER_CHECK), applied as an HTTP check-back's answer is: ``committed``,
    ``rolled_back`` or ``undecided``; for a half message decided already, nothing, and ``late``
    when the decision came after the latest check was sent (an answer overtaken by another
    check's or by the producer's own), ``unexpected`` when no check was sent while it was
    undecided (a check nobody should have sent). The check's record keeps the answer that counted."""
    hm.validate_transaction_id(transaction_id)
    with broker.db.transaction() as conn:
        stored = q.half_message_get(conn, transaction_id, for_update=True)
        if stored is None:
            raise _not_found(transaction_id)
        if stored.msg.check_count == 0:
            return "unexpected"
        if stored.msg.state.is_decided:
            checks = q.half_checks(conn, transaction_id)
            decided_at = stored.msg.decided_at_ms or 0
            return "late" if checks and checks[-1].started_at_ms <= decided_at else "unexpected"
        group = q.producer_group_get(conn, stored.msg.producer_group) or ProducerGroup(stored.msg.producer_group)
        return _apply_check(conn, broker, stored, group, stored.msg.check_count, answer, None)


def check_round(broker: Broker, http: httpx.Client, pool: ThreadPoolExecutor, limit: int | None = None) -> CheckReport:
    """Claim the due half messages (up to ``limit``), ask their producer groups concurrently, apply
    the answers. One that fails is logged and left for its next check."""
    report = CheckReport()
    settings = broker.settings
    claimed = _claim_due(broker, limit or settings.half_check_concurrency * 4, report)

    def one(c: _Claimed) -> str:
        answer, problem = ask_producer_group(
            http,
            c.group.check_url,
            check_payload(c.stored, c.check_no),
            settings.half_check_allowed_hosts,
            settings.half_check_timeout_ms,
        )
        return _record_check(broker, c, answer, problem)

    futures = [pool.submit(one, c) for c in claimed]
    for c, f in zip(claimed, futures):
        report.checked += 1
        try:
            kind = f.result()
            if kind != "ignored":
                setattr(report, kind, getattr(report, kind) + 1)
        except Exception as exc:  # one bad item does not end the round
            report.failed += 1
            log.warning("check-back %d of half message %s failed: %s", c.check_no, c.stored.msg.transaction_id, exc)
    return report


def forget_decided(broker: Broker) -> int:
    """Decided half messages older than ``TXLOG_HALF_MESSAGE_RETENTION_MS`` are deleted, with their
    checks (a commit or rollback repeated after that is TRANSACTIONAL_ID_NOT_FOUND)."""
    before = broker.now() - broker.settings.half_message_retention_ms
    total = 0
    while True:
        with broker.db.transaction() as conn:
            n = q.half_messages_forget(conn, before, BATCH_ROWS)
        total += n
        if n < BATCH_ROWS:
            return total


def new_http_client() -> httpx.Client:
    """The checker's HTTP client: no redirects followed (the URL was checked, not where it points
    to), no proxies from the environment."""
    return httpx.Client(follow_redirects=False, trust_env=False)


class CheckerThread(threading.Thread):
    """Runs ``check_round`` every ``TXLOG_HALF_CHECK_POLL_INTERVAL_MS`` (at once again after a round
    that found more due than it took), and forgets old decided half messages once a minute.
    ``totals`` adds up its rounds' reports."""

    def __init__(self, broker: Broker) -> None:
        super().__init__(name="txlog-half-checker", daemon=True)
        self.broker = broker
        self.totals = CheckReport()
        self._stop_event = threading.Event()

    def run(self) -> None:
        interval = self.broker.settings.half_check_poll_interval_ms / 1000
        next_forget = 0.0
        with (
            new_http_client() as http,
            ThreadPoolExecutor(self.broker.settings.half_check_concurrency, "txlog-check-back") as pool,
        ):
            while not self._stop_event.is_set():
                report = None
                try:
                    report = check_round(self.broker, http, pool)
                    delivered = deliver_due(self.broker, self.broker.settings.half_check_concurrency * 4)
                    report.more_due = report.more_due or delivered.more_due
                    report.add(delivered)
                    self.totals.add(report)
                    if time.monotonic() >= next_forget:
                        self.totals.forgotten += forget_decided(self.broker)
                        next_forget = time.monotonic() + 60
                except Exception as exc:  # the database is away, say: the next round tries again
                    log.warning("half message check round failed: %s", exc)
                if report is None or not report.more_due:
                    self._stop_event.wait(interval)

    def stop(self) -> None:
        self._stop_event.set()
