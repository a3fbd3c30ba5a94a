"""A Patroni cluster on this machine, for failover tests: one etcd member as Patroni's store and two
Patroni nodes managing the bundled PostgreSQL binaries (``postgresql.bin_dir``).

Patroni bootstraps the first node (``initdb``), makes the second a ``pg_basebackup`` of it, and
keeps one leader key in etcd: the node holding it runs PostgreSQL as the primary, the other as a
streaming standby. With ``synchronous_mode`` Patroni lists the standby in the primary's
``synchronous_standby_names``, so a commit returns only once the standby has flushed it, and
Patroni promotes only a node that was synchronous: a failover loses nothing acknowledged.

The timings are small so that a test sees a failover in seconds: the leader key lives ``TTL``
seconds, each node's loop runs every ``LOOP_WAIT`` seconds and gives up on etcd or PostgreSQL
after ``RETRY_TIMEOUT`` (Patroni wants ``loop_wait + 2 * retry_timeout <= ttl``).
``primary_start_timeout: 0`` makes a primary whose PostgreSQL crashed hand over to the synchronous
standby at once rather than restarting in place. ``use_pg_rewind`` (with ``wal_log_hints``) lets a
failed primary rejoin as a standby by rewinding the WAL it wrote that the new primary never had.

Nodes reuse ``tests.replication.cluster.Node`` for the binaries, the helper user (PostgreSQL and
Patroni run as ``pgserver`` when the tests run as root) and the SQL helpers.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import httpx

from app.storage.embedded import DATABASE, _bin_dir
from tests.replication.cluster import Node, _alive, _children
from tests.support import free_port, wait_until

SCOPE = "txlog"
TTL = 10
LOOP_WAIT = 1
RETRY_TIMEOUT = 4


def have_patroni() -> bool:
    return shutil.which("patroni") is not None and shutil.which("etcd") is not None


class Etcd:
    """One etcd member on free loopback ports. Patroni talks to it over etcd's v2 API (``etcd:``),
    whose leader key Patroni renews with a compare-and-swap on its own name. Patroni 3.0.2's v3
    driver (``etcd3:``) renews it unconditionally once its lease has expired: a leader whose loop
    stalled longer than the TTL takes the key back from the node promoted meanwhile and demotes it,
    losing what that node acknowledged (seen with this very test's frozen primary; fixed in
    Patroni 3.0.3)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.client_port = free_port()
        self.peer_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def start(self) -> "Etcd":
        self.root.mkdir(parents=True, exist_ok=True)
        client, peer = f"http://{self.endpoint}", f"http://127.0.0.1:{self.peer_port}"
        with open(self.root / "etcd.log", "ab") as log:
            self.proc = subprocess.Popen(
                [
                    "etcd",
                    "--name=etcd0",
                    f"--data-dir={self.root / 'data'}",
                    f"--listen-client-urls={client}",
                    f"--advertise-client-urls={client}",
                    f"--listen-peer-urls={peer}",
                    f"--initial-advertise-peer-urls={peer}",
                    f"--initial-cluster=etcd0={peer}",
                    "--enable-v2=true",
                    "--logger=zap",
                    "--log-level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_until(self._healthy, timeout=30, interval=0.1, message="etcd healthy")
        return self

    def _healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"etcd exited with {self.proc.returncode}: {(self.root / 'etcd.log').read_text()[-2000:]}")
        try:
            return httpx.get(f"http://{self.endpoint}/health", timeout=1).json().get("health") == "true"
        except (httpx.HTTPError, ValueError):
            return False

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)


