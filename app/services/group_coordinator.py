"""The consumer-group coordinator's moving parts: groups in memory, parked JoinGroup/SyncGroup
requests, timers.

Every decision is made by the pure state machine in ``app.domain.groups.coordinator``; this class only keeps
its results and carries out its effects in order: a parked request becomes an asyncio future, an
answer resolves it, a timer is a ``loop.call_later`` handle that calls ``coordinator.on_timer`` when its
deadline passes. One gateway owns a group (the one FindCoordinator names); its groups live here and
are lost when it stops — members then rejoin, as they do when Kafka moves a group to another
coordinator. Offsets are not here: they are committed to PostgreSQL by the services, after
``check_offset_commit``.

All methods run on the gateway's event loop; none blocks or does I/O. Nothing here knows the wire.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any, Callable, Collection, Iterable, Sequence

from app.config import Settings
from app.domain.groups import coordinator, describe
from app.domain.groups.describe import GroupDescription, GroupListing
from app.domain.groups.state import (
    AnswerJoin,
    AnswerSync,
    ArmTimer,
    CancelTimer,
    Group,
    GroupConfig,
    GroupState,
    JoinRequest,
    JoinResult,
    LeaveAnswer,
    Outcome,
    Park,
    SyncRequest,
    SyncResult,
    Timer,
    Waiting,
    join_error,
    sync_error,
)
from app.errors import ErrorCode

log = logging.getLogger(__name__)


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class GroupCoordinator:
    """The classic consumer groups this gateway coordinates.

    ``owns(group_id)`` says whether this gateway is the group's coordinator (default: every group);
    requests for other groups get NOT_COORDINATOR. ``clock`` gives epoch milliseconds and
    ``unique`` the unique part of new member ids; tests replace both.
    """

    def __init__(
        self,
        config: GroupConfig | None = None,
        *,
        owns: Callable[[str], bool] | None = None,
        clock: Callable[[], int] = wall_clock_ms,
        unique: Callable[[], str] = lambda: str(uuid.uuid4()),
    ) -> None:
        self.config = config or GroupConfig()
        self._owns = owns or (lambda group_id: True)
        self._clock = clock
        self._unique = unique
        self._groups: dict[str, Group] = {}
        self._parked: dict[tuple[str, Waiting, str], asyncio.Future[JoinResult | SyncResult]] = {}
        self._timers: dict[tuple[str, Timer], asyncio.TimerHandle] = {}
        self._closed = False

    @classmethod
    def from_settings(cls, settings: Settings, **kwargs: Any) -> GroupCoordinator:
        config = GroupConfig(
            min_session_timeout_ms=settings.kafka_group_min_session_timeout_ms,
            max_session_timeout_ms=settings.kafka_group_max_session_timeout_ms,
            initial_rebalance_delay_ms=settings.kafka_group_initial_rebalance_delay_ms,
            max_size=settings.kafka_group_max_size,
        )
        return cls(config, **kwargs)

    # --- requests -------------------------------------------------------------------------------

    async def join_group(
        self,
        group_id: str,
        member_id: str,
        group_instance_id: str | None,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocol_type: str,
        protocols: Sequence[tuple[str, bytes]],
        *,
        client_id: str = "",
        client_host: str = "",
        require_known_member_id: bool = True,
        supports_skip_assignment: bool = False,
    ) -> JoinResult:
        """JoinGroup; waits until the join phase ends (or answers at once)."""
        error = self._refusal(group_id)
        if error is not None:
            return join_error(member_id, error)
        request = JoinRequest(
            member_id,
            group_instance_id,
            session_timeout_ms,
            rebalance_timeout_ms,
            protocol_type,
            tuple((name, bytes(meta)) for name, meta in protocols),
            client_id,
            client_host,
            require_known_member_id,
            supports_skip_assignment,
        )
        outcome = coordinator.join(self._groups.get(group_id), group_id, request, self._unique(), self._clock(), self.config)
        return await self._reply(group_id, outcome)  # type: ignore[return-value]  # the outcome of this event carries this reply type

    async def sync_group(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        protocol_type: str | None,
        protocol_name: str | None,
        assignments: Sequence[tuple[str, bytes]],
    ) -> SyncResult:
        """SyncGroup; a follower waits for the leader's assignment."""
        error = self._refusal(group_id)
        if error is not None:
            return sync_error(error)
        request = SyncRequest(
            generation_id,
            member_id,
            group_instance_id,
            protocol_type,
            protocol_name,
            tuple((mid, bytes(assignment)) for mid, assignment in assignments),
        )
        outcome = coordinator.sync(self._groups.get(group_id), request, self._clock(), self.config)
        return await self._reply(group_id, outcome)  # type: ignore[return-value]  # the outcome of this event carries this reply type

    def heartbeat(self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None) -> ErrorCode | None:
        error = self._refusal(group_id)
        if error is not None:
            return error
        outcome = coordinator.heartbeat(self._groups.get(group_id), generation_id, member_id, group_instance_id, self._clock())
        self._apply(group_id, outcome)
        return outcome.reply  # type: ignore[return-value]  # the outcome of this event carries this reply type

    def leave_group(self, group_id: str, members: Sequence[tuple[str, str | None]]) -> LeaveAnswer:
        """LeaveGroup for (member id, group instance id) pairs."""
        error = self._refusal(group_id)
        if error is not None:
            return LeaveAnswer(error, ())
        outcome = coordinator.leave(self._groups.get(group_id), members, self._clock(), self.config)
        self._apply(group_id, outcome)
        return outcome.reply  # type: ignore[return-value]  # the outcome of this event carries this reply type

    def check_offset_commit(
        self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None, transactional: bool
    ) -> ErrorCode | None:
        """May this OffsetCommit (``transactional``: TxnOffsetCommit) commit? None if so; see
        ``app.domain.groups.coordinator.offset_commit``."""
        error = self._refusal(group_id)
        if error is not None:
            return error
        outcome = coordinator.offset_commit(
            self._groups.get(group_id), generation_id, member_id, group_instance_id, transactional, self._clock()
        )
        self._apply(group_id, outcome)
        return outcome.reply  # type: ignore[return-value]  # the outcome of this event carries this reply type

    def check_offset_fetch(self, group_id: str) -> ErrorCode | None:
        """May this gateway answer OffsetFetch for the group? None if so (NOT_COORDINATOR when another
        gateway coordinates it). The offsets themselves are read by the services."""
        return self._refusal(group_id)

    def delete_group(self, group_id: str) -> ErrorCode | None:
        """DeleteGroups' part here (the committed offsets are the services'): only an Empty group."""
        error = self._refusal(group_id)
        if error is not None:
            return error
        outcome = coordinator.delete(self._groups.get(group_id), self._clock())
        self._apply(group_id, outcome)
        return outcome.reply  # type: ignore[return-value]  # the outcome of this event carries this reply type

    def offset_delete(self, group_id: str, topics: Iterable[str], with_offsets: bool) -> tuple[ErrorCode | None, frozenset[str]]:
        """OffsetDelete's part here (``coordinator.offset_delete``): the refusal, or the topics
        whose offsets stay; the offsets themselves are the services'."""
        error = self._refusal(group_id)
        if error is not None:
            return error, frozenset()
        return coordinator.offset_delete(self._groups.get(group_id), topics, with_offsets)

    def describe_groups(self, group_ids: Iterable[str], with_offsets: Collection[str] = ()) -> list[GroupDescription]:
        """DescribeGroups. A group held nowhere here but with committed offsets (``with_offsets``, the
        services' group ids: a simple consumer's group, or one held before this gateway restarted)
        is an Empty group, as Kafka keeps it."""
        described = []
        for group_id in group_ids:
            error = self._refusal(group_id)
            if error is not None:
                described.append(GroupDescription(group_id, error, "", "", "", ()))
                continue
            group = self._groups.get(group_id)
            if group is None and group_id in with_offsets:
                group = Group(group_id)
            described.append(describe.describe(group_id, group))
        return described

    def list_groups(
        self, states_filter: Iterable[str] = (), types_filter: Iterable[str] = (), with_offsets: Iterable[str] = ()
    ) -> list[GroupListing]:
        """ListGroups: the groups held here, and the groups with committed offsets (``with_offsets``)
        this gateway coordinates but holds no state of, as Empty groups."""
        stored = [] if self._closed else [Group(g) for g in with_offsets if g not in self._groups and self._owns(g)]
        return describe.listing([*self._groups.values(), *stored], states_filter, types_filter)

    def snapshot(self) -> list[dict[str, object]]:
        """Every group and its members as plain data (the admin pages)."""
        return [describe.snapshot(g) for g in self._groups.values()]

    def close(self) -> None:
        """Stops coordinating: parked requests are answered NOT_COORDINATOR, timers cancelled, groups
        forgotten. Later requests get COORDINATOR_NOT_AVAILABLE."""
        self._closed = True
        now = self._clock()
        for group_id, group in list(self._groups.items()):
            self._apply(group_id, coordinator.unload(group, now))
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        for (_, waiting, member_id), future in self._parked.items():  # none: unloading answered them
            if not future.done():
                future.set_result(self._error_result(waiting, member_id, ErrorCode.NOT_COORDINATOR))
        self._parked.clear()
        self._groups.clear()

    def resign(self) -> list[str]:
        """Unloads the groups this gateway no longer owns (after the cluster's nodes changed): their
        parked requests are answered NOT_COORDINATOR and the clients find the new coordinator."""
        now = self._clock()
        moved = [group_id for group_id in self._groups if not self._owns(group_id)]
        for group_id in moved:
            self._apply(group_id, coordinator.unload(self._groups[group_id], now))
        return moved

    # --- carrying out outcomes --------------------------------------------------------------------

    def _refusal(self, group_id: str) -> ErrorCode | None:
        if self._closed:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if not self._owns(group_id):
            return ErrorCode.NOT_COORDINATOR
        return None

    async def _reply(self, group_id: str, outcome: Outcome) -> object:
        future = self._apply(group_id, outcome)
        if future is None:
            return outcome.reply
        return await future

    def _apply(self, group_id: str, outcome: Outcome) -> asyncio.Future[JoinResult | SyncResult] | None:
        """Keeps the group as it became and carries out the effects in order; returns the caller's
        future when the outcome parks it."""
        if outcome.group is None or outcome.group.state is GroupState.DEAD:
            self._groups.pop(group_id, None)
        else:
            self._groups[group_id] = outcome.group
        caller: asyncio.Future[JoinResult | SyncResult] | None = None
        for effect in outcome.effects:
            if isinstance(effect, Park):
                caller = self._park(group_id, effect)
            elif isinstance(effect, AnswerJoin):
                self._resolve(group_id, Waiting.JOIN, effect.member_id, effect.result)
            elif isinstance(effect, AnswerSync):
                self._resolve(group_id, Waiting.SYNC, effect.member_id, effect.result)
            elif isinstance(effect, ArmTimer):
                self._arm(group_id, effect.timer, effect.deadline_ms)
            elif isinstance(effect, CancelTimer):
                handle = self._timers.pop((group_id, effect.timer), None)
                if handle is not None:
                    handle.cancel()
        return caller

    def _park(self, group_id: str, park: Park) -> asyncio.Future[JoinResult | SyncResult]:
        key = (group_id, park.waiting, park.member_id)
        stale = self._parked.pop(key, None)
        if stale is not None and not stale.done():
            # The state machine answers a parked request before parking another for the same member;
            # this cannot happen, but a client must never be left waiting.
            log.error("group %s: member %s parked twice; answering the first", group_id, park.member_id)
            stale.set_result(self._error_result(park.waiting, park.member_id, ErrorCode.UNKNOWN_SERVER_ERROR))
        future: asyncio.Future[JoinResult | SyncResult] = asyncio.get_running_loop().create_future()
        self._parked[key] = future
        return future

    @staticmethod
    def _error_result(waiting: Waiting, member_id: str, error: ErrorCode) -> JoinResult | SyncResult:
        return join_error(member_id, error) if waiting is Waiting.JOIN else sync_error(error)

    def _resolve(self, group_id: str, waiting: Waiting, member_id: str, result: JoinResult | SyncResult) -> None:
        future = self._parked.pop((group_id, waiting, member_id), None)
        if future is not None and not future.done():  # done: its client went away meanwhile
            future.set_result(result)

    def _arm(self, group_id: str, timer: Timer, deadline_ms: int) -> None:
        old = self._timers.pop((group_id, timer), None)
        if old is not None:
            old.cancel()
        delay_s = max(deadline_ms - self._clock(), 0) / 1000
        loop = asyncio.get_running_loop()
        self._timers[(group_id, timer)] = loop.call_later(delay_s, self._fire, group_id, timer, deadline_ms)

    def _fire(self, group_id: str, timer: Timer, deadline_ms: int) -> None:
        self._timers.pop((group_id, timer), None)
        group = self._groups.get(group_id)
        if group is None:
            return
        # The loop's monotonic clock decided the deadline passed; the wall clock may lag a little.
        now = max(self._clock(), deadline_ms)
        try:
            self._apply(group_id, coordinator.on_timer(group, timer, now, self.config))
        except Exception:
            log.exception("group %s: timer %s failed", group_id, timer)
