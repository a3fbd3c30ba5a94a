"""The benchmark's output: the table of ratios with their goals, a table per workload (throughput and
CPU per 1000 rows of the client processes, the server and PostgreSQL), a one-line summary of
``key=value`` pairs, a JSON document and a PNG chart of the ratios against their goals."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Goal:
    op: str  # ">=", "<=" or "~" (within ``value`` of 1.0, as a fraction)
    value: float

    def met(self, x: float | None) -> bool | None:
        if x is None:
            return None
        if self.op == ">=":
            return x >= self.value
        if self.op == "<=":
            return x <= self.value
        return abs(x - 1.0) <= self.value

    def text(self) -> str:
        if self.op == "~":
            return f"1.0 ± {self.value * 100:.0f}%"
        return f"{'≥' if self.op == '>=' else '≤'} {self.value:g}"


@dataclass
class Cell:
    value: float | None  # the median over rounds
    rounds: list[float]  # the figure of each round
    goal: Goal
    client_cpu_per_krow: float | None  # of the measured workload (the numerator)

    @property
    def met(self) -> bool | None:
        return self.goal.met(self.value)


@dataclass
class Row:
    key: str
    label: str
    unit: str  # "ratio" or "ms"
    cells: dict[str, Cell] = field(default_factory=dict)  # "1" and/or "8"


@dataclass
class WorkloadSummary:
    key: str
    windows: int
    rows_per_s: float  # median over rounds
    client_cpu_per_krow: float
    server_cpu_per_krow: float
    postgres_cpu_per_krow: float | None
    busiest_client_core: float  # the most CPU one client process used, as a share of one core
    busy_cores: float  # client + server + PostgreSQL CPU per second of window
    machine_busy_cores: float  # the whole machine (/proc/stat), steal included
    machine_iowait_cores: float
    rows_per_s_rounds: list[float]
    endtxn_ms: list[float] = field(default_factory=list)
    empty_dequeues: int = 0


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def percentile(xs: list[float], q: float) -> float | None:
    """Nearest-rank percentile."""
    if not xs:
        return None
    ordered = sorted(xs)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def _fmt(x: float | None, unit: str) -> str:
    if x is None:
        return "—"
    return f"{x:.1f}" if unit == "ms" else f"{x:.2f}"


def _cell_text(row: Row, column: str) -> str:
    if row.unit == "ms":
        p50, p99 = row.cells.get(column + ".p50"), row.cells.get(column + ".p99")
        if p50 is None or p99 is None:
            return "—"
        miss = "!" if (p50.met is False or p99.met is False) else ""
        return f"{_fmt(p50.value, 'ms')} / {_fmt(p99.value, 'ms')}{miss}"
    cell = row.cells.get(column)
    if cell is None:
        return "—"
    miss = "!" if cell.met is False else ""
    cpu = f" [{cell.client_cpu_per_krow:.3f}]" if cell.client_cpu_per_krow is not None else ""
    return f"{_fmt(cell.value, row.unit)}{miss}{cpu}"


def _goal_text(row: Row) -> str:
    if row.unit == "ms":
        parts = []
        for column in ("1", "8"):
            p50, p99 = row.cells.get(column + ".p50"), row.cells.get(column + ".p99")
            if p50 and p99:
                parts.append(f"≤ {p50.goal.value:g} / {p99.goal.value:g} ms ({column})")
        return ", ".join(parts)
    goals = {c.goal.text() for c in row.cells.values()}
    return " / ".join(sorted(goals))


def table(rows: list[Row], who: str = "producer") -> str:
    """``who``: what the columns' 1 and 8 count (producers, or consumers)."""
    width = max(len(r.label) for r in rows) + 2
    head = f"{'row':<{width}}{'1 ' + who:<22}{'8 ' + who + 's':<22}goal"
    lines = [head, "-" * (len(head) + 16)]
    for r in rows:
        lines.append(f"{r.label:<{width}}{_cell_text(r, '1'):<22}{_cell_text(r, '8'):<22}{_goal_text(r)}")
    lines.append("[client CPU seconds per 1000 rows of the measured workload]   ! = goal missed")
    return "\n".join(lines)


def workload_table(summaries: list[WorkloadSummary]) -> str:
    head = (
        f"{'workload':<24}{'rows/s':>10}{'client':>10}{'server':>10}{'postgres':>10}"
        f"{'busiest client':>16}{'cores busy':>12}{'machine':>9}{'iowait':>8}"
    )
    lines = [
        "CPU seconds per 1000 rows; busiest client: one client process's share of a core; cores busy: client + "
        "server + PostgreSQL; machine: all cores busy (/proc/stat), iowait: cores idle on I/O",
        head,
    ]
    for s in summaries:
        pg = f"{s.postgres_cpu_per_krow:.4f}" if s.postgres_cpu_per_krow is not None else "—"
        extra = f"   (queue empty {s.empty_dequeues}x)" if s.empty_dequeues else ""
        lines.append(
            f"{s.key:<24}{s.rows_per_s:>10,.0f}{s.client_cpu_per_krow:>10.4f}{s.server_cpu_per_krow:>10.4f}{pg:>10}"
            f"{s.busiest_client_core:>15.0%}{s.busy_cores:>12.2f}{s.machine_busy_cores:>9.2f}{s.machine_iowait_cores:>8.2f}"
            f"{extra}"
        )
    return "\n".join(lines)


