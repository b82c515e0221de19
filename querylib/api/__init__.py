"""The publish/subscribe API of query processes (DESIGN §5, §6), re-exported by `querylib`.

    execute(main)         run main(ctx) once per worker of this process (TQ_* from the executor,
                          or a one-process query when run directly)
    connect()             a Context for plain scripts and notebooks
    Context.publish(name, partition=PerWorker | Merge | Hash(k), kind=..., serde=...)
                          -> Publisher: send(time, records), advance_to(time), close()
    Context.subscribe(name or names, partitions=, start=, timeout=, serde=)
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

Must not: carry data through the coordinator (data goes to brokers), or import coordinator/
or executor/.
"""

from querylib.api import serdes
from querylib.api._context import Context, connect, execute
from querylib.api._env import QueryEnv
from querylib.api._events import Data, EndOfStream, Progress, Snapshot
from querylib.api._partitioning import Hash, Merge, PerWorker
from querylib.api._publisher import Publisher
from querylib.api._submit import SubmittedQuery, submit
from querylib.api._subscription import Subscription

__all__ = [
    "Context",
    "Data",
    "EndOfStream",
    "Hash",
    "Merge",
    "PerWorker",
    "Progress",
    "Publisher",
    "QueryEnv",
    "Snapshot",
    "SubmittedQuery",
    "Subscription",
    "connect",
    "execute",
    "serdes",
    "submit",
]
