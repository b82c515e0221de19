"""Looking up queries in the catalog and waiting for one to end, for `querylib.submit`'s handle
and the `tq submit/logs/kill/status` commands.

Both read the `queries` collection (a snapshot, then diffs) from the catalog topics, so they
open no session and change nothing. Must not: ask the coordinator to act on a query.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from catalog import Query, UnknownQueryError

from ._errors import QueryTimeoutError
from ._follow import Diff, Snapshot

__all__ = ["find_query", "resolve_query", "wait_for_exits", "wait_for_query_end"]

_POLL = 0.2  # seconds between looks at whether to stop waiting for exits


def find_query(cluster: Any, query_id: int, *, timeout: float = 30.0) -> Query:
    """The catalog's record of query `query_id`; UnknownQueryError if there is none."""
    snapshot = cluster.snapshot("queries", timeout=timeout)["queries"]
    for record, _ in snapshot.records:
        if isinstance(record, Query) and record.query_id == query_id:
            return record
    raise UnknownQueryError(f"no query {query_id} (see `tq status` for the queries there are)")


def resolve_query(cluster: Any, ref: str | int, *, timeout: float = 30.0) -> Query:
    """The query `ref` names: an id (digits), else a name, which means the newest query of
    that name (names repeat: each run of a program is a new query). UnknownQueryError if
    there is none."""
    if isinstance(ref, int) or ref.isdigit():
        return find_query(cluster, int(ref), timeout=timeout)
    snapshot = cluster.snapshot("queries", timeout=timeout)["queries"]
    named = [r for r, _ in snapshot.records if isinstance(r, Query) and r.name == ref]
    if not named:
        raise UnknownQueryError(f"no query named {ref!r} (see `tq status` for the queries "
                                "there are)")
    return max(named, key=lambda q: q.query_id)


def wait_for_query_end(cluster: Any, query_id: int, *, timeout: float | None = None) -> Query:
    """The query's record once it has ended (finished, failed or killed), following the
    `queries` collection of a blocking Cluster. UnknownQueryError if the catalog has no such
    query; QueryTimeoutError if it has not ended within `timeout` seconds (None: forever)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    known = False
    with cluster.follow("queries") as follower:
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise QueryTimeoutError(f"query {query_id} has not ended within {timeout:g}s")
            event = follower.next_event(left)
            if isinstance(event, Snapshot):
                updates = event.records
            elif isinstance(event, Diff):
                updates = [(r, d) for r, d in event.updates if d > 0]
            else:
                continue
            for record, _ in updates:
                if isinstance(record, Query) and record.query_id == query_id:
                    known = True
                    if record.ended:
                        return record
            if isinstance(event, Snapshot) and not known:
                # Ids are never reused and the snapshot is at least as new as our question.
                raise UnknownQueryError(f"no query {query_id}")


def wait_for_exits(cluster: Any, query_id: int, *, settle: float,
                   interrupted: threading.Event | None = None) -> Query:
    """The query's record once it ended and every process reported its exit, or `settle`
    seconds after it ended (for processes that never will: a lost executor). Returns the
    latest record seen early if `interrupted` is set. UnknownQueryError if there is none."""
    latest: Query | None = None
    settled_by: float | None = None
    with cluster.follow("queries") as follower:
        while True:
            if interrupted is not None and interrupted.is_set() and latest is not None:
                return latest
            left = _POLL if settled_by is None else min(_POLL, settled_by - time.monotonic())
            if left <= 0:
                assert latest is not None
                return latest
            event = follower.next_event(left)
            if isinstance(event, Snapshot):
                records = [r for r, _ in event.records]
            elif isinstance(event, Diff):
                records = [r for r, d in event.updates if d > 0]
            else:
                continue
            for record in records:
                if isinstance(record, Query) and record.query_id == query_id:
                    latest = record
            if isinstance(event, Snapshot) and latest is None:
                raise UnknownQueryError(f"no query {query_id}")
            if latest is not None and latest.ended:
                if all(code is not None for code in latest.exit_codes):
                    return latest
                if settled_by is None:
                    settled_by = time.monotonic() + settle
