"""The frontier of one partition: the minimum over its live producers (DESIGN §5).

Pure bookkeeping, no I/O: the broker feeds it producer events and appends a control batch for
every `FrontierAdvanced` or `StreamEnded` it returns. The frontier is a logical time (int) below
which no more data will arrive; it only moves forward.

Rules:
- A producer joins at the partition's current frontier (it may not send data for earlier times).
- A producer's own frontier only advances; moving it back is a protocol error.
- A producer that ends (end-of-stream) or is dropped (its lease expired) leaves the minimum, so a
  crashed producer no longer holds readers back.
- When the last live producer ends cleanly, the partition reaches end-of-stream. A producer that
  is merely dropped never ends the stream: a restarted producer may join and go on.
"""

from __future__ import annotations

from dataclasses import dataclass

from catalog.errors import ProtocolError


@dataclass(frozen=True, slots=True)
class FrontierAdvanced:
    frontier: int


@dataclass(frozen=True, slots=True)
class StreamEnded:
    pass


FrontierEvent = FrontierAdvanced | StreamEnded


class FrontierRegressionError(ProtocolError):
    """A producer tried to move its frontier backwards."""


class PartitionFrontier:
    """Tracks the live producers of one partition and the frontier they jointly allow."""

    def __init__(self, frontier: int = 0, *, ended: bool = False) -> None:
        self._published = frontier
        self._ended = ended
        self._producers: dict[str, int] = {}

    @property
    def frontier(self) -> int:
        """The last frontier published for this partition."""
        return self._published

    @property
    def ended(self) -> bool:
        return self._ended

    @property
    def producers(self) -> dict[str, int]:
        return dict(self._producers)

    def join(self, producer: str) -> None:
        """A producer starts writing; it begins at the published frontier."""
        if producer not in self._producers:
            self._producers[producer] = self._published
            self._ended = False

    def advance(self, producer: str, frontier: int) -> list[FrontierEvent]:
        current = self._require(producer)
        if frontier < current:
            raise FrontierRegressionError(
                f"producer {producer!r} moved its frontier back from {current} to {frontier}"
            )
        self._producers[producer] = frontier
        return self._recompute()

    def end(self, producer: str) -> list[FrontierEvent]:
        """The producer closed its stream: it leaves, and the stream ends if it was the last."""
        self._require(producer)
        del self._producers[producer]
        if self._producers:
            return self._recompute()
        self._ended = True
        return [StreamEnded()]

    def drop(self, producer: str) -> list[FrontierEvent]:
        """The producer vanished (lease expired): it leaves the minimum without ending the
        stream."""
        if self._producers.pop(producer, None) is None:
            return []
        return self._recompute()

    def _require(self, producer: str) -> int:
        try:
            return self._producers[producer]
        except KeyError:
            raise ProtocolError(f"producer {producer!r} has not joined this partition") from None

    def _recompute(self) -> list[FrontierEvent]:
        if not self._producers:
            return []
        low = min(self._producers.values())
        if low > self._published:
            self._published = low
            return [FrontierAdvanced(low)]
        return []
