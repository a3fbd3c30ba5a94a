"""Progress lines of a Spark job (``spark.progress.SparkProgress``) on a real local Spark."""

from __future__ import annotations

import io
import re

from spark.progress import SparkProgress


def test_a_job_quicker_than_a_sample_still_reports_its_tasks(spark) -> None:  # type: ignore[no-untyped-def]
    out = io.StringIO()
    with SparkProgress(spark, "count", interval=3600, out=out):  # never sampled while it runs
        assert spark.range(0, 100, numPartitions=3).count() == 100
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and re.fullmatch(r"count: (\d+)/\1 tasks \(\d+\.\d s\)", lines[0]), lines


def test_nothing_run_reports_nothing(spark) -> None:  # type: ignore[no-untyped-def]
    out = io.StringIO()
    spark.range(0, 10).count()  # a job before is not counted
    with SparkProgress(spark, "idle", interval=3600, out=out):
        pass
    assert out.getvalue() == ""
