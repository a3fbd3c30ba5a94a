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
    the count changes (at most every ``interval`` seconds), and on leaving, the tasks of every job
    run inside, so a job quicker than a sample still reports its tasks once."""

    def __init__(self, spark: "SparkSession", label: str, interval: float = 1.0, out: TextIO | None = None) -> None:
        self.tracker = spark.sparkContext.statusTracker()
        self.label = label
        self.interval = interval
        self.out = out or sys.stderr
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="txlog-progress", daemon=True)
        self.started = time.monotonic()
        self._last: tuple[int, int] | None = None
        self._jobs_before: set[int] = set()

    def _jobs(self) -> set[int]:
        return set(self.tracker.getJobIdsForGroup(None))

    def _counts(self) -> tuple[int, int]:
        done = total = 0
        for stage_id in self.tracker.getActiveStageIds():
            info = self.tracker.getStageInfo(stage_id)
            if info is not None:
                done += info.numCompletedTasks
                total += info.numTasks
        return done, total

    def _finished_counts(self) -> tuple[int, int]:
        """Tasks done and in all of the stages of the jobs started inside that ran any task (the
        tracker keeps the stages of finished jobs; a job that reuses another's shuffle lists its
        stage again, skipped)."""
        stages: set[int] = set()
        for job_id in self._jobs() - self._jobs_before:
            job = self.tracker.getJobInfo(job_id)
            stages.update(job.stageIds if job is not None else ())
        done = total = 0
        for stage_id in stages:
            info = self.tracker.getStageInfo(stage_id)
            if info is not None and info.numCompletedTasks + info.numActiveTasks + info.numFailedTasks:
                done += info.numCompletedTasks
                total += info.numTasks
        return done, total

    def _say(self, counts: tuple[int, int]) -> None:
        if counts != self._last and counts[1]:
            say(f"{self.label}: {counts[0]}/{counts[1]} tasks ({time.monotonic() - self.started:.1f} s)", self.out)
            self._last = counts

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._say(self._counts())
            except Exception:  # the context is shutting down
                return

    def __enter__(self) -> "SparkProgress":
        self._jobs_before = self._jobs()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            self._say(self._finished_counts())
        except Exception:  # the context is shutting down
            pass

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started
