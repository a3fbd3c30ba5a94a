"""DatabaseClock without a database: a scripted database clock and a hand-moved monotonic clock.
It follows the database, carries its reading forward between resyncs, never goes backwards,
keeps counting while the database is away, and asks the database once per resync however many
threads read it."""

from __future__ import annotations

import threading

import pytest

from app.errors import ErrorCode, TxlogError
from app.storage.db import DatabaseClock

DB_START = 1_700_000_000_000


class Scripted(DatabaseClock):
    """The database's clock is ``db_ms`` at monotonic time ``mono``; ``away`` makes readings fail."""

    def __init__(self, resync_s: float = 10.0, retry_s: float = 1.0) -> None:
        self.mono = 100.0
        self.db_ms = DB_START
        self.db_base_mono = self.mono
        self.away = False
        self.reads = 0
        super().__init__(db=None, resync_s=resync_s, retry_s=retry_s, monotonic=lambda: self.mono)  # type: ignore[arg-type]

    def read_database_ms(self) -> int:
        self.reads += 1
        if self.away:
            raise ConnectionError("connection refused")
        return self.db_ms + int((self.mono - self.db_base_mono) * 1000)

    def tick(self, seconds: float) -> None:
        self.mono += seconds

    def set_database(self, ms: int) -> None:
        """The database's clock is stepped (NTP, an operator) to ``ms`` now."""
        self.db_ms, self.db_base_mono = ms, self.mono


def test_it_reads_the_database_and_carries_the_reading_forward():
    c = Scripted()
    assert c() == DB_START
    c.tick(2.5)
    assert c() == DB_START + 2_500
    assert c.reads == 1  # no round trip per call


def test_it_follows_the_database_at_each_resync():
    c = Scripted(resync_s=10)
    c()
    c.tick(5)
    c.set_database(DB_START + 5_000 + 700)  # the database's clock is 0.7 s ahead of our count
    assert c() == DB_START + 5_000  # not asked yet
    c.tick(5)
    assert c() == DB_START + 10_700
    assert c.reads == 2


def test_it_never_goes_backwards_and_waits_for_a_database_clock_that_stepped_back():
    c = Scripted(resync_s=1)
    c()
    c.tick(3)
    assert c() == DB_START + 3_000
    c.set_database(DB_START + 1_000)  # stepped back 2 s
    c.tick(1)
    readings = []
    for _ in range(30):
        readings.append(c())
        c.tick(0.1)
    assert readings == sorted(readings)
    assert readings[0] == DB_START + 3_000  # held until the database's clock catches up
    assert abs(readings[-1] - (DB_START + 1_000 + 3_900)) <= 2  # then follows it again


def test_it_keeps_counting_while_the_database_is_away_and_resyncs_when_it_is_back():
    c = Scripted(resync_s=1, retry_s=0.5)
    c()
    c.away = True
    for _ in range(20):
        c.tick(0.25)
        assert c() == DB_START + int((c.mono - 100.0) * 1000)
    assert c.reads == 1 + 9  # due at 1 s, then one try per retry interval up to 5 s: not one per call
    c.away = False
    c.set_database(DB_START + 60_000)
    c.tick(0.5)
    assert c() == DB_START + 60_000 + 500


def test_without_any_reading_it_is_coordinator_not_available_until_the_database_answers():
    c = Scripted(retry_s=1)
    c.away = True
    for _ in range(5):
        with pytest.raises(TxlogError) as info:
            c()
        assert info.value.code is ErrorCode.COORDINATOR_NOT_AVAILABLE and "connection refused" in info.value.message
    assert c.reads == 1  # the next try waits for the retry interval
    c.away = False
    c.tick(1)
    assert c() == DB_START + 1_000


def test_a_slow_reading_holds_up_no_other_caller():
    c = Scripted(resync_s=1)
    c()
    entered, release = threading.Event(), threading.Event()
    plain_read = c.read_database_ms

    def slow_read() -> int:
        entered.set()
        assert release.wait(10)
        return plain_read()

    c.read_database_ms = slow_read  # type: ignore[method-assign]
    c.tick(1.5)
    resync = threading.Thread(target=c)
    resync.start()
    assert entered.wait(10)
    assert c() == DB_START + 1_500  # answered from the last reading while the other thread waits
    release.set()
    resync.join(10)
    assert c.reads == 2
