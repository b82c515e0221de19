"""One asyncio lock per key, kept exactly as long as some task holds or waits for it.

    locks: KeyedLock[PartitionId] = KeyedLock()
    async with locks.hold(pid):          # one task at a time per pid
        ...
    pid in locks                         # a task holds or waits for pid's lock

Why not `dict.setdefault(key, asyncio.Lock())` and a `pop` after the `async with`: the holder
that pops it lets the key go while another task still waits on that lock, and a third task
arriving before the waiter runs makes a new lock and goes in at once, beside the waiter. Here
a key's lock is forgotten only when its last holder or waiter is done.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Hashable
from contextlib import asynccontextmanager
from typing import Generic, TypeVar

__all__ = ["KeyedLock"]

K = TypeVar("K", bound=Hashable)


class KeyedLock(Generic[K]):
    def __init__(self) -> None:
        self._locks: dict[K, tuple[asyncio.Lock, list[int]]] = {}  # key -> (lock, [users])

    def __contains__(self, key: object) -> bool:
        return key in self._locks

    def __len__(self) -> int:
        return len(self._locks)

    @asynccontextmanager
    async def hold(self, key: K) -> AsyncIterator[None]:
        """Hold `key`'s lock for the block (FIFO among the tasks asking for it)."""
        entry = self._locks.get(key)
        if entry is None:
            entry = self._locks[key] = (asyncio.Lock(), [0])
        lock, users = entry
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if users[0] == 0:
                del self._locks[key]
