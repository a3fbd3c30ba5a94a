"""What the client commands share: finding the server (``--url`` / ``$TXLOG_URL``, ``--token`` /
``$TXLOG_TOKEN``), ``--json``, tables, progress lines, and exit codes that say what went wrong.

Exit codes:
  0  done
  1  the server answered with an error (its Kafka name and code are printed on stderr), or records
     were not delivered
  2  the command line is wrong
  3  the server could not be reached or did not answer in time
  4  an optional dependency is missing (PySpark for ``txlog spark``)
  130 interrupted
"""

from __future__ import annotations

import functools
import sys
import time
from typing import Any, Callable, Iterable, Sequence

import click
import orjson
from rich.console import Console
from rich.table import Table

from txlog._http import Transport
from txlog.errors import KafkaError, KafkaException

EXIT_OK = 0
EXIT_SERVER_ERROR = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_MISSING_DEPENDENCY = 4
EXIT_INTERRUPTED = 130

EXIT_CODES_HELP = (
    "Exit codes: 0 done; 1 the server answered with an error (its name on stderr) or records were not "
    "delivered; 2 wrong usage; 3 server unreachable or no answer in time; 4 an optional dependency is "
    "missing; 130 interrupted."
)


class Client:
    """The command's connection settings and output mode (``ctx.obj``)."""

    def __init__(self, url: str | None, token: str | None, as_json: bool) -> None:
        self.url = url
        self.token = token
        self.json = as_json
        self._transport: Transport | None = None

    @property
    def http(self) -> Transport:
        if self._transport is None:
            self._transport = Transport(self.url, self.token)
        return self._transport

    def config(self, **extra: Any) -> dict[str, Any]:
        """A Producer/Consumer configuration that reaches the same server."""
        conf: dict[str, Any] = {"url": self.http.url}
        if self.token:
            conf["token"] = self.token
        conf.update({k.replace("_", "."): v for k, v in extra.items() if v is not None})
        return conf

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


def client_command(fn: Callable[..., int | None]) -> Callable[..., int]:
    """The options every client command takes, and the translation of its failures into exit
    codes. The wrapped function receives the ``Client`` as its first argument."""

    @click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts instead of tables.")
    @click.option(
        "--token",
        envvar="TXLOG_TOKEN",
        default=None,
        metavar="TOKEN",
        help="Bearer token sent to the server (default: $TXLOG_TOKEN).",
    )
    @click.option(
        "--url",
        "--bootstrap-server",
        "url",
        envvar="TXLOG_URL",
        default=None,
        metavar="URL",
        help="The server (default: $TXLOG_URL, else http://127.0.0.1:8080).",
    )
    @functools.wraps(fn)
    def command(url: str | None, token: str | None, as_json: bool, **kwargs: Any) -> int:
        client = Client(url, token, as_json)
        try:
            return fn(client, **kwargs) or EXIT_OK
        except KafkaException as exc:
            return report(exc.args[0])
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            return EXIT_INTERRUPTED
        finally:
            client.close()

    return command


def report(err: KafkaError) -> int:
    """Print a Kafka error on stderr as ``error: NAME (code N): message`` and answer its exit code."""
    click.echo(f"error: {err.name()} (code {err.code()}): {err.str()}", err=True)
    if err.code() in (KafkaError._TRANSPORT, KafkaError._TIMED_OUT):
        return EXIT_UNREACHABLE
    return EXIT_SERVER_ERROR


# --- output -----------------------------------------------------------------------------------------


def console() -> Console:
    """stdout; when it is not a terminal, wide enough that no table cell is ever wrapped."""
    out = Console(highlight=False, soft_wrap=False)
    if not out.is_terminal:
        out = Console(highlight=False, width=100_000, no_color=True)
    return out


def print_json(data: Any) -> None:
    sys.stdout.buffer.write(orjson.dumps(data, option=orjson.OPT_INDENT_2) + b"\n")
    sys.stdout.flush()


def print_json_line(data: Any) -> None:
    sys.stdout.buffer.write(orjson.dumps(data) + b"\n")


def table(columns: Sequence[str], rows: Iterable[Sequence[Any]], title: str | None = None) -> None:
    """Columns aligned by whitespace, headers in capitals, as Kafka's tools print them."""
    t = Table(box=None, pad_edge=False, show_edge=False, header_style="bold", title=title, title_justify="left")
    for c in columns:
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(*("-" if v is None else str(v) for v in r))
    out = console()
    with out.capture() as captured:
        out.print(t)
    sys.stdout.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))


def fields(pairs: Sequence[tuple[str, Any]]) -> None:
    """One ``name: value`` per line, names aligned."""
    width = max((len(k) for k, _ in pairs), default=0)
    out = console()
    for k, v in pairs:
        out.print(f"{k + ':':<{width + 1}} {'-' if v is None else v}", markup=False)


def ms_ago(now_ms: float, at_ms: int | None) -> str | None:
    if at_ms is None:
        return None
    return duration(max(int(now_ms - at_ms), 0))


def duration(ms: int) -> str:
    s = ms / 1000
    if s < 60:
        return f"{s:.1f}s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"


def now_ms() -> float:
    return time.time() * 1000


# --- progress ----------------------------------------------------------------------------------------


class Progress:
    """Progress of a long run on stderr: a live line when stderr is a terminal, else (when asked
    for with ``--progress``) a plain line every ``interval_s`` and one at the end."""

    def __init__(self, verb: str, enabled: bool | None, interval_s: float = 1.0) -> None:
        self.verb = verb
        err = Console(stderr=True, highlight=False)
        self.live = err.is_terminal and enabled is not False
        self.enabled = self.live or bool(enabled)
        self.interval_s = interval_s
        self.count = 0
        self.started = time.monotonic()
        self._last_shown = self.started
        self._status = err.status("") if self.live else None
        if self._status is not None:
            self._status.start()

    def _line(self) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        return f"{self.verb} {self.count} records ({self.count / elapsed:,.0f}/s, {elapsed:.1f}s)"

    def advance(self, n: int = 1) -> None:
        self.count += n
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last_shown >= (0.1 if self.live else self.interval_s):
            self._last_shown = now
            if self._status is not None:
                self._status.update(self._line())
            else:
                click.echo(self._line(), err=True)

    def finish(self) -> None:
        if self._status is not None:
            self._status.stop()
        if self.enabled:
            click.echo(self._line(), err=True)


def parse_pairs(values: Iterable[str], what: str) -> list[tuple[str, str]]:
    """``k=v`` options (``--config``, ``--header``) as pairs, in order."""
    out = []
    for v in values:
        key, sep, value = v.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{v!r} is not KEY=VALUE", param_hint=what)
        out.append((key, value))
    return out
