"""The publish/subscribe API of query processes (DESIGN §5, §6), re-exported by `querylib`.

    execute(main)         run main(ctx) once per worker of this process (TQ_* from the executor,
                          or a one-process query when run directly)
    connect()             a Context for plain scripts and notebooks
    Context.publish(name, partition=PerWorker | Merge | Hash(k), kind=..., serde=...)
                          -> Publisher: send(time, records, headers=, event_time=),
                          advance_to(time), close(); a record may be a Record (key, headers,
                          timestamp)
    Context.subscribe(name or names, partitions=, start=, timeout=, serde=, group=, records=)
                          -> Subscription yielding Snapshot (collections), Data, Progress,
                          EndOfStream
    submit(fn, processes=, workers=, args=, wait=)
                          -> SubmittedQuery: run fn(ctx, *args) as a query (cloudpickle over
                          the authenticated session); query_id, info(), wait(), kill()
    serdes                bytes, json, msgpack; pickle only by name

    _env.py            TQ_* variables;  _partitioning.py  PerWorker / Merge / Hash
    _runtime.py        the process's session, catalog entries, shared producers
    _publisher.py      Publisher;  _subscription.py  Subscription;  _events.py  its events
    _context.py        Context, execute, connect
    _submit.py         submit, SubmittedQuery;  _runner.py  the submitted program's main

Must not: carry data through the coordinator (data goes to brokers), import coordinator/
or executor/, or load at import time what registering a query process does not need.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from querylib._lazy import lazy_exports

# Names are loaded on first use (PEP 562, querylib/_lazy.py): a query process imports only
# what it touches.
if TYPE_CHECKING:
    from . import serdes
    from ._context import Context, connect, execute
    from ._env import QueryEnv
    from ._events import Data, EndOfStream, Progress, Record, Snapshot
    from ._partitioning import Hash, Merge, PerWorker
    from ._publisher import Publisher
    from ._submit import SubmittedQuery, submit
    from ._subscription import Subscription

if not TYPE_CHECKING:  # a type checker reads the imports above, not this
    __getattr__, __dir__, __all__ = lazy_exports(__name__, globals())
