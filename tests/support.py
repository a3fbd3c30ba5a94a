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
from typing import Iterator

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


class ServerProcess:
    """``txlog serve`` in a subprocess, on a free port, against a given database."""

    def __init__(
        self, database_url: str, workers: int = 1, env: dict[str, str] | None = None, log_path: Path | None = None
    ) -> None:
        self.database_url = database_url
        self.workers = workers
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, "TXLOG_DATABASE_URL": database_url, **(env or {})}
        self.env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60) -> "ServerProcess":
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "app.cli",
                "serve",
                "--port",
                str(self.port),
                "--workers",
                str(self.workers),
                "--log-level",
                "warning",
            ],
            cwd=ROOT,
            env=self.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_until(self._ready, timeout, 0.1, f"server on {self.url} to be ready")
        return self

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"server exited with {self.proc.returncode}")
        try:
            return httpx.get(self.url + "/readyz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Kill the whole process group (uvicorn supervisor and its workers)."""
        if self.proc and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        self.kill(signal.SIGTERM)

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to every process of the server and return at once (SIGSTOP freezes it as a
        stalled host, SIGCONT resumes it)."""
        assert self.proc is not None
        os.killpg(self.proc.pid, sig)

    def processes(self) -> dict[int, str]:
        """The server's processes (its process group) and the state of each: ``T`` is stopped."""
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

    def client(self, timeout: float = 30) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=timeout)

    def __enter__(self) -> "ServerProcess":
        return self.start()

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
