"""`querylib.execute(main)` and `querylib.connect()`: a query process and its workers' Context.

    def main(ctx):
        with ctx.publish("numbers", partition=PerWorker) as out:
            out.send(0, range(ctx.index * 100, (ctx.index + 1) * 100))
            out.advance_to(1)

    if __name__ == "__main__":
        querylib.execute(main)

`execute` reads TQ_* (see _env), opens one coordinator session for the process (a query
session bound to TQ_QUERY_ID and TQ_PROCESS_INDEX, or a client session when run directly),
waits until every process of the query has registered (the start barrier: no worker runs
while a sibling process is still starting; the coordinator fails the query at its start
timeout) and runs `main(ctx)` once per worker, on threads when TQ_WORKERS > 1. `connect()`
gives a plain script or notebook one Context on a client session.

Must not: parse command lines or touch stdout; the caller owns both.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from catalog import SessionKind, TopicKind
from catalog.errors import UserError
from querylib.cluster import Cluster

from ._env import QueryEnv, set_process_title
from ._partitioning import Partitioning, PerWorker, partition_count
from ._runtime import Runtime

if TYPE_CHECKING:
    # Loaded by publish/subscribe, not here: a process registers before it needs them (their
    # record codecs and broker clients are most of its start; DESIGN §6 "Query process start").
    from ._publisher import Publisher
    from ._subscription import Start, Subscription
    from .serdes import Serde

__all__ = ["Context", "connect", "execute"]


class Context:
    """What one worker uses: its identity, `publish` and `subscribe`."""

    def __init__(self, runtime: Runtime, worker: int, *, owns_runtime: bool = False) -> None:
        self.runtime = runtime
        self.worker = worker
        self._owns_runtime = owns_runtime
        env = runtime.env
        self.index = env.process * env.workers + worker  # this worker among all of the query
        self.peers = env.processes * env.workers
        self.process = env.process
        self.processes = env.processes
        self.query_id = env.query_id

    def publish(self, name: str, *, partition: Partitioning = PerWorker,
                kind: TopicKind | str = TopicKind.STREAM, serde: str | Serde = "msgpack",
                record_type: str | None = None, replication: int | None = None) -> Publisher:
        """Create or join topic `name` and return this worker's Publisher. Merge and Hash
        publications are collective: every worker of the query must publish them.
        `replication`: copies of each partition when this creates the topic (None: the
        cluster's default, 1 with one executor host, else min(3, hosts)); an existing topic
        keeps its own."""
        from ._publisher import Publisher
        from .serdes import resolve, type_tag

        codec = resolve(serde)
        env = self.runtime.env
        kind = TopicKind(kind)
        partitions = partition_count(partition, env.processes, env.workers)
        info = self.runtime.join_topic(name, partitions, type_tag(codec, record_type), kind,
                                       replication)
        epoch = self.runtime.add_publication(info.topic.name)
        info = msgspec.structs.replace(info, epoch=epoch)
        try:
            return Publisher(self.runtime, self.worker, info, partition, codec)
        except BaseException:
            self.runtime.remove_publication(info.topic.name)
            raise

    def subscribe(self, names: str | list[str], *, partitions: list[int] | None = None,
                  start: Start = "earliest", timeout: float = 30.0,
                  serde: str | Serde | None = None, record_type: str | None = None,
                  kind: TopicKind | str | None = None, group: str | None = None,
                  records: bool = False) -> Subscription:
        """Events of the topics, all partitions merged; waits up to `timeout` seconds for a
        topic that does not exist yet (UnknownTopicError after that). `start` is "earliest",
        "latest", an offset (every partition) or {partition: offset}; a collection is always
        read from the start, as a Snapshot and then diffs.

        With `group`, this subscriber is a member of that Kafka consumer group: it reads the
        partitions the group assigns it, from the group's committed offsets (else `start`;
        start="committed" falls back to "earliest"), commits what it consumed every second
        and on close, and leaves the group on close. Delivery is at-least-once.

        Values are decoded with the serde the topic records (the first part of its record type
        tag), so a subscriber need not repeat the publisher's `serde`; pickle is never chosen
        that way (unpickling runs the writers' code: pass serde="pickle" if you trust them),
        and topics of different serdes need one subscription each. An explicit `serde` must
        match the topic's (RecordTypeMismatchError otherwise).

        With `records=True` each Data's records are whole `Record`s (key and value decoded by
        the serde, headers, timestamp, topic, partition, offset) instead of values; not for
        collections."""
        from ._subscription import Subscription
        from .serdes import resolve

        if isinstance(names, str):
            names = [names]
        if not names:
            raise UserError("subscribe to at least one topic")
        if timeout <= 0:
            raise UserError("timeout is a positive number of seconds")
        if start == "committed" and group is None:
            raise UserError('start="committed" reads a consumer group\'s offsets: pass group=')
        if group is not None and not group:
            raise UserError("a consumer group needs a non-empty name")
        return Subscription(self.runtime, list(names), partitions=partitions, start=start,
                            timeout=timeout,
                            serde=None if serde is None else resolve(serde),
                            record_type=record_type,
                            kind=None if kind is None else TopicKind(kind), group=group,
                            records=records)

    def close(self) -> None:
        """Close the session of a Context made by `connect()`."""
        if self._owns_runtime:
            self.runtime.close()

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _open(env: QueryEnv, coordinator: str | None, **options: Any) -> Runtime:
    if env.query_id is not None:
        options.update(kind=SessionKind.QUERY, query_id=env.query_id, process=env.process)
    # connect(secret_file=...) names the file itself; the environment's is only the default.
    options.setdefault("secret_file", env.secret_file)
    cluster = Cluster.connect(coordinator or env.coordinator, **options)
    return Runtime(cluster, env)


def connect(coordinator: str | None = None, **options: Any) -> Context:
    """One Context on a client session, for scripts and notebooks (close it, or use `with`)."""
    env = QueryEnv(None, 0, 1, 1, coordinator, None, None)
    return Context(_open(env, coordinator, **options), 0, owns_runtime=True)


def execute(main: Callable[[Context], Any], *, env: dict[str, str] | None = None) -> list[Any]:
    """Run `main(ctx)` once per worker of this process (threads when TQ_WORKERS > 1); returns
    their results in worker order. The first worker failure (in time: the cause, where later
    ones may be its consequences) is raised after all finished."""
    query_env = QueryEnv.read(env)
    if env is None:  # this process's own variables: it is the query's process
        set_process_title()
    runtime = _open(query_env, None)
    if query_env.query_id is not None:
        try:
            # The start barrier (DESIGN §6): QueryFailedError if the query failed first.
            runtime.cluster.await_start(query_env.query_id)
        except BaseException:
            runtime.close()
            raise
    results: list[Any] = [None] * query_env.workers
    errors: list[BaseException] = []  # in the order they happened (list.append is atomic)

    def run(worker: int) -> None:
        try:
            results[worker] = main(Context(runtime, worker))
        except BaseException as exc:  # handed to the caller below
            errors.append(exc)

    try:
        if query_env.workers == 1:
            run(0)
        else:
            threads = [threading.Thread(target=run, args=(w,), name=f"tq-worker {w}")
                       for w in range(query_env.workers)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    finally:
        runtime.close()
    if errors:
        raise errors[0]
    return results
