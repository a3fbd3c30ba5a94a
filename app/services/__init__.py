"""One function per protocol operation. Each opens the database transactions it needs; routes and
admin pages call these and nothing else."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from app.config import Settings
from app.storage.db import Database


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class Broker:
    """What every service needs: the database, the settings and a clock (replaceable in tests)."""

    db: Database
    settings: Settings
    clock: Callable[[], int] = field(default=wall_clock_ms)

    def now(self) -> int:
        return self.clock()
