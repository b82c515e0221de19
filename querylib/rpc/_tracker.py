"""Requests in flight and their deadlines, as plain data: no clock, no futures, no I/O.

The client shell allocates an id, `add`s it with its deadline and whatever it needs to finish
the call (a future), `pop`s it when the reply arrives (in any order), and asks `expired(now)`
when its single timer fires. Time is whatever monotonic number the caller passes in.
"""

from __future__ import annotations

import heapq
from typing import Generic, TypeVar

__all__ = ["RequestTracker"]

T = TypeVar("T")


class RequestTracker(Generic[T]):
    """Pending requests keyed by id, with the earliest deadline first.

    Deadlines sit in a heap with lazy deletion: a reply does not search the heap, it only
    forgets the id, and stale heap entries are skipped when they surface. The heap is rebuilt
    when stale entries outnumber live ones, so memory stays O(requests in flight).
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._pending: dict[int, tuple[float, T]] = {}
        self._heap: list[tuple[float, int]] = []
        self._last_id = 0

    def __len__(self) -> int:
        return len(self._pending)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._pending

    def next_id(self) -> int:
        """A fresh id, never 0 (0 marks messages that answer nothing, i.e. notifies)."""
        self._last_id += 1
        return self._last_id

    def add(self, request_id: int, deadline: float, entry: T) -> None:
        """Track `request_id` until `deadline`. The caller bounds how many are in flight."""
        if request_id in self._pending:
            raise ValueError(f"request id {request_id} is already in flight")
        if len(self._pending) >= self.capacity:
            raise OverflowError(f"{self.capacity} requests already in flight")
        self._pending[request_id] = (deadline, entry)
        heapq.heappush(self._heap, (deadline, request_id))
        if len(self._heap) > 2 * len(self._pending) + 64:
            self._compact()

    def pop(self, request_id: int) -> T | None:
        """Stop tracking `request_id`; its entry, or None if unknown, answered or expired."""
        item = self._pending.pop(request_id, None)
        return None if item is None else item[1]

    def expired(self, now: float) -> list[tuple[int, T]]:
        """Remove and return (id, entry) of every request whose deadline is <= now."""
        out: list[tuple[int, T]] = []
        heap, pending = self._heap, self._pending
        while heap and heap[0][0] <= now:
            deadline, request_id = heapq.heappop(heap)
            item = pending.get(request_id)
            if item is not None and item[0] == deadline:
                del pending[request_id]
                out.append((request_id, item[1]))
        return out

    def entries(self) -> list[T]:
        """The entries of everything in flight, left in flight."""
        return [entry for _, entry in self._pending.values()]

    def clear(self) -> list[tuple[int, T]]:
        """Remove and return (id, entry) of everything in flight (the client is closing)."""
        out = [(rid, entry) for rid, (_, entry) in self._pending.items()]
        self._pending.clear()
        self._heap.clear()
        return out

    def next_deadline(self) -> float | None:
        """The earliest deadline still pending, or None when nothing is in flight."""
        heap, pending = self._heap, self._pending
        while heap:
            deadline, request_id = heap[0]
            item = pending.get(request_id)
            if item is not None and item[0] == deadline:
                return deadline
            heapq.heappop(heap)
        return None

    def _compact(self) -> None:
        self._heap = [(deadline, rid) for rid, (deadline, _) in self._pending.items()]
        heapq.heapify(self._heap)
