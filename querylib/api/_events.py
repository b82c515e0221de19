"""What `ctx.subscribe` yields: decoded values, and frontiers merged over every partition;
and `Record`, a whole Kafka record (key, value, headers, timestamp, where it is stored), which
publishers accept and subscribers that ask for records get.

Must not: do I/O; the subscription shell builds these.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, cast

import msgspec

__all__ = ["Data", "EndOfStream", "Progress", "Record", "Snapshot"]

Headers = tuple[tuple[str, bytes | None], ...]


class Record:
    """One whole record, as Kafka clients know it: `value` and `key` (values of the topic's
    serde; `key` None for none), `headers` (`(name, bytes)` pairs; a list or a dict is taken
    too) and `timestamp` (the event time, milliseconds since the Unix epoch: the record's
    Kafka timestamp, CreateTime; None: the time it is sent). A subscriber that asks for
    records (`subscribe(..., records=True)`) gets them with `topic`, `partition` and `offset`
    filled in. Compared by value.

    A plain class, not a msgspec Struct or a dataclass, on purpose: the built-in serdes refuse
    to encode it, which is how `Publisher.send` tells Records from values at no cost to a run
    of plain values (a Struct would be encoded as a map, silently)."""

    __slots__ = ("headers", "key", "offset", "partition", "timestamp", "topic", "value")
    __match_args__ = ("value", "key", "headers", "timestamp")

    def __init__(self, value: Any, key: Any = None,
                 headers: Iterable[tuple[str, bytes | None]] | Mapping[str, bytes | None] = (),
                 timestamp: int | None = None, *, topic: str | None = None,
                 partition: int | None = None, offset: int | None = None) -> None:
        self.value = value
        self.key = key
        self.headers: Headers = headers if type(headers) is tuple else \
            tuple(headers.items() if isinstance(headers, Mapping)
                  else cast("Iterable[tuple[str, bytes | None]]", map(tuple, headers)))
        self.timestamp = timestamp
        self.topic = topic
        self.partition = partition
        self.offset = offset

    def _fields(self) -> tuple[Any, ...]:
        return (self.value, self.key, self.headers, self.timestamp, self.topic, self.partition,
                self.offset)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Record):
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]  # its value may be a list or a dict

    def __repr__(self) -> str:
        shown = [repr(self.value)]
        for name in ("key", "headers", "timestamp", "topic", "partition", "offset"):
            value = getattr(self, name)
            if value is not None and value != ():
                shown.append(f"{name}={value!r}")
        return f"Record({', '.join(shown)})"


class Data(msgspec.Struct, frozen=True):
    """Decoded records of one partition with the same logical time: values, or `Record`s for
    a subscriber that asked for records. For a collection topic each record is a
    `(value, diff)` pair. `epoch` is the run of the topic's publisher they
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
