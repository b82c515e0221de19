"""Process slots of one executor: how many query processes it runs at once. Pure bookkeeping,
no I/O: the agent reserves a slot before it fetches and spawns, and releases it when the
process's exit is reported (or the spawn failed).

A slot is one query process, whatever its worker threads do. Streaming processes mostly wait
on I/O (brokers, the coordinator, the network), so a host runs several per core: the default
is `default_slots()`, four per core and at least eight, so that a 2-core machine runs the
README's examples and the demo side by side. The coordinator places a query only where its
processes fit the free slots; one that does not fit waits, pending (DESIGN §6).

A slot is held by a key, the (query id, process index) it runs. Reserving a key twice is a
duplicate spawn request, refused with ProcessExistsError so the retry of a request cannot
take a second slot; releasing a key that holds nothing is a no-op (exit paths may overlap).
"""

from __future__ import annotations

from collections.abc import Hashable

from ._errors import NoFreeSlotsError, ProcessExistsError

__all__ = ["Slots", "default_slots"]

SLOTS_PER_CORE = 4
MIN_SLOTS = 8


def default_slots(cores: int | None = None) -> int:
    """Process slots of an executor not told how many: four per core, at least eight."""
    return max(MIN_SLOTS, SLOTS_PER_CORE * max(cores or 1, 1))


class Slots:
    """`total` slots; at most one per key."""

    def __init__(self, total: int) -> None:
        if total < 1:
            raise ValueError("an executor needs at least one slot")
        self.total = total
        self._held: set[Hashable] = set()

    @property
    def used(self) -> int:
        return len(self._held)

    @property
    def free(self) -> int:
        return self.total - len(self._held)

    def holds(self, key: Hashable) -> bool:
        return key in self._held

    def held(self) -> frozenset[Hashable]:
        return frozenset(self._held)

    def reserve(self, key: Hashable) -> None:
        """Take a slot for `key`: ProcessExistsError if it holds one, NoFreeSlotsError if
        none is free."""
        if key in self._held:
            raise ProcessExistsError(f"{key!r} holds a slot already")
        if len(self._held) >= self.total:
            raise NoFreeSlotsError(f"all {self.total} process slots of this executor are in "
                                   "use")
        self._held.add(key)

    def release(self, key: Hashable) -> bool:
        """Give `key`'s slot back; False if it held none."""
        if key in self._held:
            self._held.remove(key)
            return True
        return False
