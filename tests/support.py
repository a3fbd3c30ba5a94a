"""Helpers shared by the test suites: real servers started as subprocesses, free ports, polling."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, Self

import httpx

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout: float = 30.0, interval: float = 0.05, message: str = "condition"):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


def wait_while_progressing(remaining, stall_timeout: float = 60.0, interval: float = 0.5, message: str = "work") -> None:  # type: ignore[no-untyped-def]
    """Wait until ``remaining()`` (how much work is left, a number) reaches zero, for as long as it
    keeps going down: fail only when it has not moved for ``stall_timeout`` seconds. For work whose
    amount a run decides (a backlog built under load), where a fixed deadline would measure the
    machine's speed instead of whether the work is done."""
    left = remaining()
    moved = time.monotonic()
    while left > 0:
        if time.monotonic() - moved > stall_timeout:
            raise AssertionError(f"{message}: {left} left, no progress for {stall_timeout}s")
        time.sleep(interval)
        now = remaining()
        if now < left:
            moved = time.monotonic()
        left = now


def accepting(port: int) -> bool:
    """Whether something accepts connections on ``127.0.0.1:port``."""
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


class TxlogProcess:
    """A ``txlog`` command (``argv``) in a subprocess against a given database, in a session of its
    own so that a signal reaches every process it starts, its output to ``log_path`` (else
    discarded). ``start`` returns once it is ``ready``, waiting for ``awaited``. Its environment
    is this one's with the database set and ``env`` over it, without this one's TXLOG_* settings
    unless ``inherits_settings``."""

    name = "txlog"
    inherits_settings = False

    def __init__(self, database_url: str, env: dict[str, str] | None, log_path: Path | None, awaited: str) -> None:
        self.database_url = database_url
        inherited = os.environ if self.inherits_settings else {k: v for k, v in os.environ.items() if not k.startswith("TXLOG_")}
        self.env = {**inherited, "TXLOG_DATABASE_URL": database_url, **(env or {})}
        self.log_path = log_path
        self.awaited = awaited
        self.proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        """The command and its options, after ``txlog``."""
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError

    def start(self, timeout: float = 60) -> Self:
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", *self.argv()],
            cwd=ROOT,
            env=self.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_until(self._started, timeout, 0.1, self.awaited)
        return self

    def _started(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.name} exited with {self.proc.returncode}:\n{self.log()}")
        return self.ready()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Kill the whole process group (for ``txlog serve``, uvicorn's supervisor and its workers)."""
        if self.proc and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=30)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int | None:
        """Signal the process group and wait for it (SIGKILL after ``timeout`` seconds); its exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        return self.proc.returncode

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to every process of the command and return at once (SIGSTOP freezes it as a
        stalled host, SIGCONT resumes it)."""
        assert self.proc is not None
        os.killpg(self.proc.pid, sig)

    def processes(self) -> dict[int, str]:
        """The command's processes (its process group) and the state of each: ``T`` is stopped."""
        assert self.proc is not None
        found = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:  # gone meanwhile
                continue
            fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state, ppid, pgrp, ...
            if int(fields[2]) == self.proc.pid:
                found[int(entry.name)] = fields[0]
        return found

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ServerProcess(TxlogProcess):
    """``txlog serve`` in a subprocess, on a free port, against a given database."""

    name = "server"
    inherits_settings = True

    def __init__(
        self, database_url: str, workers: int = 1, env: dict[str, str] | None = None, log_path: Path | None = None
    ) -> None:
        self.workers = workers
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        super().__init__(database_url, env, log_path, f"server on {self.url} to be ready")
        self.env.pop("PROMETHEUS_MULTIPROC_DIR", None)

    def argv(self) -> list[str]:
        return ["serve", "--port", str(self.port), "--workers", str(self.workers), "--log-level", "warning"]

    def ready(self) -> bool:
        try:
            return httpx.get(self.url + "/readyz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def client(self, timeout: float = 30) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=timeout)

    def __exit__(self, *exc: object) -> None:
        self.kill()


@contextlib.contextmanager
def running_server(database_url: str, **kwargs) -> Iterator[ServerProcess]:  # type: ignore[no-untyped-def]
    with ServerProcess(database_url, **kwargs) as server:
        yield server


def destroy_embedded(server) -> None:  # type: ignore[no-untyped-def]
    """Stop an embedded PostgreSQL (``app.storage.embedded``) and delete its data directory."""
    import shutil

    server.stop()
    shutil.rmtree(server.data_dir, ignore_errors=True)
