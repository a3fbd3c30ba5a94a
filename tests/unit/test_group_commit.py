"""GroupCommit without a database: every caller gets its own outcome, only once its group ran;
groups are bounded; the lead passes on and is never lost; a failing group fails only its callers."""

from __future__ import annotations

import random
import threading
import time

import pytest

from app.services.group_commit import GroupCommit, Pending


def test_one_caller_at_a_time_runs_alone() -> None:
    groups: list[list[int]] = []

    def run(group):  # type: ignore[no-untyped-def]
        groups.append([p.item for p in group])
        for p in group:
            p.resolve(p.item * 10)

    gc: GroupCommit[int, int] = GroupCommit(run)
    assert [gc.submit(i) for i in range(5)] == [0, 10, 20, 30, 40]
    assert groups == [[0], [1], [2], [3], [4]]


def _hammer(gc: GroupCommit, callers: int, per_caller: int) -> dict[tuple[int, int], object]:  # type: ignore[type-arg]
    outcomes: dict[tuple[int, int], object] = {}
    errors: list[BaseException] = []

    def caller(c: int) -> None:
        for i in range(per_caller):
            try:
                outcomes[(c, i)] = gc.submit((c, i))
            except ValueError as exc:
                outcomes[(c, i)] = exc
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

    threads = [threading.Thread(target=caller, args=(c,)) for c in range(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a caller never got its outcome"
    assert not errors
    return outcomes


@pytest.mark.parametrize("senders,max_items", [(1, 4), (2, 16), (3, 1)])
def test_concurrent_callers_each_get_their_own_outcome_after_their_group(senders: int, max_items: int) -> None:
    running = threading.Semaphore(senders)
    ran: set[tuple[int, int]] = set()
    sizes: list[int] = []

    def run(group):  # type: ignore[no-untyped-def]
        assert running.acquire(blocking=False), "more groups at once than senders"
        try:
            sizes.append(len(group))
            assert len(group) <= max_items
            time.sleep(random.random() / 500)
            for p in group:
                assert p.item not in ran, "an item ran twice"
                ran.add(p.item)
                c, i = p.item
                if (c + i) % 7 == 0:
                    p.fail(ValueError(p.item))
                else:
                    p.resolve((c, i, "done"))
        finally:
            running.release()

    outcomes = _hammer(GroupCommit(run, senders=senders, max_items=max_items), callers=8, per_caller=60)
    assert len(outcomes) == 8 * 60 == len(ran)
    for (c, i), outcome in outcomes.items():
        if (c + i) % 7 == 0:
            assert isinstance(outcome, ValueError) and outcome.args == ((c, i),)
        else:
            assert outcome == (c, i, "done")
    if max_items > 1:
        assert max(sizes) > 1, "concurrent callers were never grouped"


def test_an_exception_of_the_group_fails_its_undecided_callers_and_the_lead_goes_on() -> None:
    def run(group):  # type: ignore[no-untyped-def]
        group[0].resolve("decided")
        if any(p.item[1] % 3 == 0 for p in group[1:]):
            raise ValueError("the group failed")
        for p in group[1:]:
            p.resolve("decided")

    outcomes = _hammer(GroupCommit(run, senders=2, max_items=3), callers=6, per_caller=40)
    assert len(outcomes) == 240
    failed = [k for k, o in outcomes.items() if isinstance(o, ValueError)]
    assert all(o == "decided" for k, o in outcomes.items() if k not in failed)


def test_undecided_items_fail_rather_than_hang() -> None:
    gc: GroupCommit[int, int] = GroupCommit(lambda group: None)
    with pytest.raises(RuntimeError, match="undecided"):
        gc.submit(1)
    # the leader's place was given back
    gc2: GroupCommit[int, int] = GroupCommit(lambda group: [p.resolve(1) for p in group], senders=1)
    assert gc2.submit(1) == 1 and gc2.submit(2) == 1


def test_pending_outcome() -> None:
    p: Pending[int, str] = Pending(1)
    p.fail(ValueError())
    p.resolve("x")
    assert (p.done, p.result, p.error) == (True, "x", None)
    p.reopen()
    assert (p.done, p.result, p.error) == (False, None, None)


def test_items_of_one_key_never_share_a_group_and_keep_their_order() -> None:
    seen: list[list[tuple[int, int]]] = []

    def run(group):  # type: ignore[no-untyped-def]
        seen.append([p.item for p in group])
        time.sleep(random.random() / 1000)
        for p in group:
            p.resolve(p.item)

    gc: GroupCommit[tuple[int, int], tuple[int, int]] = GroupCommit(run, senders=2, max_items=8)
    done: dict[int, list[int]] = {k: [] for k in range(3)}

    def caller(c: int) -> None:
        for i in range(40):
            key, _ = gc.submit((c % 3, i), key=c % 3)
            done[key].append(i)

    threads = [threading.Thread(target=caller, args=(c,)) for c in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert all(len({k for k, _ in group}) == len(group) for group in seen), "two items of one key in a group"
    assert max(len(group) for group in seen) > 1
    assert sum(len(group) for group in seen) == 240


def test_the_loops_group_commit_groups_waiters_and_a_cancelled_waiter_leaves() -> None:
    import asyncio

    from app.services.group_commit import LoopGroupCommit

    groups: list[list[int]] = []

    async def run(group):  # type: ignore[no-untyped-def]
        groups.append([p.item for p in group])
        await asyncio.sleep(0.01)
        for p in group:
            p.resolve(p.item * 10)

    async def main() -> tuple[list[object], list[int]]:
        gc: LoopGroupCommit[int, int] = LoopGroupCommit(run, senders=1, max_items=4)
        tasks = [asyncio.create_task(gc.submit(i, key=i % 5)) for i in range(10)]
        await asyncio.sleep(0)  # every task has arrived: 0 sends, the others wait
        tasks[3].cancel()
        got = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
        after = await asyncio.wait_for(gc.submit(99), 30)  # the sender's place was handed back
        return got, [after]

    got, after = asyncio.run(main())
    assert isinstance(got[3], asyncio.CancelledError)
    assert [g for i, g in enumerate(got) if i != 3] == [i * 10 for i in range(10) if i != 3]
    assert after == [990]
    assert 3 not in [i for group in groups for i in group]
    assert all(len({i % 5 for i in group}) == len(group) <= 4 for group in groups[:-1])
    assert groups[0] == [0] and max(len(g) for g in groups) > 1
