"""The cohort rules of the broker's core (`Cohorts`, composed by `BrokerState`; DESIGN §5
"Collective publishing"): settling cohorts by the exits of their query's processes, and saving
the cohorts not done beside the partition log so a restart keeps them waiting.

- `QueryExits` (the catalog's exit codes of a query, fed by the shell): every cohort of that
  query not done yet, on every partition, settles (`PartitionFrontier.settle`); the exits are
  remembered while some process of the query still runs, so a cohort opened later settles at
  once. Remembered for at most `max_query_exits` queries, oldest forgotten first.
- Whenever what a restart must know of a partition's cohorts changes, the state asks the shell
  to save them
  (`SaveCohorts`); the reply to the producer open that changed them waits until that revision
  is on disk, so no writer acts on a cohort a crash could forget.

It owns the exits remembered; the state gives it the partitions map, the limits and a way to
append the control batches a settled cohort releases (`controls(part, events)`), and asks it to
`save` a partition's cohorts whenever a producer's open, end or drop may have changed them.

Must not: do I/O, or know how cohorts are stored (the shell decides, `_cohort_store.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from catalog.errors import StorageError, TqError

from ._bookkeeping import BrokerLimits, PartitionState
from ._events import (
    CohortsSaved,
    CohortsSaveFailed,
    Fail,
    Instruction,
    PartitionId,
    QueryExits,
    Reply,
    SaveCohorts,
)
from ._frontier import FrontierEvent, query_of_cohort

__all__ = ["Cohorts"]


class Cohorts:
    """Cohorts settled by their query's process exits, and saved while not done."""

    def __init__(self, partitions: Mapping[PartitionId, PartitionState], limits: BrokerLimits,
                 controls: Callable[[PartitionState, list[FrontierEvent]], list[Instruction]]
                 ) -> None:
        self._partitions = partitions  # the state's: read only here
        self._limits = limits
        self._controls = controls
        self.exits: dict[int, QueryExits] = {}  # queries with processes still running

    # -- exits of query processes ------------------------------------------------------------

    def query_exits(self, ev: QueryExits) -> list[Instruction]:
        exits = self.exits
        exits.pop(ev.query_id, None)
        if any(code is None for code in ev.exit_codes):
            # Kept while a process may still open a cohort; once all exited none will.
            exits[ev.query_id] = ev
            while len(exits) > self._limits.max_query_exits:
                del exits[next(iter(exits))]
        out: list[Instruction] = []
        # O(partitions x pending cohorts) per reported exit: exits are rare; fine below 10k
        # partitions.
        for part in self._partitions.values():
            names = [g for g in part.frontier.open_cohorts()
                     if query_of_cohort(g) == ev.query_id]
            if names:
                out += self._settle(part, names, ev)
                out += self.save(part)
        return out

    def settle_known(self, part: PartitionState, cohort: str) -> list[Instruction]:
        """A cohort just joined settles by what is known of its query's exits."""
        query_id = query_of_cohort(cohort)
        ev = self.exits.get(query_id) if query_id is not None else None
        return [] if ev is None else self._settle(part, [cohort], ev)

    def _settle(self, part: PartitionState, names: list[str],
                ev: QueryExits) -> list[Instruction]:
        ended = {str(p) for p, code in enumerate(ev.exit_codes) if code is not None}
        events: list[FrontierEvent] = []
        for name in names:
            events += part.frontier.settle(name, ended, failed=ev.failed)
        return self._controls(part, events)

    # -- saving pending cohorts -----------------------------------------------------------------

    def save(self, part: PartitionState, token: Any = None,
             reply: Any = None) -> list[Instruction]:
        """Ask for a save if the cohorts changed since the last one asked. A `token` is
        answered with `reply` once the current revision is on disk."""
        revision = part.frontier.revision
        out: list[Instruction] = []
        if revision != part.cohorts_asked:
            part.cohorts_asked = revision
            out.append(SaveCohorts(part.id, revision, part.frontier.pending()))
        if token is not None:
            if part.cohorts_saved >= revision:
                out.append(Reply(token, reply))
            else:
                part.save_waits.append((revision, token, reply))
        return out

    def saved(self, ev: CohortsSaved) -> list[Instruction]:
        part = self._partitions.get(ev.partition)
        if part is None:
            return []  # dropped meanwhile
        part.cohorts_saved = max(part.cohorts_saved, ev.revision)
        out: list[Instruction] = []
        while part.save_waits and part.save_waits[0][0] <= part.cohorts_saved:
            _, token, reply = part.save_waits.popleft()
            out.append(Reply(token, reply))
        return out

    def save_failed(self, ev: CohortsSaveFailed) -> list[Instruction]:
        part = self._partitions.get(ev.partition)
        if part is None:
            return []
        error = ev.error if isinstance(ev.error, TqError) else StorageError(
            f"saving the cohorts failed: {ev.error}")
        # The next change asks again with everything pending then.
        part.cohorts_asked = part.cohorts_saved
        out: list[Instruction] = []
        while part.save_waits and part.save_waits[0][0] <= ev.revision:
            _, token, _ = part.save_waits.popleft()
            out.append(Fail(token, error))
        return out
