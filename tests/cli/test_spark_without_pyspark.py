"""``txlog spark`` where PySpark cannot be imported: it says what to install, with its own exit code,
instead of a traceback; its help and its usage errors need no PySpark."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support import ROOT

# Loaded at interpreter start (site imports ``sitecustomize`` from the path): every import of
# pyspark fails as it does where the package is not installed.
BLOCK_PYSPARK = """
import sys


class _NoPySpark:
    def find_spec(self, name, path=None, target=None):
        if name == "pyspark" or name.startswith("pyspark."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NoPySpark())
"""


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "sitecustomize.py").write_text(BLOCK_PYSPARK)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXLOG_")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT)])
    env["TXLOG_DATABASE_URL"] = "postgresql://127.0.0.1:9/unused"
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def test_the_environment_really_has_no_pyspark(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(BLOCK_PYSPARK)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", "import pyspark"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "ModuleNotFoundError: No module named 'pyspark'" in proc.stderr


def test_spark_commands_say_how_to_install_pyspark(tmp_path: Path) -> None:
    for args in (
        ["export", "--topic", "t", "--output", str(tmp_path / "out")],
        ["pipeline", "--input", "a", "--output", "b", "--group", "g"],
        ["stream", "--topic", "t", "--group", "g", "--sink", "console"],
    ):
        proc = run(tmp_path, "spark", *args)
        assert proc.returncode == 4, proc.stderr
        assert proc.stderr.strip() == (
            "error: PySpark is not installed. Install txlog's Spark extra: pip install 'txlog[spark]' "
            "(PySpark 4 with pandas), and Java 17 or newer for Spark itself."
        )
        assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert not (tmp_path / "out").exists()


def test_help_and_usage_errors_need_no_pyspark(tmp_path: Path) -> None:
    helped = run(tmp_path, "spark", "export", "--help")
    assert helped.returncode == 0 and "--isolation-level" in helped.stdout
    usage = run(tmp_path, "spark", "stream", "--topic", "t", "--group", "g")
    assert usage.returncode == 2 and "--output is required with --sink files" in usage.stderr
    missing = run(tmp_path, "spark", "export", "--topic", "t")
    assert missing.returncode == 2 and "Missing option '--output'" in missing.stderr