def summary_line(rows: list[Row], goals_key: str = "goals_met") -> str:
    pairs = []
    met = total = 0
    for r in rows:
        for column, cell in r.cells.items():
            name = f"{r.key}_{column.replace('.', '_')}" if column else r.key
            pairs.append(f"{name}={_fmt(cell.value, r.unit)}")
            if cell.met is not None:
                total += 1
                met += bool(cell.met)
    pairs.append(f"{goals_key}={met}/{total}")
    return " ".join(pairs)


def to_json(
    rows: list[Row], summaries: list[WorkloadSummary], machine: dict[str, Any], config: dict[str, Any], summary: str
) -> dict[str, Any]:
    return {
        "machine": machine,
        "config": config,
        "rows": [
            {
                "key": r.key,
                "label": r.label,
                "unit": r.unit,
                "cells": {
                    c: {
                        "value": cell.value,
                        "rounds": cell.rounds,
                        "goal": asdict(cell.goal),
                        "goal_text": cell.goal.text(),
                        "met": cell.met,
                        "client_cpu_s_per_1000_rows": cell.client_cpu_per_krow,
                    }
                    for c, cell in r.cells.items()
                },
            }
            for r in rows
        ],
        "workloads": {s.key: asdict(s) for s in summaries},
        "summary": summary,
    }


def write_json(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")


def chart(path: Path, rows: list[Row], title: str, who: str = "producer") -> None:
    """Bars of each ratio (1 and 8 producers, or ``who``) with its goal drawn across them, and the
    EndTxn latencies against theirs (when there are any)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ratio_rows = [r for r in rows if r.unit == "ratio"]
    ms_rows = [r for r in rows if r.unit == "ms"]
    if ms_rows:
        fig, (ax, lat) = plt.subplots(
            2, 1, figsize=(11, 0.55 * len(ratio_rows) + 4.5), gridspec_kw={"height_ratios": [len(ratio_rows), 3]}
        )
    else:
        fig, ax = plt.subplots(1, 1, figsize=(11, 0.55 * len(ratio_rows) + 1.5))
    colors = {"1": "#4C72B0", "8": "#DD8452"}
    labelled: set[str] = set()
    for i, r in enumerate(ratio_rows):
        y = len(ratio_rows) - 1 - i
        for column, dy in (("1", 0.18), ("8", -0.18)):
            cell = r.cells.get(column)
            if cell is None or cell.value is None:
                continue
            label = None if column in labelled else f"{column} {who}{'s' if column == '8' else ''} (pale: goal missed)"
            labelled.add(column)
            ax.barh(y + dy, cell.value, height=0.34, color=colors[column], alpha=0.45 if cell.met is False else 1.0, label=label)
            ax.text(cell.value + 0.02, y + dy, f"{cell.value:.2f}", va="center", fontsize=8)
        goal = next(iter(r.cells.values())).goal
        if goal.op == "~":
            ax.axvspan(
                1 - goal.value,
                1 + goal.value,
                ymin=(y + 0.1) / len(ratio_rows),
                ymax=(y + 0.9) / len(ratio_rows),
                color="green",
                alpha=0.15,
            )
            ax.text(1.0, y + 0.44, goal.text(), fontsize=7, ha="center")
        else:
            ax.plot([goal.value, goal.value], [y - 0.42, y + 0.42], color="black", linewidth=2)
            ax.text(goal.value, y + 0.44, goal.text(), fontsize=7, ha="center")
    ax.set_yticks(range(len(ratio_rows)))
    ax.set_yticklabels([r.label for r in reversed(ratio_rows)], fontsize=8)
    ax.set_ylim(-0.6, len(ratio_rows) - 0.4)
    ax.set_xlabel("ratio to the baseline measured in the same run (median over rounds)")
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title(title, fontsize=10)

    if not ms_rows:
        _save(fig, path)
        return
    names, values, goals, missed = [], [], [], []
    for r in ms_rows:
        for column in ("1", "8"):
            for q in ("p50", "p99"):
                cell = r.cells.get(f"{column}.{q}")
                if cell is None or cell.value is None:
                    continue
                names.append(f"{q}, {column} producer{'s' if column == '8' else ''}")
                values.append(cell.value)
                goals.append(cell.goal.value)
                missed.append(cell.met is False)
    xs = range(len(values))
    lat.bar(xs, values, color=["#C44E52" if m else "#55A868" for m in missed])
    for x, g, v in zip(xs, goals, values):
        lat.plot([x - 0.4, x + 0.4], [g, g], color="black", linewidth=2)
        lat.text(x, v, f"{v:.1f}", ha="center", va="bottom", fontsize=8)
    lat.set_xticks(list(xs))
    lat.set_xticklabels(names, fontsize=8)
    lat.set_ylabel("EndTxn ms (black: goal)")
    _save(fig, path)


def _save(fig: Any, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
