"""Progress lines on stderr while Spark runs a job: tasks finished of the active stages."""

from __future__ import annotations

import sys
import threading
import time
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def say(message: str, out: TextIO | None = None) -> None:
    print(message, file=out or sys.stderr, flush=True)


class SparkProgress:
    """``with SparkProgress(spark, "export orders"):`` prints ``export orders: 3/8 tasks`` each time
    the count changes (at most every ``interval`` seconds)."""

    def __init__(self, spark: "SparkSession", label: str, interval: float = 1.0, out: TextIO | None = None) -> None:
        self.tracker = spark.sparkContext.statusTracker()
        self.label = label
        self.interval = interval
        self.out = out or sys.stderr
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="txlog-progress", daemon=True)
        self.started = time.monotonic()

    def _counts(self) -> tuple[int, int]:
        done = total = 0
        for stage_id in self.tracker.getActiveStageIds():
            info = self.tracker.getStageInfo(stage_id)
            if info is not None:
                done += info.numCompletedTasks
                total += info.numTasks
        return done, total

    def _run(self) -> None:
        last: tuple[int, int] | None = None
        while not self._stop.wait(self.interval):
            try:
                counts = self._counts()
            except Exception:  # the context is shutting down
                return
            if counts != last and counts[1]:
                say(f"{self.label}: {counts[0]}/{counts[1]} tasks ({time.monotonic() - self.started:.1f} s)", self.out)
                last = counts

    def __enter__(self) -> "SparkProgress":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started
