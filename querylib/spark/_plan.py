"""Planning reads: which partitions, which offset ranges, how many Spark tasks.

Pure functions over what a `TopicAccess` reports (topics, partition counts, offset ranges):
resolve a subscription to partitions, resolve earliest/latest/explicit offsets, cap a
micro-batch (Kafka's proportional rate limit), and cut ranges into tasks. Streaming offsets are
dicts `{"topic": {"0": 23, "1": 7}}`: the next offset to read per partition, as Spark stores
them in its offset log.
"""

from __future__ import annotations

import heapq
import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from catalog.errors import UnknownTopicError
from querylib.spark._errors import BadOptionError, DataLossError
from querylib.spark._options import EARLIEST, LATEST, OffsetSpec, Subscription

__all__ = [
    "OffsetRange",
    "Offsets",
    "TopicAccess",
    "end_offsets",
    "from_offsets_dict",
    "rate_limit",
    "resolve_partitions",
    "split_ranges",
    "start_offsets",
    "to_offsets_dict",
]

Partition = tuple[str, int]
Offsets = dict[Partition, int]


class TopicAccess(Protocol):
    """What planning needs to know about the topics (a local data dir, or a cluster)."""

    def topics(self) -> dict[str, int]: ...
    def partitions(self, topic: str) -> int: ...
    def offset_range(self, topic: str, partition: int) -> tuple[int, int]: ...


@dataclass(frozen=True)
class OffsetRange:
    """Offsets [start, stop) of one partition."""

    topic: str
    partition: int
    start: int
    stop: int


def resolve_partitions(subscription: Subscription, access: TopicAccess) -> list[Partition]:
    """The partitions a subscription covers now, sorted. Named topics must exist."""
    if subscription.pattern is not None:
        pattern = re.compile(subscription.pattern)
        return sorted((topic, p) for topic, count in access.topics().items()
                      if pattern.fullmatch(topic) for p in range(count))
    if subscription.assigned:
        counts: dict[str, int] = {}
        for topic, partition in subscription.assigned:
            if topic not in counts:
                counts[topic] = access.partitions(topic)
            if partition >= counts[topic]:
                raise UnknownTopicError(f"topic {topic!r} has {counts[topic]} partitions; "
                                        f"partition {partition} does not exist")
        return sorted(subscription.assigned)
    return sorted((topic, p) for topic in subscription.topics
                  for p in range(access.partitions(topic)))


def start_offsets(spec: OffsetSpec, partitions: list[Partition], access: TopicAccess, *,
                  fail_on_data_loss: bool) -> Offsets:
    """Where reading starts, per partition: earliest, latest or the given offset."""
    _check_known(spec, partitions, "startingOffsets")
    out: Offsets = {}
    for topic, partition in partitions:
        first, end = access.offset_range(topic, partition)
        wanted = spec.for_partition(topic, partition)
        if wanted == EARLIEST:
            out[(topic, partition)] = first
        elif wanted == LATEST:
            out[(topic, partition)] = end
        elif wanted < first:
            if fail_on_data_loss:
                raise DataLossError(
                    f"startingOffsets: {topic}-{partition} offset {wanted} is no longer in the "
                    f"log (it starts at {first}); set failOnDataLoss=false to start there")
            out[(topic, partition)] = first
        elif wanted > end:
            raise BadOptionError(f"startingOffsets: {topic}-{partition} offset {wanted} is past "
                                 f"the log's end {end}")
        else:
            out[(topic, partition)] = wanted
    return out


def end_offsets(spec: OffsetSpec, partitions: list[Partition], access: TopicAccess) -> Offsets:
    """Where a batch read stops (exclusive), per partition: latest or the given offset."""
    _check_known(spec, partitions, "endingOffsets")
    out: Offsets = {}
    for topic, partition in partitions:
        _first, end = access.offset_range(topic, partition)
        wanted = spec.for_partition(topic, partition)
        if wanted == LATEST:
            out[(topic, partition)] = end
        elif wanted > end:
            raise BadOptionError(f"endingOffsets: {topic}-{partition} offset {wanted} is past "
                                 f"the log's end {end}")
        else:
            out[(topic, partition)] = wanted
    return out


def _check_known(spec: OffsetSpec, partitions: list[Partition], name: str) -> None:
    known = set(partitions)
    for key in spec.offsets:
        if key not in known:
            raise BadOptionError(f"{name} names {key[0]}-{key[1]}, which this query does not "
                                 "read; name only subscribed partitions")


def rate_limit(start: Mapping[Partition, int], latest: Mapping[Partition, int],
               limit: int) -> Offsets:
    """Cap a micro-batch at `limit` offsets in all, shared in proportion to what each partition
    has available (Kafka's maxOffsetsPerTrigger). `start` holds every partition of `latest`."""
    available = {p: max(0, latest[p] - start[p]) for p in latest}
    total = sum(available.values())
    if total <= limit:
        return dict(latest)
    shares = {p: limit * n // total for p, n in available.items()}
    # Hand out what flooring left over, largest remainders first, so the cap is met exactly.
    left = limit - sum(shares.values())
    by_remainder = sorted(available, key=lambda p: (-(limit * available[p] % total), p))
    for p in by_remainder[:left]:
        shares[p] += 1
    return {p: start[p] + min(shares[p], available[p]) for p in latest}


def split_ranges(ranges: list[OffsetRange], max_records: int,
                 min_partitions: int = 1) -> list[OffsetRange]:
    """Cut ranges into tasks of at most `max_records` offsets, and into exactly
    `min_partitions` tasks when that asks for more (and there are that many offsets): each extra
    task goes to the range whose pieces are currently largest, and every range is cut into even
    pieces. Empty ranges are dropped."""
    work = [r for r in ranges if r.stop > r.start]
    sizes = [r.stop - r.start for r in work]
    pieces = [-(-n // max_records) for n in sizes]
    extra = min(min_partitions, sum(sizes)) - sum(pieces)
    heap = [(-n / p, i) for i, (n, p) in enumerate(zip(sizes, pieces, strict=True))]
    heapq.heapify(heap)
    while extra > 0 and heap:
        _, i = heapq.heappop(heap)
        if pieces[i] < sizes[i]:
            pieces[i] += 1
            extra -= 1
            heapq.heappush(heap, (-sizes[i] / pieces[i], i))
    out: list[OffsetRange] = []
    for r, n, count in zip(work, sizes, pieces, strict=True):
        bounds = [r.start + n * i // count for i in range(count + 1)]
        out.extend(OffsetRange(r.topic, r.partition, a, b)
                   for a, b in itertools.pairwise(bounds))
    return out


def to_offsets_dict(offsets: Mapping[Partition, int]) -> dict[str, dict[str, int]]:
    """Spark's offset form: {"topic": {"0": 23}}, sorted so equal offsets print equal."""
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = offset
    return out


def from_offsets_dict(offsets: Mapping[str, Mapping[str, int]]) -> Offsets:
    """Inverse of to_offsets_dict; BadOptionError for a malformed one (a foreign checkpoint)."""
    out: Offsets = {}
    try:
        for topic, per_partition in offsets.items():
            for partition, offset in per_partition.items():
                out[(str(topic), int(partition))] = int(offset)
    except (AttributeError, TypeError, ValueError):
        raise BadOptionError(f"offsets {str(offsets)[:80]} are not tq offsets "
                             '({"topic": {"0": 23}}); is the checkpoint from another source?') \
            from None
    return out
