"""Multisets updated by (record, diff) pairs: the shape of every catalog collection.

A collection maps each distinct record to a positive multiplicity. Updates add `diff` to a
record's multiplicity; a record whose multiplicity reaches zero leaves. A batch that would drive
any multiplicity below zero is refused whole (the catalog never retracts what it did not insert,
so a negative count means the updates are corrupt).

Must not: know about catalog invariants (those live in `_catalog`/`_invariants`), do I/O.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator
from typing import Generic, TypeVar

import msgspec

from catalog.errors import CorruptCatalogError

__all__ = ["Collection", "consolidate"]

R = TypeVar("R", bound=Hashable)


def consolidate(updates: Iterable[tuple[R, int]]) -> list[tuple[R, int]]:
    """Sum the diffs of equal records and drop the zeros. Keeps first-seen order."""
    sums: dict[R, int] = {}
    for record, diff in updates:
        sums[record] = sums.get(record, 0) + diff
    return [(record, diff) for record, diff in sums.items() if diff != 0]


def _sort_key(record: object) -> bytes:
    # A total, type-agnostic and stable order: the record's msgpack bytes. Catalog records are
    # msgspec Structs, so this is defined for every collection the catalog holds.
    return msgspec.msgpack.encode(record)


class Collection(Generic[R]):
    """A multiset of hashable records. Iteration yields each distinct record once."""

    __slots__ = ("_counts",)

    def __init__(self, updates: Iterable[tuple[R, int]] = ()) -> None:
        self._counts: dict[R, int] = {}
        self.apply(updates)

    def check(self, updates: Iterable[tuple[R, int]]) -> list[tuple[R, int]]:
        """The consolidated batch, if applying it keeps every multiplicity >= 0.

        Raises CorruptCatalogError otherwise. Changes nothing either way.
        """
        batch = consolidate(updates)
        for record, diff in batch:
            if self._counts.get(record, 0) + diff < 0:
                raise CorruptCatalogError(
                    f"retracting {-diff} of {record!r}, which has multiplicity "
                    f"{self._counts.get(record, 0)}"
                )
        return batch

    def apply(self, updates: Iterable[tuple[R, int]]) -> None:
        """Add each diff to its record's multiplicity, all or nothing.

        Raises CorruptCatalogError (and changes nothing) if a multiplicity would go negative.
        """
        for record, diff in self.check(updates):
            count = self._counts.get(record, 0) + diff
            if count:
                self._counts[record] = count
            else:
                del self._counts[record]

    def count(self, record: R) -> int:
        return self._counts.get(record, 0)

    def __contains__(self, record: object) -> bool:
        return record in self._counts

    def __iter__(self) -> Iterator[R]:
        return iter(self._counts)

    def __len__(self) -> int:
        """The number of distinct records."""
        return len(self._counts)

    def items(self) -> Iterator[tuple[R, int]]:
        """(record, multiplicity) pairs, in insertion order."""
        return iter(self._counts.items())

    def snapshot(self) -> list[tuple[R, int]]:
        """The consolidated contents as (record, multiplicity), in a deterministic order.

        Two equal collections give equal snapshots however they were built, so a snapshot can be
        written to a compacted topic and compared byte for byte.
        """
        return sorted(self._counts.items(), key=lambda item: _sort_key(item[0]))

    def copy(self) -> Collection[R]:
        clone: Collection[R] = Collection()
        clone._counts = dict(self._counts)
        return clone

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Collection):
            return NotImplemented
        return self._counts == other._counts

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"Collection({self.snapshot()!r})"
