"""Retention rules (app.domain.retention): where retention moves a partition's log start. The
retention configs themselves are checked with every topic config (test_topic_configs.py)."""

from app.domain.retention import log_start_for_retention

# --- log_start_for_retention ---------------------------------------------------------------------


def test_no_limit_does_not_move_the_log_start():
    assert log_start_for_retention(0, 100, None, None) is None


def test_the_further_of_the_two_limits_wins():
    assert log_start_for_retention(0, 100, 30, None) == 30
    assert log_start_for_retention(0, 100, None, 40) == 40
    assert log_start_for_retention(0, 100, 30, 40) == 40
    assert log_start_for_retention(0, 100, 50, 40) == 50


def test_never_past_the_last_stable_offset():
    assert log_start_for_retention(0, 10, 30, None) == 10
    assert log_start_for_retention(0, 10, None, 1000) == 10
    assert log_start_for_retention(10, 10, 30, 30) is None  # already at the LSO


def test_never_backwards():
    assert log_start_for_retention(50, 100, 30, 40) is None
    assert log_start_for_retention(50, 100, 50, None) is None
    assert log_start_for_retention(50, 100, 51, None) == 51
    assert log_start_for_retention(50, 40, 60, None) is None  # an LSO below the log start never moves it back
