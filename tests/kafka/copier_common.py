"""What the two copiers (``copier_confluent.py``, ``copier_kafka_python.py``) share: their exit
codes, their log line and their command line. Imported as a sibling module: the copiers run as
scripts."""

from __future__ import annotations

import argparse
import os
import time

FATAL = 2  # fenced, or an error the client cannot recover from: a restarted copier takes over
CRASHED = 9  # --crash-after-txn: ended as a kill would


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} copier[{os.getpid()}] {message}", flush=True)


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
    for name, options in extra.items():
        ap.add_argument(f"--{name}", **options)
    args = ap.parse_args(argv)
    args.ends = [int(e) for e in args.ends.split(",")]
    return args
