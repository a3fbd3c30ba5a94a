"""A PostgreSQL primary and a streaming standby from the bundled binaries, for failover tests.

The primary is an ordinary ``initdb`` cluster with ``wal_level=replica``, WAL senders and a
``replicator`` role allowed to connect for replication; the standby is a ``pg_basebackup`` of it
that streams from a physical replication slot, under the application name ``SYNC_NAME``. With
``synchronous=True`` the primary lists that name in ``synchronous_standby_names`` once the
standby streams (``synchronous_commit=on``: a commit returns only after the standby has flushed
its WAL, as RocketMQ's synchronous double write or Kafka's ``acks=all`` with
``min.insync.replicas=2``); otherwise a commit returns once it is on the primary's disk and the
standby follows behind (RocketMQ's asynchronous replication, Kafka's ``acks=1``).

Only the primary carries ``synchronous_standby_names``: it is set with ``ALTER SYSTEM`` after the
base backup was taken, so a promoted standby does not wait for a standby of its own.

Both nodes listen on 127.0.0.1 on free ports and run as the binaries' helper user when the tests
run as root, as ``app.storage.embedded`` does.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path
from typing import Iterator

import psycopg

from app.storage.embedded import DATABASE, EmbeddedPostgres
from tests.support import free_port, wait_until

REPLICATION_USER = "replicator"
SYNC_NAME = "standby1"
SLOT = "standby1_slot"

PG_HBA = """\
local   all          all                      trust
host    all          all         127.0.0.1/32 trust
host    replication  replicator  127.0.0.1/32 trust
"""

PRIMARY_CONF = """
# replication (written by tests/replication/cluster.py)
wal_level = replica
max_wal_senders = 5
max_replication_slots = 5
wal_sender_timeout = 10s
max_connections = 200
fsync = on
synchronous_commit = on
"""


class Node(EmbeddedPostgres):
    """One PostgreSQL server of the pair: ``EmbeddedPostgres`` for the binaries, the helper user,
    the port and the URLs, started with the configuration in its own ``postgresql.conf``."""

    def __init__(self, data_dir: Path, name: str) -> None:
        super().__init__(data_dir, port=free_port())
        self.name = name

    def _run(self, cmd: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        try:
            return super()._run(cmd, *args, timeout=timeout)
        except subprocess.CalledProcessError as exc:  # say why, not only that it failed
            raise AssertionError(f"{self.name}: {cmd} failed ({exc.returncode}): {exc.stderr.strip()}") from exc

    def _prepare(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.system_user:
            self._prepare_root()
        else:
            self.pgdata.mkdir(parents=True, exist_ok=True)
        os.chmod(self.pgdata, 0o700)
        # the server's log beside its data directory, so that a base backup does not copy it
        self.log_path.touch()
        if self.system_user:
            owner = os.stat(self.pgdata)
            os.chown(self.log_path, owner.st_uid, owner.st_gid)

    @property
    def log_path(self) -> Path:
        return self.data_dir / "server.log"

    def _append(self, file: str, text: str) -> None:
        with open(self.pgdata / file, "a") as f:
            f.write(text)

    def init_primary(self) -> None:
        self._prepare()
        self._run(
            "initdb", "-D", str(self.pgdata), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-instructions", "--locale=C"
        )
        (self.pgdata / "pg_hba.conf").write_text(PG_HBA)
        self._append("postgresql.conf", PRIMARY_CONF)

    def init_standby(self, primary: "Node", slot: str = SLOT, application_name: str = SYNC_NAME) -> None:
        """A base backup of ``primary`` (creating the replication slot ``slot``), set up to stream
        from it under ``application_name`` (the defaults: the pair's one standby)."""
        self._prepare()
        self._run(
            "pg_basebackup",
            "-D",
            str(self.pgdata),
            "-h",
            "127.0.0.1",
            "-p",
            str(primary.port),
            "-U",
            REPLICATION_USER,
            "-X",
            "stream",
            "-C",
            "-S",
            slot,
            "--checkpoint=fast",
            timeout=120,
        )
        self._append(
            "postgresql.conf",
            f"""
# standby of {primary.name}
primary_conninfo = 'host=127.0.0.1 port={primary.port} user={REPLICATION_USER} application_name={application_name}'
primary_slot_name = '{slot}'
hot_standby = on
""",
        )
        signal_file = self.pgdata / "standby.signal"
        signal_file.touch()
        if self.system_user:
            owner = os.stat(self.pgdata)
            os.chown(signal_file, owner.st_uid, owner.st_gid)

    def start_server(self) -> None:
        self._run(
            "pg_ctl",
            "-D",
            str(self.pgdata),
            "-l",
            str(self.log_path),
            "-w",
            "-t",
            "60",
            "-o",
            f"-h 127.0.0.1 -p {self.port} -k ''",
            "start",
            timeout=90,
        )

    def connect(self, database: str = DATABASE) -> psycopg.Connection:
        return psycopg.connect(self.admin_url(database), autocommit=True, connect_timeout=5)

    def query(self, sql: str, params: tuple = (), database: str = "postgres") -> list[tuple]:
        with self.connect(database) as conn:
            return conn.execute(sql, params).fetchall()  # type: ignore[arg-type]

    def postmaster_pid(self) -> int:
        return int((self.pgdata / "postmaster.pid").read_text().splitlines()[0])

    def kill9(self) -> None:
        """The host dies: every process of the server is frozen, then killed with SIGKILL, so no
        process of it writes, answers or ships WAL after the first one is gone."""
        pids = [self.postmaster_pid(), *_children(self.postmaster_pid())]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not any(_alive(p) for p in pids), timeout=10, message=f"{self.name} gone")

    def promote(self) -> None:
        self._run("pg_ctl", "-D", str(self.pgdata), "-w", "-t", "60", "promote", timeout=90)

    def destroy_quietly(self) -> None:
        with contextlib.suppress(Exception):
            if self.is_running():
                self._run("pg_ctl", "-D", str(self.pgdata), "-m", "immediate", "-w", "stop", timeout=60)
        for pid in [p for p in _all_pids() if _data_dir_of(p) == str(self.pgdata)]:  # nothing left behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    # -- replication state -------------------------------------------------------------------------
    def wal_lsn(self) -> int:
        """The primary's current WAL position, in bytes."""
        return int(self.query("SELECT pg_current_wal_lsn() - '0/0'")[0][0])

    def received_lsn(self) -> int:
        """A standby's last WAL position received and flushed, in bytes."""
        return int(self.query("SELECT pg_last_wal_receive_lsn() - '0/0'")[0][0])

    def walsender_pid(self) -> int:
        return int(self.query("SELECT pid FROM pg_stat_replication WHERE application_name = %s", (SYNC_NAME,))[0][0])

    def is_in_recovery(self) -> bool:
        return bool(self.query("SELECT pg_is_in_recovery()")[0][0])


