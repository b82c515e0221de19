"""What the console shows, as plain data: the catalog's collections and sampled figures in,
views out (DESIGN §13 "Console").

`ClusterModel` holds the collections the console follows (executors, brokers, queries,
topics, publications, subscriptions) as the catalog's events leave them, plus samples: each
executor's load (the coordinator's `GetLoads`) and each partition's offsets, bytes and frontier
(its broker's `ListPartitions`), each with the time it was taken. `view()` turns them into one
JSON-ready dict: the overview, the dataflow graph (queries and topics as nodes, publications
and subscriptions as edges, each topic edge with its rate), every query with its processes,
every topic with its partitions and a rate history, and every executor's recent load.

Rates are differences of successive samples of a partition's end offset over the time between
them; a history keeps the last `HISTORY` samples. Must not: do I/O, read a clock (times come
in with the samples), or hold anything it cannot rebuild from the catalog and new samples.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from catalog import (
    Executor,
    Publication,
    Query,
    QueryRef,
    Record,
    SessionRef,
    Subscription,
    Topic,
    TopicName,
)
from catalog.errors import InvalidTopicNameError

__all__ = ["COLLECTIONS", "HISTORY", "ClusterModel", "PartitionSample", "SubscriptionSample"]

# The catalog collections the console follows.
# `users` only to check logins (their credential generations), never shown.
COLLECTIONS = ("executors", "brokers", "queries", "topics", "publications", "subscriptions",
               "users")
HISTORY = 120  # samples kept per topic and per executor (at one per second or two: minutes)


@dataclass(frozen=True, slots=True)
class PartitionSample:
    """One partition as its broker reported it at `at` (seconds, any monotonic clock)."""

    topic: str
    partition: int
    log_start: int
    log_end: int
    size: int
    frontier: int
    ended: bool


@dataclass(frozen=True, slots=True)
class SubscriptionSample:
    """One subscription as its broker reported it: whose, and the next offset it gets."""

    topic: str
    partition: int
    principal: str
    next_offset: int


@dataclass(slots=True)
class _Rate:
    """A topic's records per second, from two successive samples of its end offsets."""

    last_end: int | None = None
    last_at: float = 0.0
    rate: float = 0.0
    history: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=HISTORY))

    def sample(self, end: int, at: float) -> None:
        if self.last_end is not None and at > self.last_at:
            self.rate = max(0, end - self.last_end) / (at - self.last_at)
            self.history.append((at, self.rate))
        self.last_end, self.last_at = end, at


