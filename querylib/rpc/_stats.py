"""What an RPC server served: requests and notifies by message type, their errors, and how
long their handlers took, in fixed buckets (DESIGN §13 "Metrics").

Plain counters the server bumps per message (a dict lookup, a bisect over 16 bounds and a few
additions); the metrics endpoint reads them when scraped. Must not: allocate per message
beyond the first of each type, or hold anything but numbers.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

__all__ = ["LATENCY_BUCKETS", "RequestStats", "TypeStats"]

# Upper bounds (seconds) of the handler-time buckets: 100 us to 10 s.
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                   0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(slots=True)
class TypeStats:
    """One message type: how many, how long in all, per bucket, and errors by kind."""

    count: int = 0
    seconds: float = 0.0
    buckets: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    errors: dict[str, int] = field(default_factory=dict)


class RequestStats:
    """Per message tag (`coord.query.kill`, `broker.produce`, ...)."""

    def __init__(self) -> None:
        self.types: dict[str, TypeStats] = {}

    def record(self, tag: str, seconds: float, error: str | None = None) -> None:
        stats = self.types.get(tag)
        if stats is None:
            stats = self.types[tag] = TypeStats()
        stats.count += 1
        stats.seconds += seconds
        stats.buckets[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        if error is not None:
            stats.errors[error] = stats.errors.get(error, 0) + 1
