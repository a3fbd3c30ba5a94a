"""Geometry of the pages' inline SVG drawings, computed here and drawn by the templates: the
partition bar (log start, last stable offset, high watermark), the records/s chart and a
transaction's state timeline. Pure functions of the data; no I/O."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime

from api.admin.fmt import duration
from app.domain.log import PartitionStatus
from app.domain.transactions import TxnEvent, TxnState
from app.services.inspect.rates import RatePoint

# --- partition bar --------------------------------------------------------------------------------

BAR_WIDTH = 1000.0  # viewBox units; the bar stretches to its cell
MIN_VISIBLE = 6.0  # a non-empty segment is never thinner than this


@dataclass(frozen=True)
class Segment:
    x: float
    width: float
    cls: str
    title: str


@dataclass(frozen=True)
class PartitionBar:
    segments: list[Segment]
    lso_x: float | None  # where the last stable offset sits, when it is below the high watermark
    hw_x: float


def _offsets(lo: int, hi: int) -> str:
    return f"offset {lo}" if hi - lo == 1 else f"offsets {lo}–{hi - 1}"


def partition_bar(p: PartitionStatus, scale: int) -> PartitionBar:
    """Offsets 0..``scale`` across the bar (``scale``: the largest high watermark of the topic, so
    a topic's partitions compare at a glance). Removed [0, log start), readable by read_committed
    [log start, LSO), waiting for a transaction [LSO, HW)."""
    scale = max(scale, p.high_watermark, 1)

    def x(offset: int) -> float:
        return BAR_WIDTH * offset / scale

    waiting = p.high_watermark - p.last_stable_offset
    spans = [
        (0, p.log_start_offset, "seg-removed", f"{_offsets(0, p.log_start_offset)}: removed (below the log start offset)"),
        (
            p.log_start_offset,
            p.last_stable_offset,
            "seg-stable",
            f"{_offsets(p.log_start_offset, p.last_stable_offset)}: stable, readable by read_committed consumers",
        ),
        (
            p.last_stable_offset,
            p.high_watermark,
            "seg-unstable",
            f"{_offsets(p.last_stable_offset, p.high_watermark)}: {waiting} record{'s' if waiting != 1 else ''} "
            "above the last stable offset, waiting for an open transaction",
        ),
    ]
    present = [(lo, hi, cls, title) for lo, hi, cls, title in spans if hi > lo]
    widths = [max(x(hi) - x(lo), MIN_VISIBLE) for lo, hi, _, _ in present]
    target = min(max(x(p.high_watermark), MIN_VISIBLE * len(present)), BAR_WIDTH)
    excess = sum(widths) - target
    if excess > 0 and widths:
        widest = widths.index(max(widths))
        widths[widest] -= excess  # the thin segments keep their minimum; the widest gives way
    segments: list[Segment] = []
    cursor = 0.0
    for (_lo, _hi, cls, title), w in zip(present, widths):
        segments.append(Segment(round(cursor, 2), round(w, 2), cls, title))
        cursor += w
    hw_x = segments[-1].x + segments[-1].width if segments else 0.0
    unstable = next((s for s in segments if s.cls == "seg-unstable"), None)
    return PartitionBar(segments, unstable.x if unstable else None, hw_x)


# --- records/s chart ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    partial: bool
    title: str


@dataclass(frozen=True)
class RateChart:
    width: int
    height: int
    plot_left: int
    plot_top: int
    plot_width: int
    plot_height: int
    bars: list[Bar]
    grid: list[tuple[float, str]]  # (y, label)
    xlabels: list[tuple[float, str]]  # (x, label)
    peak: float
    current: float
    total: int


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 × 10^k at or above ``value`` (at least 1)."""
    if value <= 1:
        return 1.0
    exp = math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        candidate = step * 10**exp
        if candidate >= value - 1e-9:
            return float(candidate)
    return float(10 ** (exp + 1))


def _hhmm(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%H:%M")


def _rate_label(v: float) -> str:
    return f"{v:g}" if v < 10 else f"{v:,.0f}"


def rate_chart(points: list[RatePoint], width: int = 560, height: int = 150) -> RateChart:
    left, top, right, bottom = 40, 10, 8, 22
    pw, ph = width - left - right, height - top - bottom
    rates = [p.per_second for p in points]
    peak = max(rates, default=0.0)
    ceiling = nice_ceiling(peak)
    n = max(len(points), 1)
    slot = pw / n
    gap = min(4.0, slot * 0.2)
    bars = []
    for i, p in enumerate(points):
        h = ph * p.per_second / ceiling
        if p.records and h < 1.5:
            h = 1.5
        partial = i == len(points) - 1
        title = (
            f"{_hhmm(p.start_ms)}–{_hhmm(p.end_ms)} UTC{' (so far)' if partial else ''}: "
            f"{p.records:,} records, {p.per_second:.2f}/s"
        )
        bars.append(
            Bar(round(left + i * slot + gap / 2, 2), round(top + ph - h, 2), round(slot - gap, 2), round(h, 2), partial, title)
        )
    grid = [(round(top + ph - ph * f, 2), _rate_label(ceiling * f)) for f in (0, 0.5, 1)]
    xlabels = []
    for i, p in enumerate(points):
        if i % 5 == 0 or i == len(points) - 1:
            xlabels.append((round(left + i * slot + slot / 2, 2), "now" if i == len(points) - 1 else _hhmm(p.start_ms)))
    return RateChart(
        width, height, left, top, pw, ph, bars, grid, xlabels, peak, rates[-1] if rates else 0.0, sum(p.records for p in points)
    )


# --- transaction timeline -------------------------------------------------------------------------

STEP = 118  # horizontal distance between two events
PAD_LEFT = 56
PAD_RIGHT = 150
LINE_Y = 44


@dataclass(frozen=True)
class Node:
    x: float
    state: str
    version: int
    at_ms: int
    delta_ms: int | None  # since the previous event
    epoch: str | None  # "pid 1004 · epoch 3", shown where the producer id or epoch changed
    note: str | None  # partitions/groups added, result, reason
    title: str
    note_y: int = 0  # below the line; staggered when the previous step has a note too


@dataclass(frozen=True)
class Span:
    x1: float
    x2: float
    state: str
    label: str
    current: bool


@dataclass(frozen=True)
class Timeline:
    width: int
    height: int
    line_y: int
    nodes: list[Node]
    spans: list[Span]
    hidden: int  # older steps left out
    deadline_x: float | None
    deadline_label: str | None


def _note(run: list[TxnEvent]) -> str | None:
    partitions = sum(len(e.partitions_added) for e in run)
    groups = sum(len(e.groups_added) for e in run)
    parts = []
    if partitions:
        parts.append(f"+{partitions} partition{'s' if partitions != 1 else ''}")
    if groups:
        parts.append(f"+{groups} group{'s' if groups != 1 else ''}")
    first = run[0]
    if (
        first.to_state in (TxnState.PREPARE_ABORT, TxnState.PREPARE_COMMIT)
        and first.reason
        and first.from_state is TxnState.ONGOING
    ):
        parts.append(first.reason.replace("_", " "))
    return ", ".join(parts) or None


def _runs(events: list[TxnEvent]) -> list[list[TxnEvent]]:
    """Consecutive events that stay in one state (an Ongoing transaction adding partitions) are
    one step of the timeline."""
    runs: list[list[TxnEvent]] = []
    for e in events:
        if runs and e.to_state is runs[-1][-1].to_state and e.from_state is e.to_state:
            runs[-1].append(e)
        else:
            runs.append([e])
    return runs


def timeline(events: list[TxnEvent], now_ms: int, deadline_ms: int | None = None, max_steps: int = 24) -> Timeline:
    """State changes left to right, evenly spaced (their times differ by milliseconds or by days);
    each span is coloured by the state held and labelled with how long it was held. The last span
    runs to now; an Ongoing transaction's deadline is marked on it."""
    runs = _runs(events)
    hidden = max(len(runs) - max_steps, 0)
    shown = runs[hidden:]
    nodes: list[Node] = []
    previous: TxnEvent | None = runs[hidden - 1][-1] if hidden else None
    for i, run in enumerate(shown):
        e = run[0]
        changed = previous is None or (e.producer_id, e.producer_epoch) != (previous.producer_id, previous.producer_epoch)
        epoch = f"pid {e.producer_id} · e{e.producer_epoch}" if changed else None
        delta = e.at_ms - previous.at_ms if previous is not None else None
        versions = f"v{e.version}" if len(run) == 1 else f"v{e.version}–v{run[-1].version}"
        title = f"{versions}: {e.from_state.value if e.from_state else '(new)'} → {e.to_state.value}"
        note = _note(run)
        note_y = LINE_Y + (54 if epoch else 39)
        if note and nodes and nodes[-1].note and nodes[-1].note_y == note_y:
            note_y += 14
        nodes.append(Node(PAD_LEFT + i * STEP, e.to_state.value, e.version, e.at_ms, delta, epoch, note, title, note_y))
        previous = run[-1]
    spans: list[Span] = []
    for a, b in zip(nodes, nodes[1:]):
        spans.append(Span(a.x, b.x, a.state, duration(b.at_ms - a.at_ms), False))
    deadline_x = deadline_label = None
    if nodes:
        last = nodes[-1]
        end = last.x + STEP
        spans.append(Span(last.x, end, last.state, f"{duration(max(now_ms - last.at_ms, 0))} so far", True))
        if deadline_ms is not None:
            left = deadline_ms - now_ms
            deadline_label = f"timed out {duration(-left)} ago" if left < 0 else f"times out in {duration(left)}"
            deadline_x = end if left < 0 else last.x + STEP * 0.75
    width = int(PAD_LEFT + max(len(nodes) - 1, 0) * STEP + STEP + PAD_RIGHT)
    return Timeline(width, 122, LINE_Y, nodes, spans, hidden, deadline_x, deadline_label)
