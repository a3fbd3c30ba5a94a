"""Running ``txlog spark …`` as a real subprocess (its own Spark driver and JVM)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.support import ROOT


class SparkCommand:
    """``python -m app.cli spark ARGS`` in its own process group, stderr captured to a file."""

    def __init__(self, db_url: str, args: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        environment = {**os.environ, "TXLOG_DATABASE_URL": db_url, "PYSPARK_PYTHON": sys.executable, **(env or {})}
        self._out = open(log, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "spark", *args, "--master", "local[2]"],
            cwd=ROOT,
            env=environment,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, timeout: float = 180) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self._out.close()

    def kill(self) -> None:
        """SIGKILL the driver and its JVM (the whole process group), as ``kill -9`` would."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.wait(60)


def run_spark_cli(db_url: str, args: list[str], log: Path, env: dict[str, str] | None = None, expect: int = 0) -> str:
    cmd = SparkCommand(db_url, args, log, env)
    code = cmd.wait()
    out = cmd.output()
    assert code == expect, f"txlog spark {' '.join(args)} exited {code}, expected {expect}:\n{out[-4000:]}"
    return out
