"""What the two copiers (``copier_confluent.py``, ``copier_kafka_python.py``) share: their exit
codes, their log line and their command line. Imported as a sibling module: the copiers run as
scripts."""

from __future__ import annotations

import argparse
import os
import threading
import time
from typing import Callable, TypeVar

FATAL = 2  # fenced, or an error the client cannot recover from: a restarted copier takes over
STUCK = 3  # a client call blocked past the watchdog's limit: a restarted copier takes over
CRASHED = 9  # --crash-after-txn: ended as a kill would
STUCK_AFTER_S = 30

T = TypeVar("T")


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} copier[{os.getpid()}] {message}", flush=True)


class Watchdog(threading.Thread):
    """Ends the process when one call blocks longer than ``stuck_after_s``: a wedged client is
    restarted, as an application would restart it."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.call: tuple[str, float] | None = None
        self.stuck_after_s: float = STUCK_AFTER_S

    def run(self) -> None:
        while True:
            time.sleep(0.5)
            call = self.call
            if call is not None and time.monotonic() - call[1] > self.stuck_after_s:
                log(f"{call[0]} blocked for more than {self.stuck_after_s}s: exiting for a new copier to take over")
                os._exit(STUCK)


WATCHDOG = Watchdog()


def watched(what: str, step: Callable[[], T]) -> T:
    """``step()``, under the watchdog (started by the copier's ``main``)."""
    WATCHDOG.call = (what, time.monotonic())
    try:
        return step()
    finally:
        WATCHDOG.call = None


def pause_before_commit(args: argparse.Namespace) -> None:
    """--pause-ms: the transaction stays open this long before its commit, so the copier keeps a
    known pace whatever the machine's speed, and a kill at a random moment mostly finds a
    transaction open, its records written and its offsets sent."""
    if args.pause_ms:
        time.sleep(args.pause_ms / 1000)


def crash_if_due(args: argparse.Namespace, transactions: int) -> None:
    """--crash-after-txn N: end the process right after the N-th commit, before anything else."""
    if transactions == args.crash_after_txn:
        log(f"crashing after transaction {transactions}")
        os._exit(CRASHED)


def arguments(argv: list[str] | None = None, **extra: dict) -> argparse.Namespace:
    """The copier's command line; ``extra``: a client's own options (name → add_argument's keywords)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--transactional-id", required=True)
    ap.add_argument("--ends", required=True, help="the input's end offset per partition, comma-separated")
    ap.add_argument("--max-batch", type=int, default=200)
    ap.add_argument("--offsets-outside", action="store_true")
    ap.add_argument("--crash-after-txn", type=int, default=0)
    ap.add_argument("--pause-ms", type=int, default=0, help="keep each transaction open this long before its commit")
    ap.add_argument("--stuck-after-s", type=float, default=None, help="the watchdog's limit, instead of the client's own")
    for name, options in extra.items():
        ap.add_argument(f"--{name}", **options)
    args = ap.parse_args(argv)
    args.ends = [int(e) for e in args.ends.split(",")]
    return args