class Pair:
    def __init__(self, root: Path, synchronous: bool) -> None:
        self.synchronous = synchronous
        self.primary = Node(root / "node1", "node1")
        self.standby = Node(root / "node2", "node2")

    @property
    def url(self) -> str:
        """txlog's URL: both nodes, libpq picks the one that accepts writes."""
        return (
            f"postgresql://postgres@127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}/{DATABASE}"
            "?target_session_attrs=read-write"
        )

    def start(self) -> "Pair":
        p, s = self.primary, self.standby
        p.init_primary()
        p.start_server()
        with p.connect("postgres") as conn:
            conn.execute(f"CREATE ROLE {REPLICATION_USER} WITH REPLICATION LOGIN")
            conn.execute(f'CREATE DATABASE "{DATABASE}"')
        s.init_standby(p)
        s.start_server()
        wait_until(
            lambda: (
                p.query("SELECT state FROM pg_stat_replication WHERE application_name = %s", (SYNC_NAME,)) == [("streaming",)]
            ),
            timeout=30,
            interval=0.1,
            message="standby streaming",
        )
        if self.synchronous:
            with p.connect("postgres") as conn:
                conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{SYNC_NAME}'")
                conn.execute("SELECT pg_reload_conf()")
        expected = "sync" if self.synchronous else "async"
        wait_until(
            lambda: (
                p.query("SELECT sync_state FROM pg_stat_replication WHERE application_name = %s", (SYNC_NAME,)) == [(expected,)]
            ),
            timeout=30,
            interval=0.1,
            message=f"standby {expected}",
        )
        return self

    def stop(self) -> None:
        self.standby.destroy_quietly()
        self.primary.destroy_quietly()


@contextlib.contextmanager
def replicated_pair(root: Path, synchronous: bool) -> Iterator[Pair]:
    pair = Pair(root, synchronous)
    try:
        yield pair.start()
    finally:
        pair.stop()


# -- processes ---------------------------------------------------------------------------------------
def _all_pids() -> list[int]:
    return [int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit()]


def _children(parent: int) -> list[int]:
    found = []
    for pid in _all_pids():
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = Path(f"/proc/{pid}/stat").read_text()
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == parent:
                found.append(pid)
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :].split()[0] != "Z"


def _data_dir_of(pid: int) -> str | None:
    """The ``-D`` of a postgres server process, ``None`` for any other process."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    if not argv or not argv[0].endswith(b"postgres") or b"-D" not in argv:
        return None
    i = argv.index(b"-D")
    return argv[i + 1].decode() if i + 1 < len(argv) else None
