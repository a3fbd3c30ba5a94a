"""One function per protocol operation. Each opens the database transactions it needs; routes and
admin pages call these and nothing else."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from app.config import Settings
from app.storage.db import Database, DatabaseClock


@dataclass
class Broker:
    """What every service needs: the database, the settings and a clock — the database's own, so
    that every host agrees on deadlines and expiry (replaceable in tests)."""

    db: Database
    settings: Settings
    clock: Callable[[], int] = field(default=None)  # type: ignore[assignment]  # None: __post_init__ puts the database's
    # Per-process machinery services keep across calls, by name (the produce service's group commit).
    extensions: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.clock is None:
            self.clock = DatabaseClock(self.db)

    def now(self) -> int:
        return self.clock()

    def now_without_waiting(self) -> int | None:
        """``now()``, or None where the clock would first ask the database (never waits: for an
        event loop)."""
        without_waiting = getattr(self.clock, "without_waiting", None)
        return without_waiting() if without_waiting is not None else self.clock()
