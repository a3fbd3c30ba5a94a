"""CPU time of other processes, read from /proc (no psutil), and a description of the machine.

CPU seconds are utime + stime from ``/proc/<pid>/stat``. PostgreSQL's backends come and go with
their connections; the postmaster reaps them, so its ``cutime + cstime`` keeps the CPU of the ones
that ended. PostgreSQL's CPU is therefore the postmaster's own and reaped children's time plus the
live children's time: a difference of two such readings counts every backend that ran in between.
"""

from __future__ import annotations

import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcStat:
    pid: int
    ppid: int
    pgrp: int
    cpu: float  # own utime + stime, seconds
    children_cpu: float  # cutime + cstime of reaped children, seconds


def read_stat(pid: int) -> ProcStat | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid pgrp ..." — comm may hold spaces or parentheses: split after the last ")".
    fields = text[text.rindex(")") + 2 :].split()
    ticks = [int(x) for x in fields[11:15]]  # utime, stime, cutime, cstime (fields 14-17 of stat)
    return ProcStat(pid, int(fields[1]), int(fields[2]), (ticks[0] + ticks[1]) / _TICK, (ticks[2] + ticks[3]) / _TICK)


def _all_stats() -> list[ProcStat]:
    out = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            st = read_stat(int(entry.name))
            if st is not None:
                out.append(st)
    return out


def group_cpu(pgids: list[int]) -> float:
    """CPU seconds of every live process in these process groups (a ``txlog serve`` started in its
    own session: the uvicorn supervisor and its workers)."""
    wanted = set(pgids)
    return sum(st.cpu for st in _all_stats() if st.pgrp in wanted)


def postgres_cpu(postmaster: int | None) -> float | None:
    """CPU seconds of a local PostgreSQL: postmaster, ended backends and live ones."""
    if postmaster is None:
        return None
    for _ in range(10):
        before = read_stat(postmaster)
        if before is None:
            return None
        live = sum(st.cpu for st in _all_stats() if st.ppid == postmaster)
        after = read_stat(postmaster)
        # A backend reaped during the scan would be counted nowhere (or twice): read again.
        if after is not None and after.children_cpu == before.children_cpu:
            return after.cpu + after.children_cpu + live
    return None


def thread_cpu(pid: int) -> dict[int, tuple[float, float]]:
    """User and system CPU seconds of each live thread of a process, by thread id."""
    out = {}
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return out
    for tid in tids:
        try:
            text = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        out[tid] = (int(fields[11]) / _TICK, int(fields[12]) / _TICK)
    return out


def machine_cpu() -> tuple[float, float, float]:
    """Seconds of CPU the whole machine spent busy, waiting for I/O, and in total (all cores), from
    the first line of /proc/stat: busy over total (times the cores) says whether the machine, not
    a process, was the limit."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = fields
    busy = user + nice + system + irq + softirq + steal
    return busy / _TICK, iowait / _TICK, (busy + idle + iowait) / _TICK


def postmaster_of(backend_pid: int) -> int | None:
    """The postmaster of a backend (its parent), when the server runs on this machine."""
    st = read_stat(backend_pid)
    return st.ppid if st is not None else None


def machine(pg_version: str) -> dict[str, object]:
    mem_kib = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem_kib = int(line.split()[1])
    model = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    root = Path(__file__).resolve().parent.parent
    commit = _git(root, "rev-parse", "HEAD")
    dirty = bool(_git(root, "status", "--porcelain", "--untracked-files=no"))
    return {
        "cores": os.cpu_count(),
        "cpu_model": model,
        "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "kernel": platform.release(),
        "postgresql": pg_version,
        "python": platform.python_version(),
        "txlog_commit": commit,
        "txlog_worktree_modified": dirty,
    }


def _git(root: Path, *args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
