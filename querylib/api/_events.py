"""What `ctx.subscribe` yields: decoded values, and frontiers merged over every partition.

Must not: do I/O; the subscription shell builds these.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["Data", "EndOfStream", "Progress", "Snapshot"]


class Data(msgspec.Struct, frozen=True):
    """Decoded records of one partition with the same logical time. For a collection topic
    each record is a `(value, diff)` pair."""

    time: int | None
    records: list[Any]
    partition: int = 0


class Progress(msgspec.Struct, frozen=True):
    """No more data with a time below `frontier` will arrive on any subscribed partition."""

    frontier: int


class Snapshot(msgspec.Struct, frozen=True):
    """A collection's consolidated contents below `frontier`: `(value, count)` pairs with
    non-zero counts. Comes first on a collection subscription; diffs follow as Data."""

    frontier: int
    records: list[tuple[Any, int]]


class EndOfStream(msgspec.Struct, frozen=True):
    """Every subscribed partition ended."""
