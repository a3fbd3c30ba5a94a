"""What a background job's rounds report (the sweeper's, the half-message checker's)."""

from __future__ import annotations

from typing import Self


class RoundReport:
    """A round's counts, which its job adds up into its totals. ``more_due`` (the round left items
    due: the next round should not wait) is each round's own and is not added."""

    more_due: bool

    def add(self, other: Self) -> None:
        for name, value in vars(other).items():
            if name != "more_due":
                setattr(self, name, getattr(self, name) + value)
