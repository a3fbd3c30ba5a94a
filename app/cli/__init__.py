"""The ``txlog`` command line. ``app.cli.root`` assembles the commands; this module stays light so
that the command modules (and ``spark.cli``) can import their shared parts without a cycle."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Run ``txlog`` with ``argv`` (default: the process's arguments); answer the exit code."""
    from app.cli.root import main as run

    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
