"""The fault suites' checker on small histories made by hand: a clean one passes, and each anomaly,
planted alone, is counted under its name and nothing else is."""

from __future__ import annotations

import pytest

from tests.chaos.checker import ANOMALIES, Copier, History, Poll, check, summary


def clean() -> History:
    """p wrote a0..a3 to "in" (two partitions); a copier copied them upper-cased to "out"; consumer c
    read "out" to the end in one session, and "in" up to a3."""
    return History(
        acked={"p": {"a0": ("in", 0, 0), "a1": ("in", 1, 0), "a2": ("in", 0, 1), "a3": ("in", 1, 2)}},
        produced={"p": 4},
        # in-1@1 is an aborted record; out-0@1 is a transaction marker: offsets are not dense.
        log={
            ("in", 0): [(0, "a0"), (1, "a2")],
            ("in", 1): [(0, "a1"), (2, "a3")],
            ("out", 0): [(0, "A0"), (2, "A2")],
            ("out", 1): [(0, "A1"), (1, "A3")],
        },
        aborted={("in", 1, 1)},
        copiers=[Copier("t", "in", "out", {0: 2, 1: 3}, lambda _p, _o, v: v.upper(), committed=3, aborted=1)],
        polls={
            "c": [
                [
                    Poll("out", 0, 0, "A0"),
                    Poll("out", 1, 0, "A1"),
                    Poll("out", 0, 2, "A2"),
                    Poll("out", 1, 1, "A3"),
                    Poll("in", 1, 0, "a1"),
                    Poll("in", 1, 2, "a3"),
                ]
            ]
        },
        followed={"c": {"out"}},
        faults=[(1.5, "kill -9 gateway 1")],
    )


def only(h: History, anomaly: str) -> None:
    result = check(h)
    assert result.counts[anomaly] >= 1, result.report()
    assert {k for k, v in result.counts.items() if v} == {anomaly}, result.report()
    assert anomaly in summary(h, result)


def test_a_clean_history_has_no_anomaly() -> None:
    h = clean()
    result = check(h)
    assert result.ok(), result.report()
    text = summary(h, result)
    for name in ANOMALIES:
        assert f"  {name}: 0" in text
    assert "kill -9 gateway 1" in text and "3 transactions committed, 1 aborted" in text


def test_lost_write_an_acknowledged_value_not_in_the_log() -> None:
    h = clean()
    h.acked["p"]["a4"] = ("in", 0, 2)
    only(h, "lost write")


def test_lost_write_a_copy_missing_below_the_committed_offset() -> None:
    h = clean()
    h.log[("out", 1)] = [(0, "A1")]
    h.polls["c"][0] = [p for p in h.polls["c"][0] if p.value != "A3"]
    only(h, "lost write")


def test_duplicate_a_value_at_two_offsets() -> None:
    h = clean()
    h.log[("in", 0)].append((3, "a2"))
    only(h, "duplicate")


def test_aborted_read_a_record_of_an_aborted_transaction_polled() -> None:
    h = clean()
    h.polls["c"][0].insert(5, Poll("in", 1, 1, "x"))
    only(h, "aborted read")


def test_poll_skip_a_committed_offset_passed_over() -> None:
    h = clean()
    # d read out-0 at 0 then 2, past A9 at 1 (c read it); in-1's 0 then 2 is no skip: 1 is aborted.
    h.log[("out", 0)] = [(0, "A0"), (1, "A9"), (2, "A2")]
    h.polls["c"][0].insert(1, Poll("out", 0, 1, "A9"))
    h.polls["d"] = [[Poll("out", 0, 0, "A0"), Poll("out", 0, 2, "A2"), Poll("in", 1, 0, "a1"), Poll("in", 1, 2, "a3")]]
    only(h, "poll skip")


def test_non_monotonic_poll_offsets_back_within_a_session() -> None:
    h = clean()
    h.polls["c"][0].append(Poll("out", 0, 0, "A0"))
    only(h, "non-monotonic poll")


def test_a_new_session_may_start_again_from_an_earlier_offset() -> None:
    h = clean()
    h.polls["c"].append([Poll("out", 0, 0, "A0"), Poll("out", 0, 2, "A2")])
    assert check(h).ok()


def test_inconsistent_offsets_two_reads_of_one_offset_disagree() -> None:
    h = clean()
    h.polls["d"] = [[Poll("out", 0, 0, "A0"), Poll("out", 0, 2, "A0-bis")]]
    only(h, "inconsistent offsets")


def test_inconsistent_offsets_acknowledged_at_another_offset() -> None:
    h = clean()
    h.acked["p"]["a2"] = ("in", 0, 0)
    only(h, "inconsistent offsets")


def test_an_acknowledgement_without_an_offset_holds_if_the_record_is_in_that_partition() -> None:
    h = clean()
    h.acked["p"]["a2"] = ("in", 0, None)
    assert check(h).ok()


def test_inconsistent_offsets_acknowledged_without_an_offset_in_another_partition() -> None:
    h = clean()
    h.acked["p"]["a2"] = ("in", 1, None)
    only(h, "inconsistent offsets")


def test_unseen_a_committed_value_a_consumer_that_ran_to_the_end_never_polled() -> None:
    h = clean()
    h.polls["c"][0] = [p for p in h.polls["c"][0] if p.value != "A3"]
    only(h, "unseen")


@pytest.mark.parametrize("anomaly", ANOMALIES)
def test_every_anomaly_is_planted_by_a_test_here(anomaly: str) -> None:
    names = [n for n in globals() if n.startswith("test_")]
    assert any(n.startswith("test_" + anomaly.replace(" ", "_").replace("-", "_")) for n in names)
