"""What `ctx.subscribe` yields: decoded values, and frontiers merged over every partition.

Must not: do I/O; the subscription shell builds these.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["Data", "EndOfStream", "Progress", "Snapshot"]


class Data(msgspec.Struct, frozen=True):
    """Decoded records of one partition with the same logical time. For a collection topic
    each record is a `(value, diff)` pair. `epoch` is the run of the topic's publisher they
    come from: 0 for the first, higher for each later run that started its times again
    (DESIGN §5 "Epochs"); shown only when not 0."""

    time: int | None
    records: list[Any]
    partition: int = 0
    epoch: int = 0

    def __repr__(self) -> str:
        epoch = f", epoch={self.epoch}" if self.epoch else ""
        return (f"Data(time={self.time!r}, records={self.records!r}, "
                f"partition={self.partition!r}{epoch})")


class Progress(msgspec.Struct, frozen=True, repr_omit_defaults=True):
    """No more data with a time below `frontier` will arrive on any subscribed partition: in
    `epoch`, and nothing more of an earlier epoch (times order by (epoch, time))."""

    frontier: int
    epoch: int = 0


class Snapshot(msgspec.Struct, frozen=True, repr_omit_defaults=True):
    """A collection's consolidated contents below `frontier` (of `epoch`): `(value, count)`
    pairs with non-zero counts. Comes first on a collection subscription; diffs follow as
    Data."""

    frontier: int
    records: list[tuple[Any, int]]
    epoch: int = 0


class EndOfStream(msgspec.Struct, frozen=True):
    """Every subscribed partition ended."""
