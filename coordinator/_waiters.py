"""Requests waiting for a topic to appear (a blocking subscribe or lookup), with deadlines.

The one place pending requests wait. Keyed by the topic's canonical name, so a change that
creates topics wakes exactly the requests waiting for them. Deadlines are checked against the
time given (`expired(now)`); a woken or expired waiter leaves every index at once (heap entries
are dropped lazily). Bounded: the core refuses new waiters past `limit`.

Must not: read clocks, answer requests (the core does), do I/O.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Waiter", "Waiters"]


@dataclass(eq=False)
class Waiter:
    token: Any
    request: Any
    name: str              # canonical topic name it waits for
    deadline: float
    session_id: int | None
    peer: bytes = b""
    principal: str = "admin"  # who asked: the request runs again as them
    done: bool = field(default=False)


class Waiters:
    __slots__ = ("_by_name", "_count", "_heap", "_seq")

    def __init__(self) -> None:
        self._by_name: dict[str, list[Waiter]] = {}
        self._heap: list[tuple[float, int, Waiter]] = []
        self._seq = itertools.count()
        self._count = 0

    def add(self, waiter: Waiter) -> None:
        self._by_name.setdefault(waiter.name, []).append(waiter)
        heapq.heappush(self._heap, (waiter.deadline, next(self._seq), waiter))
        self._count += 1

    def take(self, name: str) -> list[Waiter]:
        """Every waiter for `name`, in arrival order; they leave."""
        waiters = self._by_name.pop(name, [])
        for waiter in waiters:
            self._finish(waiter)
        return waiters

    def take_session(self, session_id: int) -> list[Waiter]:
        """Every waiter of a session that ended; they leave. O(waiters), on session end only."""
        gone = [w for ws in self._by_name.values() for w in ws if w.session_id == session_id]
        for waiter in gone:
            self._remove(waiter)
        return gone

    def expired(self, now: float) -> list[Waiter]:
        """Waiters whose deadline passed by `now`, earliest first; they leave."""
        out: list[Waiter] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, _, waiter = heapq.heappop(heap)
            if waiter.done:
                continue
            self._remove(waiter)
            out.append(waiter)
        return out

    def _remove(self, waiter: Waiter) -> None:
        waiters = self._by_name.get(waiter.name)
        if waiters is not None:
            waiters.remove(waiter)
            if not waiters:
                del self._by_name[waiter.name]
        self._finish(waiter)

    def _finish(self, waiter: Waiter) -> None:
        waiter.done = True
        self._count -= 1
        if not self._count:
            self._heap.clear()  # only stale entries left

    def __len__(self) -> int:
        return self._count
