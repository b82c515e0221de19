"""How a publication maps workers to partitions: PerWorker, Merge, Hash(k).

    PerWorker   one partition per worker (P processes x W workers = P*W partitions); the
                worker of process p with index w writes partition w*P + p, so partition i
                belongs to process i mod P, which is where the coordinator places it
    Merge       one partition; every worker of the query writes to it
    Hash(k)     k partitions; every worker writes each record to crc32(key) mod k

Must not: do I/O; it is pure arithmetic on indices.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from catalog.errors import UserError

__all__ = ["Hash", "Merge", "PerWorker", "Partitioning", "partition_count"]


@dataclass(frozen=True)
class _PerWorker:
    def __repr__(self) -> str:
        return "PerWorker"


@dataclass(frozen=True)
class _Merge:
    def __repr__(self) -> str:
        return "Merge"


PerWorker = _PerWorker()
Merge = _Merge()


def _identity(record: Any) -> Any:
    return record


@dataclass(frozen=True)
class Hash:
    """k partitions by key; `key(record)` (default: the record itself) is encoded with the
    topic's serde and hashed with CRC-32, so every process agrees on the partition."""

    partitions: int
    key: Callable[[Any], Any] = field(default=_identity, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.partitions, int) or self.partitions < 1:
            raise UserError(f"Hash(k) needs k >= 1 partitions, not {self.partitions!r}")

    def partition_of(self, key_bytes: bytes) -> int:
        """The partition of a record whose key encodes to `key_bytes`."""
        return zlib.crc32(key_bytes) % self.partitions


Partitioning = _PerWorker | _Merge | Hash


def partition_count(partitioning: Partitioning, processes: int, workers: int) -> int:
    """How many partitions a publication of a query of `processes` x `workers` has."""
    if isinstance(partitioning, _PerWorker):
        return processes * workers
    if isinstance(partitioning, _Merge):
        return 1
    if isinstance(partitioning, Hash):
        return partitioning.partitions
    raise UserError(f"partition= takes PerWorker, Merge or Hash(k), not {partitioning!r}")


def per_worker_partition(process: int, worker: int, processes: int) -> int:
    return worker * processes + process
