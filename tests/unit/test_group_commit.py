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


@pytest.mark.parametrize("leaders,max_items", [(1, 4), (2, 16), (3, 1)])
def test_concurrent_callers_each_get_their_own_outcome_after_their_group(leaders: int, max_items: int) -> None:
    running = threading.Semaphore(leaders)
    ran: set[tuple[int, int]] = set()
    sizes: list[int] = []

    def run(group):  # type: ignore[no-untyped-def]
        assert running.acquire(blocking=False), "more groups at once than leaders"
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

    outcomes = _hammer(GroupCommit(run, leaders=leaders, max_items=max_items), callers=8, per_caller=60)
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

    outcomes = _hammer(GroupCommit(run, leaders=2, max_items=3), callers=6, per_caller=40)
    assert len(outcomes) == 240
    failed = [k for k, o in outcomes.items() if isinstance(o, ValueError)]
    assert all(o == "decided" for k, o in outcomes.items() if k not in failed)


def test_undecided_items_fail_rather_than_hang() -> None:
    gc: GroupCommit[int, int] = GroupCommit(lambda group: None)
    with pytest.raises(RuntimeError, match="undecided"):
        gc.submit(1)
    # the leader's place was given back
    gc2: GroupCommit[int, int] = GroupCommit(lambda group: [p.resolve(1) for p in group], leaders=1)
    assert gc2.submit(1) == 1 and gc2.submit(2) == 1


def test_pending_outcome() -> None:
    p: Pending[int, str] = Pending(1)
    p.fail(ValueError())
    p.resolve("x")
    assert (p.done, p.result, p.error) == (True, "x", None)
    p.reopen()
    assert (p.done, p.result, p.error) == (False, None, None)
