"""Session leases and query-process bindings: pure bookkeeping with time as an input.

Every session holds a lease: it stays open while its holder renews the lease (any request from
the session renews it; heartbeats exist for idle holders). `Leases.expired(now)` hands out the
sessions whose lease ran out, each once. Leases live only here, in the coordinator's memory:
after a restart every session the catalog holds gets a fresh lease, so a holder that comes back
within that lease keeps its session id and everything the session owns.

A query-process session is bound to (query, process). The binding travels in the Session
record's `peer` ("query 3 process 1: <peer>"), so it survives a restart with the catalog; the
catalog has no field for it yet (see the report: a `Session.query`/`process` pair would be
cleaner than parsing).

Must not: read clocks, do I/O, know about the catalog's rules.
"""

from __future__ import annotations

import heapq
import re

from catalog import Session

__all__ = ["Leases", "binding_of", "bound_peer"]

_BINDING = re.compile(r"^query (\d{1,18}) process (\d{1,9}): ")


def bound_peer(query_id: int, process: int, peer: str) -> str:
    """The `peer` of a query-process session: the binding, then what the client said."""
    return f"query {query_id} process {process}: {peer}"


def binding_of(session: Session) -> tuple[int, int] | None:
    """(query id, process index) of a query-process session, else None."""
    if session.kind != "query":
        return None
    match = _BINDING.match(session.peer)
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2))


class Leases:
    """Lease length and expiry time of each open session.

    At most one live heap entry per session, never later than its expiry: a renewal only moves
    the expiry time later, and the entry is checked (and pushed back with the new time) when it
    reaches the top. So renewals cost O(1) and `expired(now)` O(k log n) for k entries due.
    """

    __slots__ = ("_expires", "_heap", "_heaped", "_lengths")

    def __init__(self) -> None:
        self._expires: dict[int, float] = {}
        self._lengths: dict[int, float] = {}
        self._heap: list[tuple[float, int]] = []
        self._heaped: dict[int, float] = {}  # session -> the time of its live heap entry

    def grant(self, session_id: int, length: float, now: float) -> None:
        """Start (or restart) a lease of `length` seconds."""
        expires = now + length
        self._lengths[session_id] = length
        self._expires[session_id] = expires
        self._push(session_id, expires)

    def _push(self, session_id: int, at: float) -> None:
        queued = self._heaped.get(session_id)
        if queued is None or at < queued:  # a later entry would be checked too late
            self._heaped[session_id] = at
            heapq.heappush(self._heap, (at, session_id))

    def renew(self, session_id: int, now: float, length: float | None = None) -> float:
        """Extend a held lease from `now`; returns its length. KeyError if not held."""
        if length is None:
            length = self._lengths[session_id]
        elif session_id not in self._expires:
            raise KeyError(session_id)
        self._lengths[session_id] = length
        self._expires[session_id] = max(self._expires[session_id], now + length)
        return length

    def forget(self, session_id: int) -> None:
        """The session closed: it has no lease any more (its heap entry is dropped lazily)."""
        self._expires.pop(session_id, None)
        self._lengths.pop(session_id, None)

    def expired(self, now: float) -> list[int]:
        """Sessions whose lease ran out by `now`, oldest first; they are forgotten."""
        out: list[int] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            at, session_id = heapq.heappop(heap)
            if self._heaped.get(session_id) != at:
                continue  # superseded by an earlier entry
            del self._heaped[session_id]
            expires = self._expires.get(session_id)
            if expires is None:
                continue  # closed meanwhile
            if expires > now:
                self._push(session_id, expires)  # renewed since it was pushed
                continue
            self.forget(session_id)
            out.append(session_id)
        return out

    def next_expiry(self) -> float | None:
        """A lower bound of the next expiry (renewals may have moved it later)."""
        return self._heap[0][0] if self._heap else None

    def length(self, session_id: int) -> float:
        return self._lengths[session_id]

    def expires_at(self, session_id: int) -> float:
        return self._expires[session_id]

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._expires

    def __len__(self) -> int:
        return len(self._expires)