class PatroniNode(Node):
    """A PostgreSQL server run by its own Patroni daemon; ``Node`` gives its port and SQL helpers."""

    def __init__(self, data_dir: Path, name: str) -> None:
        super().__init__(data_dir, name)
        self.rest_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def config_path(self) -> Path:
        return self.data_dir / "patroni.yml"

    @property
    def patroni_log(self) -> Path:
        return self.data_dir / "patroni.log"

    def config(self, etcd: Etcd) -> dict:
        """The node's Patroni configuration: the cluster-wide part under ``bootstrap.dcs`` is
        written to etcd by the first node and shared by both."""
        run_dir = self.data_dir / "run"  # the helper user's: Patroni's pgpass and PostgreSQL's socket
        local = "127.0.0.1"
        return {
            "scope": SCOPE,
            "name": self.name,
            "log": {"level": "INFO"},
            "restapi": {"listen": f"{local}:{self.rest_port}", "connect_address": f"{local}:{self.rest_port}"},
            "etcd": {"host": etcd.endpoint},
            "bootstrap": {
                "dcs": {
                    "ttl": TTL,
                    "loop_wait": LOOP_WAIT,
                    "retry_timeout": RETRY_TIMEOUT,
                    "maximum_lag_on_failover": 1024 * 1024,
                    "primary_start_timeout": 0,
                    "synchronous_mode": True,
                    "postgresql": {
                        "use_pg_rewind": True,
                        "use_slots": True,
                        "parameters": {
                            "wal_level": "replica",
                            "wal_log_hints": "on",
                            "max_connections": 200,
                            "max_wal_senders": 10,
                            "max_replication_slots": 10,
                            "wal_sender_timeout": "10s",
                            "synchronous_commit": "on",
                            "fsync": "on",
                        },
                    },
                },
                "initdb": [{"encoding": "UTF8"}, {"locale": "C"}],
                "pg_hba": ["local all all trust", f"host all all {local}/32 trust", f"host replication all {local}/32 trust"],
            },
            "postgresql": {
                "listen": f"{local}:{self.port}",
                "connect_address": f"{local}:{self.port}",
                "data_dir": str(self.pgdata),
                "bin_dir": str(_bin_dir()),
                "pgpass": str(run_dir / "pgpass"),
                "basebackup": [{"checkpoint": "fast"}],
                "authentication": {
                    "superuser": {"username": "postgres"},
                    "replication": {"username": "postgres"},
                    "rewind": {"username": "postgres"},
                },
                "parameters": {"unix_socket_directories": str(run_dir)},
            },
        }

    def write_config(self, etcd: Etcd) -> None:
        self._prepare()
        run_dir = self.data_dir / "run"
        run_dir.mkdir(exist_ok=True)
        if self.system_user:
            pw = pwd.getpwnam(self.system_user)
            os.chown(run_dir, pw.pw_uid, pw.pw_gid)
        self.config_path.write_text(json.dumps(self.config(etcd), indent=1))  # JSON is YAML

    def start_patroni(self) -> None:
        argv = [shutil.which("patroni") or "patroni", str(self.config_path)]
        if self.system_user:
            argv = ["runuser", "-u", self.system_user, "--", *argv]
        with open(self.patroni_log, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd="/")

    def kill_patroni(self) -> None:
        """The daemon dies (SIGKILL to its process group); PostgreSQL, in a session of its own, stays."""
        if self.proc and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def patroni_alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def status(self) -> dict:
        """Patroni's view of the node (``GET /patroni``), ``{}`` while it does not answer."""
        try:
            r = httpx.get(f"http://127.0.0.1:{self.rest_port}/patroni", timeout=2)
            return r.json() if r.status_code in (200, 503) else {}
        except (httpx.HTTPError, ValueError):
            return {}

    def is_primary(self) -> bool:
        """Patroni's health check for a load balancer's writes: 200 only on the leader running as primary."""
        try:
            return httpx.get(f"http://127.0.0.1:{self.rest_port}/primary", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def is_streaming_replica(self) -> bool:
        status = self.status()
        return (
            status.get("role") == "replica" and status.get("state") == "running" and bool(status.get("replication_state", True))
        )

    def server_pids(self) -> list[int]:
        """The postmaster and every process it started."""
        with contextlib.suppress(OSError, ValueError, IndexError):
            pid = self.postmaster_pid()
            if _alive(pid):
                return [pid, *_children(pid)]
        return []

    def freeze(self) -> list[int]:
        """The host stops answering (a network stall): SIGSTOP to every process of its PostgreSQL.
        Patroni itself keeps running; its checks of the server hang as a client's would."""
        pids = self.server_pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        return pids

    @staticmethod
    def thaw(pids: list[int]) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def log_tail(self, chars: int = 4000) -> str:
        parts = []
        for path in (self.patroni_log, self.pgdata / "log"):
            if path.is_file():
                parts.append(f"--- {self.name} {path.name}:\n{path.read_text(errors='replace')[-chars:]}")
        return "\n".join(parts)


class PatroniCluster:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.etcd = Etcd(root / "etcd")
        self.nodes = [PatroniNode(root / "node1", "node1"), PatroniNode(root / "node2", "node2")]

    @property
    def url(self) -> str:
        """txlog's URL: both nodes, libpq picks the one that accepts writes."""
        hosts = ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)
        return f"postgresql://postgres@{hosts}/{DATABASE}?target_session_attrs=read-write"

    def leader(self) -> PatroniNode | None:
        primaries = [n for n in self.nodes if n.is_primary()]
        return primaries[0] if len(primaries) == 1 else None

    def other(self, node: PatroniNode) -> PatroniNode:
        return next(n for n in self.nodes if n is not node)

    def sync_standby(self, primary: PatroniNode) -> str | None:
        """The application name the primary's ``pg_stat_replication`` shows as ``sync``."""
        with contextlib.suppress(Exception):
            rows = primary.query("SELECT application_name FROM pg_stat_replication WHERE sync_state = 'sync'")
            return rows[0][0] if rows else None
        return None

    def wait_synchronous(self, primary: PatroniNode, standby: PatroniNode, timeout: float = 60) -> None:
        """Until ``standby`` is the primary's synchronous standby for PostgreSQL (``sync`` in
        ``pg_stat_replication``) and for Patroni (named in its ``/sync`` key, which a standby must be
        to be promoted in synchronous mode: ``sync_standby`` in its status)."""
        self.wait(
            lambda: self.sync_standby(primary) == standby.name and standby.status().get("sync_standby") is True,
            timeout,
            f"{standby.name} the synchronous standby of {primary.name}",
        )

    def healthy(self) -> tuple[PatroniNode, PatroniNode]:
        """The leader and its synchronous standby, once Patroni has both: the cluster can fail over
        without losing anything acknowledged."""
        leader = self.wait(self.leader, 60, "one leader")
        standby = self.other(leader)
        self.wait_synchronous(leader, standby)
        return leader, standby

    def restart_leader(self) -> PatroniNode:
        """The leader's PostgreSQL restarted by its Patroni (``POST /restart``, as ``patronictl
        restart`` does): a clean stop and start in place, the leader key kept."""
        leader = self.wait(self.leader, 60, "one leader")
        r = httpx.post(f"http://127.0.0.1:{leader.rest_port}/restart", json={}, timeout=120)
        assert r.status_code == 200, f"Patroni refused the restart of {leader.name}: {r.status_code} {r.text}"
        return leader

    def wait(self, predicate, timeout: float, message: str):  # type: ignore[no-untyped-def]
        """``wait_until``, with both nodes' logs in the failure."""
        try:
            return wait_until(predicate, timeout=timeout, interval=0.1, message=message)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.logs()}") from None

    def start(self) -> "PatroniCluster":
        self.etcd.start()
        first, second = self.nodes
        for node in self.nodes:
            node.write_config(self.etcd)
        first.start_patroni()
        self.wait(first.is_primary, 90, f"{first.name} bootstrapped")
        with first.connect("postgres") as conn:
            conn.execute(f'CREATE DATABASE "{DATABASE}"')
        second.start_patroni()
        self.wait_synchronous(first, second, timeout=90)
        return self

    def logs(self) -> str:
        return "\n".join(n.log_tail() for n in self.nodes)

    def stop(self) -> None:
        for node in self.nodes:
            node.kill_patroni()
            with contextlib.suppress(Exception):
                self.thaw_all(node)
            node.destroy_quietly()
        self.etcd.stop()

    @staticmethod
    def thaw_all(node: PatroniNode) -> None:
        node.thaw(node.server_pids())


@contextlib.contextmanager
def patroni_cluster(root: Path) -> Iterator[PatroniCluster]:
    cluster = PatroniCluster(root)
    try:
        yield cluster.start()
    finally:
        cluster.stop()


if __name__ == "__main__":  # a cluster to look at by hand: python -m tests.replication.patroni_cluster DIR
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    with patroni_cluster(Path(sys.argv[1]).absolute()) as c:
        print(c.url, [n.rest_port for n in c.nodes], flush=True)
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