class ClusterModel:
    """The collections, the samples, and the views made of them (see the module docstring)."""

    def __init__(self) -> None:
        self.collections: dict[str, dict[Record, int]] = {name: {} for name in COLLECTIONS}
        self.versions: dict[str, int] = {}
        self.loads: dict[int, Any] = {}                    # executor id -> HostLoad
        self.load_history: dict[int, deque[tuple[float, float, int]]] = {}
        self.partitions: dict[tuple[str, int], PartitionSample] = {}
        self.rates: dict[str, _Rate] = {}
        # (end offset, frontier) of each partition at each sample: which logical time a
        # subscription's position is at, for its lag in logical time
        self.frontiers: dict[tuple[str, int], deque[tuple[int, int]]] = {}
        self.subscriptions: list[SubscriptionSample] = []
        self.groups: list[dict[str, Any]] = []  # GroupService.overview()
        self.changes = 0  # bumped by every change a view could show

    # -- what comes in ------------------------------------------------------------------------

    def replace(self, collection: str, version: int,
                records: Iterable[tuple[Record, int]]) -> None:
        """A snapshot of `collection`: its whole contents."""
        self.collections[collection] = {r: n for r, n in records if n > 0}
        self.versions[collection] = version
        self.changes += 1

    def update(self, collection: str, version: int,
               updates: Iterable[tuple[Record, int]]) -> None:
        """A diff of `collection`: multiplicities added (or taken away when negative)."""
        contents = self.collections[collection]
        for record, diff in updates:
            count = contents.get(record, 0) + diff
            if count > 0:
                contents[record] = count
            else:
                contents.pop(record, None)
        self.versions[collection] = version
        self.changes += 1

    def set_loads(self, loads: Mapping[int, Any], at: float) -> None:
        """Each executor's last reported load (`HostLoad`), sampled at `at`."""
        self.loads = dict(loads)
        for executor_id, load in loads.items():
            history = self.load_history.setdefault(executor_id, deque(maxlen=HISTORY))
            history.append((at, load.cpu_percent, load.memory_used))
        self.changes += 1

    def set_partitions(self, samples: Iterable[PartitionSample], at: float) -> None:
        """Partitions as one broker reported them at `at` (others keep their last sample)."""
        ends: dict[str, int] = {}
        for sample in samples:
            key = (sample.topic, sample.partition)
            self.partitions[key] = sample
            marks = self.frontiers.setdefault(key, deque(maxlen=HISTORY))
            if not marks or marks[-1] != (sample.log_end, sample.frontier):
                marks.append((sample.log_end, sample.frontier))
        for (topic, _), sample in self.partitions.items():
            ends[topic] = ends.get(topic, 0) + sample.log_end
        for topic, end in ends.items():
            self.rates.setdefault(topic, _Rate()).sample(end, at)
        self.changes += 1

    def set_subscriptions(self, samples: Iterable[SubscriptionSample]) -> None:
        """Every broker's subscriptions, as sampled in one round."""
        self.subscriptions = list(samples)
        self.changes += 1

    def set_groups(self, groups: list[dict[str, Any]]) -> None:
        """The consumer groups as the group coordinator describes them."""
        self.groups = groups
        self.changes += 1

    def lag(self, sub: SubscriptionSample) -> tuple[int, int | None]:
        """(records, logical time) a subscription is behind (see `behind`)."""
        return self.behind((sub.topic, sub.partition), sub.next_offset)

    def behind(self, key: tuple[str, int], position: int) -> tuple[int, int | None]:
        """(records, logical time) `position` is behind its partition's visible end. The
        logical time is the frontier now less the frontier at the newest sample whose end was
        at or before the position (None: nothing sampled that far back)."""
        part = self.partitions.get(key)
        if part is None:
            return 0, None
        records = max(0, part.log_end - position)
        if records == 0:
            return 0, 0
        at = None
        for end, frontier in reversed(self.frontiers.get(key, ())):
            if end <= position:
                at = frontier
                break
        return records, None if at is None else max(0, part.frontier - at)

    # -- what goes out ------------------------------------------------------------------------

    def records(self, collection: str) -> list[Any]:
        return list(self.collections[collection])

    def view(self) -> dict[str, Any]:
        """Everything the pages show, JSON-ready."""
        topics = {t.topic_id: t for t in self.records("topics")}
        queries = sorted(self.records("queries"), key=lambda q: q.query_id)
        executors = sorted(self.records("executors"), key=lambda e: e.executor_id)
        by_state: dict[str, int] = {}
        for query in queries:
            by_state[str(query.state)] = by_state.get(str(query.state), 0) + 1
        topic_views = [self._topic(t) for t in sorted(topics.values(), key=lambda t: t.name)]
        user_topics = [t for t in topic_views if not t["internal"]]
        return {
            "versions": dict(self.versions),
            "overview": {
                "executors": len(executors),
                "queries": by_state,
                "topics": len(user_topics),
                "records_per_s": round(sum(t["records_per_s"] for t in user_topics), 1),
            },
            "executors": [self._executor(e) for e in executors],
            "brokers": [{"broker_id": b.broker_id, "host": b.host, "address": b.address,
                         "kafka": b.kafka_address}
                        for b in sorted(self.records("brokers"), key=lambda b: b.broker_id)],
            "queries": [self._query(q) for q in queries],
            "topics": topic_views,
            "graph": self._graph(topics, queries),
            "groups": [self._group(g) for g in sorted(self.groups,
                                                      key=lambda g: g["group_id"])],
        }

    def _group(self, group: dict[str, Any]) -> dict[str, Any]:
        """A consumer group with each committed partition's lag (its end less the offset)."""
        committed = []
        for entry in group["committed"]:
            key = (_canonical(entry["topic"]) or "", entry["partition"])
            sample = self.partitions.get(key)
            records, time_lag = self.behind(key, entry["offset"])
            committed.append({**entry, "log_end": None if sample is None else sample.log_end,
                              "lag_records": None if sample is None else records,
                              "lag_time": time_lag})
        return {**group, "committed": committed,
                "lag_records": sum(c["lag_records"] or 0 for c in committed)}

    def _executor(self, executor: Executor) -> dict[str, Any]:
        load = self.loads.get(executor.executor_id)
        history = self.load_history.get(executor.executor_id, ())
        return {
            "executor_id": executor.executor_id, "host": executor.host,
            "broker_id": executor.broker_id, "broker": executor.broker,
            "cores": executor.resources.cores, "memory": executor.resources.memory,
            "slots": executor.resources.slots,
            "load": None if load is None else {
                "cpu_percent": load.cpu_percent, "memory_used": load.memory_used,
                "memory_available": load.memory_available, "disk_free": load.disk_free,
                "running": load.running},
            "history": [{"at": at, "cpu_percent": cpu, "memory_used": memory}
                        for at, cpu, memory in history],
        }

    def _query(self, query: Query) -> dict[str, Any]:
        per_process: dict[int, Any] = {}
        for load in self.loads.values():
            for process in load.per_process:
                if process.query_id == query.query_id:
                    per_process[process.process] = process
        processes = []
        for index in range(query.processes):
            load = per_process.get(index)
            processes.append({
                "process": index,
                "executor": query.executors[index] if index < len(query.executors) else None,
                "exit_code": query.exit_codes[index] if index < len(query.exit_codes) else None,
                "pid": None if load is None else load.pid,
                "cpu_percent": None if load is None else load.cpu_percent,
                "rss": None if load is None else load.rss,
            })
        return {
            "query_id": query.query_id, "name": query.name, "state": str(query.state),
            "reason": query.reason, "owner": query.owner, "program": query.program,
            "args": list(query.args), "workers": query.workers,
            "submitted_at_ms": query.submitted_at_ms, "started_at_ms": query.started_at_ms,
            "ended_at_ms": query.ended_at_ms, "processes": processes,
        }

    def _topic(self, topic: Topic) -> dict[str, Any]:
        name = topic.short_name
        partitions = []
        for index in range(topic.partitions):
            sample = self.partitions.get((topic.name, index))
            partitions.append({
                "partition": index,
                "broker": topic.locations[index] if index < len(topic.locations) else None,
                "log_start": None if sample is None else sample.log_start,
                "log_end": None if sample is None else sample.log_end,
                "size": None if sample is None else sample.size,
                "frontier": None if sample is None else sample.frontier,
                "ended": None if sample is None else sample.ended,
            })
        rate = self.rates.get(topic.name)
        subscriptions = []
        for sub in self.subscriptions:
            if sub.topic != topic.name:
                continue
            records, time_lag = self.lag(sub)
            subscriptions.append({"principal": sub.principal, "partition": sub.partition,
                                  "next_offset": sub.next_offset, "lag_records": records,
                                  "lag_time": time_lag, "who": self._who(sub.principal)})
        subscriptions.sort(key=lambda s: (s["principal"], s["partition"]))
        groups = []
        for group in self.groups:
            for entry in group["committed"]:
                if _canonical(entry["topic"]) != topic.name:
                    continue
                key = (topic.name, entry["partition"])
                records, time_lag = self.behind(key, entry["offset"])
                groups.append({"group_id": group["group_id"], "partition": entry["partition"],
                               "offset": entry["offset"], "lag_time": time_lag,
                               "lag_records": None if key not in self.partitions
                               else records})
        return {
            "topic_id": topic.topic_id, "name": topic.name, "short_name": name,
            "subscriptions": subscriptions, "groups": groups,
            "partitions": partitions, "kind": str(topic.kind), "internal": topic.internal,
            "owner": _party(topic.owner), "record_type": topic.record_type,
            "records": sum(p["log_end"] or 0 for p in partitions),
            "bytes": sum(p["size"] or 0 for p in partitions),
            "records_per_s": 0.0 if rate is None else round(rate.rate, 1),
            "history": [] if rate is None else [{"at": at, "records_per_s": round(r, 1)}
                                                for at, r in rate.history],
            "configs": dict(topic.configs),
        }

    def _who(self, principal: str) -> str:
        """A principal as people read it: a query's with its name."""
        return _who_of(principal, {q.query_id: q.name for q in self.records("queries")})

    def _graph(self, topics: Mapping[int, Topic], queries: list[Query]) -> dict[str, Any]:
        """Queries and the topics between them: nodes, and an edge per publication (query ->
        topic) and per subscription (topic -> query). Ended queries and system topics stay
        out; so do topics no live query touches."""
        live = {q.query_id: q for q in queries if not q.ended}
        edges: list[dict[str, Any]] = []
        used: set[int] = set()
        kinds = (("publications", Publication), ("subscriptions", Subscription))
        for collection, kind in kinds:
            for record in self.records(collection):
                assert isinstance(record, kind)
                party = record.publisher if isinstance(record, Publication) else record.subscriber
                topic = topics.get(record.topic_id)
                if topic is None or topic.internal:
                    continue
                source, target = f"topic:{topic.topic_id}", _node(party)
                if target is None:
                    continue
                if isinstance(party, QueryRef) and party.query_id not in live:
                    continue
                if isinstance(record, Publication):
                    source, target = target, source
                rate = self.rates.get(topic.name)
                edge = {"from": source, "to": target, "topic": topic.short_name,
                        "records_per_s": 0.0 if rate is None else round(rate.rate, 1)}
                if isinstance(record, Subscription) and isinstance(party, QueryRef):
                    edge["lag_records"] = sum(
                        self.lag(s)[0] for s in self.subscriptions
                        if s.topic == topic.name and s.principal == f"query:{party.query_id}")
                edges.append(edge)
                used.add(topic.topic_id)
        nodes = [{"id": f"query:{q.query_id}", "kind": "query", "label": q.name,
                  "query_id": q.query_id, "state": str(q.state)} for q in live.values()]
        nodes += [{"id": f"topic:{t}", "kind": "topic", "label": topics[t].short_name,
                   "name": topics[t].name} for t in sorted(used)]
        sessions = sorted({e["from"] for e in edges if e["from"].startswith("session:")} |
                          {e["to"] for e in edges if e["to"].startswith("session:")})
        nodes += [{"id": s, "kind": "client", "label": f"client {s.split(':')[1]}"}
                  for s in sessions]
        return {"nodes": nodes, "edges": edges}


def _canonical(kafka_name: str) -> str | None:
    """A Kafka topic name (the cluster's default namespace) as the catalog spells it."""
    try:
        return TopicName.parse(kafka_name).full
    except InvalidTopicNameError:
        return None


def _who_of(principal: str, names: Mapping[int, str]) -> str:
    kind, _, rest = principal.partition(":")
    if kind == "query" and rest.isdigit() and int(rest) in names:
        return f"query {rest} {names[int(rest)]}"
    return principal


def _node(party: Any) -> str | None:
    if isinstance(party, QueryRef):
        return f"query:{party.query_id}"
    if isinstance(party, SessionRef):
        return f"session:{party.session_id}"
    return None  # the coordinator (SystemRef): its topics are not part of the dataflow


def _party(owner: Any) -> str:
    if isinstance(owner, QueryRef):
        return f"query {owner.query_id}"
    if isinstance(owner, SessionRef):
        return f"session {owner.session_id}"
    principal = getattr(owner, "principal", None)
    if principal:
        return principal
    return type(owner).__name__.removesuffix("Ref").lower()
