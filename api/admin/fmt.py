"""The formatting vocabulary the pages share: times in UTC, durations, numbers, transaction
states, and record bytes shown as text, JSON or binary."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from datetime import UTC, datetime

from app.domain.records import CONTROL_NAMES


def ts(ms: int | None, with_ms: bool = False) -> str:
    if ms is None:
        return "—"
    dt = datetime.fromtimestamp(ms / 1000, UTC)
    return dt.strftime("%Y-%m-%d %H:%M:%S") + (f".{ms % 1000:03d}" if with_ms else "")


def clock(ms: int | None, with_ms: bool = True) -> str:
    if ms is None:
        return "—"
    dt = datetime.fromtimestamp(ms / 1000, UTC)
    return dt.strftime("%H:%M:%S") + (f".{ms % 1000:03d}" if with_ms else "")


def iso(ms: int | None) -> str:
    if ms is None:
        return ""
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def duration(ms: int | float | None) -> str:
    """Short and human: 850 ms, 4.2 s, 3m 12s, 4h 03m, 2d 4h."""
    if ms is None:
        return "—"
    ms = int(ms)
    sign = "-" if ms < 0 else ""
    ms = abs(ms)
    if ms < 1000:
        return f"{sign}{ms} ms"
    if ms < 10_000:
        return f"{sign}{ms // 1000}.{ms % 1000 // 100} s"
    s = ms / 1000
    if s < 60:
        return f"{sign}{int(s)} s"
    m, s = divmod(int(s), 60)
    if m < 60:
        return f"{sign}{m}m {s:02d}s"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{sign}{h}h {m:02d}m"
    d, h = divmod(h, 24)
    return f"{sign}{d}d {h}h"


def num(n: int | float | None) -> str:
    if n is None:
        return "—"
    if isinstance(n, float):
        return f"{n:,.2f}" if n < 100 else f"{n:,.0f}"
    return f"{n:,}"


def rate(per_second: float) -> str:
    if per_second == 0:
        return "0/s"
    if per_second < 10:
        return f"{per_second:.2f}/s"
    return f"{per_second:,.0f}/s"


def state_cls(state: str | None) -> str:
    return "state-" + (state or "unknown").lower()


@dataclass(frozen=True)
class Shown:
    """Record bytes as a page shows them."""

    kind: str  # "null", "text", "json", "binary"
    preview: str
    full: str
    size: int

    @property
    def truncated(self) -> bool:
        return self.preview != self.full


PREVIEW_CHARS = 120


def show_bytes(data: bytes | None) -> Shown:
    if data is None:
        return Shown("null", "null", "null", 0)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        b64 = base64.b64encode(data).decode("ascii")
        return Shown("binary", _cut(b64), b64, len(data))
    kind = "text"
    full = text
    stripped = text.strip()
    if stripped[:1] in ("{", "[") and len(text) <= 64_000:
        try:
            full = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
            kind = "json"
        except ValueError:
            pass
    return Shown(kind, _cut(text), full if kind == "json" else text, len(data))


def _cut(text: str) -> str:
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"


def control_name(control_type: int | None) -> str:
    return CONTROL_NAMES.get(control_type, f"type {control_type}") if control_type is not None else ""
