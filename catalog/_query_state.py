"""The query life cycle as a table keyed by (state, event).

    pending --place--> submitted                              (free slots took its processes)
    pending --kill--> killed
    pending --fail--> failed                                  (its start timeout passed)
    submitted --start--> running
    submitted | running --last_process_exited--> finished   (every process exited 0)
    submitted | running --process_failed | fail--> failed   (a non-zero exit, a lost executor,
                                                              a spawn that failed)
    submitted | running --kill--> killed

A pending query has no process yet (none placed, none started): it waits, in submission order,
for enough free process slots, so no exit can be reported for it.

Exits keep arriving after a query failed or was killed (the coordinator terminates the remaining
processes), so failed and killed absorb exit events: the record collects every exit code. A pair
missing from the table is an error (QueryStateError), never a silent no-op: killing a finished
query, starting a running one, or any event on a finished query.

The catalog classifies an exit report into an event (`classify_exit`) before looking up the
table, so the table itself stays a plain dict that tests can walk pair by pair.

Must not: touch records or collections; this is only the table.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

from catalog._records import QueryState
from catalog.errors import QueryStateError

__all__ = ["QUERY_TRANSITIONS", "QueryEvent", "classify_exit", "next_query_state"]


class QueryEvent(enum.StrEnum):
    PLACE = "place"  # a pending query's processes got executors with free slots
    START = "start"  # every process of the query registered
    PROCESS_EXITED = "process_exited"  # exit code 0, other processes still running
    LAST_PROCESS_EXITED = "last_process_exited"  # exit code 0, and no process is left running
    PROCESS_FAILED = "process_failed"  # a non-zero exit code (or killed by a signal)
    KILL = "kill"  # `tq kill`
    FAIL = "fail"  # the coordinator gave up: lost executor, spawn or registration failure


_S = QueryState
_E = QueryEvent

QUERY_TRANSITIONS: dict[tuple[QueryState, QueryEvent], QueryState] = {
    (_S.PENDING, _E.PLACE): _S.SUBMITTED,
    (_S.PENDING, _E.KILL): _S.KILLED,
    (_S.PENDING, _E.FAIL): _S.FAILED,
    (_S.SUBMITTED, _E.START): _S.RUNNING,
    (_S.SUBMITTED, _E.PROCESS_EXITED): _S.SUBMITTED,
    (_S.SUBMITTED, _E.LAST_PROCESS_EXITED): _S.FINISHED,
    (_S.SUBMITTED, _E.PROCESS_FAILED): _S.FAILED,
    (_S.SUBMITTED, _E.KILL): _S.KILLED,
    (_S.SUBMITTED, _E.FAIL): _S.FAILED,
    (_S.RUNNING, _E.PROCESS_EXITED): _S.RUNNING,
    (_S.RUNNING, _E.LAST_PROCESS_EXITED): _S.FINISHED,
    (_S.RUNNING, _E.PROCESS_FAILED): _S.FAILED,
    (_S.RUNNING, _E.KILL): _S.KILLED,
    (_S.RUNNING, _E.FAIL): _S.FAILED,
    # After the end: only record the exit codes of the processes being torn down.
    (_S.FAILED, _E.PROCESS_EXITED): _S.FAILED,
    (_S.FAILED, _E.LAST_PROCESS_EXITED): _S.FAILED,
    (_S.FAILED, _E.PROCESS_FAILED): _S.FAILED,
    (_S.KILLED, _E.PROCESS_EXITED): _S.KILLED,
    (_S.KILLED, _E.LAST_PROCESS_EXITED): _S.KILLED,
    (_S.KILLED, _E.PROCESS_FAILED): _S.KILLED,
}


def next_query_state(state: QueryState, event: QueryEvent) -> QueryState:
    """The state after `event`; QueryStateError if the table has no such pair."""
    try:
        return QUERY_TRANSITIONS[(state, event)]
    except KeyError:
        raise QueryStateError(
            f"a {state.value} query does not accept {event.value!r}", state.value, event.value
        ) from None


def classify_exit(exit_codes: Sequence[int | None], process: int, exit_code: int) -> QueryEvent:
    """The event an exit report is: `exit_codes` is the record before this process's exit."""
    if exit_code != 0:
        return QueryEvent.PROCESS_FAILED
    others_running = any(code is None for index, code in enumerate(exit_codes) if index != process)
    return QueryEvent.PROCESS_EXITED if others_running else QueryEvent.LAST_PROCESS_EXITED
