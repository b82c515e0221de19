"""`tq catalog COLLECTION [--follow] [--json]`, `tq status`, `tq topics [--json]`: the catalog,
read as collection snapshots from the catalog topics (querylib.cluster), rendered.

A thin adapter: connecting, following and snapshots are `querylib.cluster` functions; this
module only turns records into tables, trees and JSON. Read-only: it opens no session, so
looking at the catalog does not change it.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Iterable
from typing import Any, NamedTuple

import msgspec

from querylib._argtypes import seconds

COLLECTION_NAMES = ("sessions", "brokers", "executors", "queries", "topics", "publications",
                    "subscriptions", "drops", "users", "tokens", "homes", "counters")


def add_cluster_options(parser: argparse.ArgumentParser, *, timeout: float = 10.0,
                        waits_for: str = "the coordinator") -> None:
    """The options every coordinator client command shares."""
    parser.add_argument("--coordinator", metavar="ADDR",
                        help="the coordinator's endpoint, or every coordinator's, comma-"
                        "separated (failover: the active one answers); default "
                        "$TQ_COORDINATOR, else $TQ_HOME/cluster.json")
    parser.add_argument("--credentials", "--secret-file", dest="secret_file", metavar="FILE",
                        help="who you are: a credential file from `tq user add`, or the "
                        "cluster secret (its holder is the admin); default $TQ_CREDENTIALS, "
                        "else the secret file cluster.json names, else $TQ_HOME/secret")
    add_coordinator_key_option(parser)
    parser.add_argument("--timeout", type=seconds, default=timeout,
                        help=f"seconds to wait for {waits_for} (default {timeout:g})")


def add_coordinator_key_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--coordinator-key", metavar="KEY",
                        help="the coordinator's CURVE public key, to reach it across hosts "
                        "encrypted (default: $TQ_COORDINATOR_KEY, else the credential "
                        "file's, else $TQ_HOME/cluster.json's)")


def connect(args: argparse.Namespace, *, session: bool = False) -> Any:
    """A blocking Cluster from the shared options."""
    from querylib.cluster import Cluster

    return Cluster.connect(args.coordinator, secret_file=args.secret_file, session=session,
                           connect_timeout=args.timeout, timeout=max(args.timeout, 30.0),
                           coordinator_key=getattr(args, "coordinator_key", None))


def register(sub: argparse._SubParsersAction) -> None:
    catalog = sub.add_parser(
        "catalog", help="print a catalog collection (and follow its changes)",
        description="Print a catalog collection as of the current catalog version; with "
        "--follow, then print every change as it commits (+ added, - removed).")
    catalog.add_argument("collection", choices=COLLECTION_NAMES)
    catalog.add_argument("--follow", action="store_true", help="keep printing changes")
    catalog.add_argument("--json", action="store_true",
                         help="JSON: one object per event (snapshot, then diffs)")
    add_cluster_options(catalog)
    catalog.set_defaults(func=_catalog)

    status = sub.add_parser("status", help="executors -> queries -> publications/"
                            "subscriptions, as a tree (or one query)")
    status.add_argument("query", nargs="?",
                        help="show only this query, by id or name (a name: its newest "
                        "query; an error if there is none)")
    status.add_argument("--json", action="store_true", help="the collections as one JSON object")
    add_cluster_options(status)
    status.set_defaults(func=_status)

    topics = sub.add_parser("topics", help="list the topics")
    topics.add_argument("--json", action="store_true", help="one JSON object per line")
    topics.add_argument("--all", action="store_true", help="include the __ system topics")
    add_cluster_options(topics)
    topics.set_defaults(func=_topics)


# -- rendering ------------------------------------------------------------------------------------


def to_json(record: Any) -> Any:
    return msgspec.to_builtins(record)


def describe(value: Any) -> str:
    """A field value for a table cell."""
    from catalog import Resources, TopicName, TqError, describe_owner

    if value is None:
        return "-"
    if isinstance(value, Resources):
        return (f"{value.cores} cores, {value.memory // 2**20} MiB, {value.disk // 2**30} GiB "
                f"disk, {value.slots} slots")
    if isinstance(value, msgspec.Struct):
        return describe_owner(value)  # type: ignore[arg-type]  # the catalog structs shown here are owners
    if isinstance(value, tuple):
        return ",".join(describe(v) for v in value) or "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str) and value.startswith("persistent://"):
        try:
            return TopicName.parse(value).short  # relative to the cluster's default namespace
        except TqError:
            return value
    return str(value)


def human_bytes(size: int | None) -> str:
    """A byte count as people read it: 0 B, 12.3 KiB, 4.0 MiB ("?" when unknown)."""
    if size is None:
        return "?"
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def topic_sizes(cluster: Any, brokers: dict[int, str],
                timeout: float) -> dict[int, dict[str, int]]:
    """Bytes on disk per broker id and topic short name, from each broker's partition list.
    A broker that does not answer is left out (its topics' sizes are unknown)."""
    from catalog.errors import TqError
    from querylib.broker import list_partitions

    sizes: dict[int, dict[str, int]] = {}
    for broker_id, address in brokers.items():
        try:
            listed = list_partitions(address, cluster.secret, timeout=timeout)
        except TqError:
            continue
        here = sizes[broker_id] = {}
        for info in listed:
            here[info.topic] = here.get(info.topic, 0) + info.size
    return sizes


def table(records: Iterable[Any]) -> list[str]:
    """Records of one type as aligned rows, a header first."""
    rows = list(records)
    if not rows:
        return []
    fields = [f for f in rows[0].__struct_fields__ if f != "type"]
    cells = [[f.upper().replace("_", " ") for f in fields]]
    cells += [[describe(getattr(r, f)) for f in fields] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(fields))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
            for row in cells]


def _key(record: Any) -> tuple[int, str]:
    """Records by their id (the first field), then by the rest as shown."""
    fields = [f for f in record.__struct_fields__ if f != "type"]
    first = getattr(record, fields[0])
    rest = " ".join(describe(getattr(record, f)) for f in fields[1:])
    return (first if isinstance(first, int) else 0, rest)


def _catalog(args: argparse.Namespace) -> int:
    from querylib.cluster import Snapshot

    out = sys.stdout
    with connect(args) as cluster, cluster.follow(args.collection) as follower:
        for event in follower:
            if args.json:
                body: dict[str, Any] = {"collection": event.collection, "version": event.version}
                if isinstance(event, Snapshot):
                    body["snapshot"] = [to_json(r) for r, _ in event.records]
                else:
                    body["diff"] = [{"diff": d, "record": to_json(r)} for r, d in event.updates]
                out.write(json.dumps(body) + "\n")
            elif isinstance(event, Snapshot):
                records = sorted((r for r, _ in event.records), key=_key)
                out.write(f"# {args.collection} at catalog version {event.version}: "
                          f"{len(records)} records\n")
                for line in table(records):
                    out.write(line + "\n")
            else:
                for record, diff in event.updates:
                    sign = "+" if diff > 0 else "-"
                    fields = " ".join(f"{f}={describe(getattr(record, f))}"
                                      for f in record.__struct_fields__ if f != "type")
                    out.write(f"{event.version} {sign} {fields}\n")
            out.flush()
            if not args.follow:
                break
    return 0


def _topics(args: argparse.Namespace) -> int:
    with connect(args) as cluster:
        snaps = cluster.snapshot("topics", "publications", "subscriptions", "brokers",
                                 timeout=max(args.timeout, 30.0))
        brokers = {b.broker_id: b.address for b, _ in snaps["brokers"].records}
        sizes = topic_sizes(cluster, brokers, min(args.timeout, 10.0))

    def size(t: Any) -> int | None:
        where = set(t.locations)
        if any(b not in sizes for b in where):
            return None  # a broker hosting it is down or did not answer: unknown
        return sum(sizes[b].get(t.short_name, 0) for b in where)

    publishers: dict[int, int] = {}
    subscribers: dict[int, int] = {}
    for p, _ in snaps["publications"].records:
        publishers[p.topic_id] = publishers.get(p.topic_id, 0) + 1
    for s, _ in snaps["subscriptions"].records:
        subscribers[s.topic_id] = subscribers.get(s.topic_id, 0) + 1
    topics = sorted((t for t, _ in snaps["topics"].records if args.all or not t.internal),
                    key=lambda t: t.name)
    out = sys.stdout
    if args.json:
        for t in topics:
            out.write(json.dumps({**to_json(t), "short_name": t.short_name,
                                  "bytes": size(t),
                                  "publishers": publishers.get(t.topic_id, 0),
                                  "subscribers": subscribers.get(t.topic_id, 0)}) + "\n")
        return 0
    cells = [["NAME", "PARTITIONS", "BYTES", "KIND", "RECORD TYPE", "OWNER", "PUBLISHERS",
              "SUBSCRIBERS", "BROKERS"]]
    for t in topics:
        cells.append([t.short_name, str(t.partitions), human_bytes(size(t)), t.kind.value,
                      t.record_type,
                      describe(t.owner), str(publishers.get(t.topic_id, 0)),
                      str(subscribers.get(t.topic_id, 0)),
                      ",".join(str(b) for b in sorted(set(t.locations)))])
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    for row in cells:
        out.write("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                  + "\n")
    if len(cells) == 1:
        out.write("(no topics)\n")
    return 0


def _status(args: argparse.Namespace) -> int:
    with connect(args) as cluster:
        snaps = cluster.snapshot("sessions", "brokers", "executors", "queries", "topics",
                                 "publications", "subscriptions",
                                 timeout=max(args.timeout, 30.0))
        address, broker = cluster.address, cluster.catalog_broker
        loads = cluster.loads()
        known = cluster.groups()
        reports = ask_brokers(snaps, cluster.secret, partitions=any(g.committed for g in known),
                              timeout=min(args.timeout, 10.0))
        lags = subscription_lags(reports)
        groups = group_lags(reports, known)
    if args.query is not None:
        return _query_status(snaps, args.query, json_out=args.json, loads=loads, lags=lags)
    if args.json:
        body: dict[str, Any] = {name: [to_json(r) for r, _ in snap.records]
                                for name, snap in snaps.items()}
        body["version"] = min(s.version for s in snaps.values())
        body["loads"] = {str(e): to_json(load) for e, load in sorted(loads.items())}
        body["lags"] = [{"principal": principal, "topic": topic, "lag_records": lag}
                        for (principal, topic), lag in sorted(lags.items())]
        body["groups"] = groups
        sys.stdout.write(json.dumps(body) + "\n")
        return 0
    for line in render_status(snaps, address, broker, loads, lags, groups):
        sys.stdout.write(line + "\n")
    return 0


class BrokerReport(NamedTuple):
    """What one broker said: its subscriptions, and its partitions when they were asked for."""

    subscriptions: list[Any]
    partitions: list[Any]


def ask_brokers(snaps: dict[str, Any], secret: Any, *, partitions: bool, timeout: float
                ) -> dict[str, BrokerReport]:
    """Every broker of the catalog asked at once for its subscriptions (and its partitions),
    each on a thread of its own, all within one `timeout`: broker address -> its report. A
    broker that does not answer in time (a host cut off, a broker restarting) is left out,
    so `tq status` waits `timeout` at most, however many brokers are away. The threads are
    daemons: one still waiting on a silent broker does not hold the command's exit."""
    from catalog.errors import TqError
    from querylib.broker import list_partitions, list_subscriptions

    reports: dict[str, BrokerReport] = {}
    deadline = time.monotonic() + timeout

    def ask(address: str) -> None:
        try:
            subs = list_subscriptions(address, secret, timeout=timeout)
            parts = list_partitions(address, secret, timeout=max(
                0.1, deadline - time.monotonic())) if partitions else []
        except TqError:
            return
        reports[address] = BrokerReport(subs, parts)

    threads = [threading.Thread(target=ask, args=(address,), daemon=True,
                                name=f"tq status {address}")
               for address in sorted({b.address for b, _ in snaps["brokers"].records})]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return dict(reports)


def subscription_lags(reports: dict[str, BrokerReport]) -> dict[tuple[str, str], int]:
    """(principal, canonical topic name) -> records visible and not yet delivered to that
    principal's subscriptions of the topic, summed over partitions, as the brokers that
    answered report them (the admin sees everyone's, a user its own)."""
    from catalog import TopicName

    lags: dict[tuple[str, str], int] = {}
    for report in reports.values():
        for sub in report.subscriptions:
            key = (sub.principal, TopicName.parse(sub.topic, fixed=True).full)
            lags[key] = lags.get(key, 0) + max(0, sub.log_end - sub.next_offset)
    return lags


def group_lags(reports: dict[str, BrokerReport], groups: list[Any]) -> list[dict[str, Any]]:
    """Each consumer group (`Cluster.groups`) with every committed partition's lag: the end
    offset its broker reports less the committed offset (None when its broker did not
    answer)."""
    from catalog import TopicName
    from catalog.errors import InvalidTopicNameError

    ends: dict[tuple[str, int], int] = {}
    for report in reports.values():
        for info in report.partitions:
            ends[(TopicName.parse(info.topic, fixed=True).full, info.partition)] = \
                info.log_end
    out = []
    for group in groups:
        committed = []
        for c in group.committed:
            try:
                end = ends.get((TopicName.parse(c.topic).full, c.partition))
            except InvalidTopicNameError:
                end = None
            committed.append({"topic": c.topic, "partition": c.partition, "offset": c.offset,
                              "lag_records": None if end is None else max(0, end - c.offset)})
        out.append({"group_id": group.group_id, "state": group.state,
                    "members": group.members, "committed": committed})
    return out


def _principal_of(party: Any) -> str:
    from catalog import QueryRef, SessionRef

    if isinstance(party, QueryRef):
        return f"query:{party.query_id}"
    if isinstance(party, SessionRef):
        return f"session:{party.session_id}"
    return "system"


def _lag_note(lags: dict[tuple[str, str], int], party: Any, topic: Any) -> str:
    if topic is None:
        return ""
    lag = lags.get((_principal_of(party), topic.name))
    return "" if lag is None else f", lag {lag} record{'' if lag == 1 else 's'}"


def _query_status(snaps: dict[str, Any], ref: str, *, json_out: bool,
                  loads: dict[int, Any] | None = None,
                  lags: dict[tuple[str, str], int] | None = None) -> int:
    from catalog import QueryRef, UnknownQueryError

    if ref.isdigit():
        found = [q for q, _ in snaps["queries"].records if q.query_id == int(ref)]
        missing = f"no query {ref}"
    else:  # a name: its newest query
        found = sorted((q for q, _ in snaps["queries"].records if q.name == ref),
                       key=lambda q: q.query_id)[-1:]
        missing = f"no query named {ref!r}"
    if not found:
        raise UnknownQueryError(f"{missing} (see `tq status` for the queries there are)")
    (query,) = found
    query_id = query.query_id
    if json_out:
        sys.stdout.write(json.dumps(to_json(query)) + "\n")
        return 0
    topics = {t.topic_id: t for t, _ in snaps["topics"].records}
    party = QueryRef(query_id)
    codes = ",".join("-" if c is None else str(c) for c in query.exit_codes)
    where = (f"on executors {describe(query.executors)}; exit codes {codes}" if query.executors
             else "waiting for free process slots" if query.state.value == "pending"
             else "never placed")
    lines = [f"query {query.query_id} {query.name} [{query.state.value}] {query.processes} x "
             f"{query.workers} {where}" + (f": {query.reason}" if query.reason else "")]
    if not query.ended:
        lines += process_lines(query, loads or {}, "  ")
    lines += [f"  publishes {_topic_label(topics.get(p.topic_id))}"
              for p, _ in snaps["publications"].records if p.publisher == party]
    lines += [f"  subscribes {_topic_label(topics.get(s.topic_id))}"
              f"{_lag_note(lags or {}, party, topics.get(s.topic_id))}"
              for s, _ in snaps["subscriptions"].records if s.subscriber == party]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def load_text(load: Any) -> str:
    """An executor's load, as `tq status` shows it."""
    return (f"load: cpu {load.cpu_percent:.0f}%, memory {load.memory_used // 2**20} MiB used, "
            f"{load.memory_available // 2**20} MiB available, disk {load.disk_free // 2**30} GiB "
            "free")


def process_lines(query: Any, loads: dict[int, Any], indent: str) -> list[str]:
    """One line per process of a live query that an executor reported: its pid, CPU (100% is
    one core, summed over what the process started) and resident memory."""
    found = {}
    for executor_id, load in loads.items():
        for p in load.per_process:
            if p.query_id == query.query_id and query.executors[p.process] == executor_id:
                found[p.process] = p
    return [f"{indent}process {i}: pid {p.pid}, cpu {p.cpu_percent:.1f}%, rss "
            f"{p.rss // 2**20} MiB" + (f" ({p.processes} processes)" if p.processes > 1 else "")
            for i, p in sorted(found.items())]


def render_status(snaps: dict[str, Any], address: str, broker: str,
                  loads: dict[int, Any] | None = None,
                  lags: dict[tuple[str, str], int] | None = None,
                  groups: list[dict[str, Any]] | None = None) -> list[str]:
    """The tree `tq status` prints: executors (with their load) -> queries (with each
    process's pid, CPU and memory) -> publications/subscriptions, then the pending queries
    (waiting for slots), queries elsewhere, then client sessions with what they publish and
    subscribe. `loads`: each executor's last heartbeat load, by executor id (`Cluster.loads`);
    `lags`: records behind by (principal, topic) (`subscription_lags`); `groups`: the
    consumer groups with their lag (`group_lags`)."""
    loads = loads or {}
    lags = lags or {}
    from catalog import QueryRef, SessionRef
    from catalog.errors import printable

    def records(name: str) -> list[Any]:
        return sorted((r for r, _ in snaps[name].records), key=_key)

    topics = {t.topic_id: t for t in records("topics")}
    brokers = {b.broker_id: b for b in records("brokers")}
    pubs: dict[Any, list[str]] = {}
    subs: dict[Any, list[str]] = {}
    for p in records("publications"):
        pubs.setdefault(p.publisher, []).append(_topic_label(topics.get(p.topic_id)))
    for s in records("subscriptions"):
        topic = topics.get(s.topic_id)
        subs.setdefault(s.subscriber, []).append(
            _topic_label(topic) + _lag_note(lags, s.subscriber, topic))

    def party_lines(party: Any, indent: str) -> list[str]:
        return ([f"{indent}publishes {t}" for t in pubs.get(party, [])]
                + [f"{indent}subscribes {t}" for t in subs.get(party, [])])

    version = min(s.version for s in snaps.values())
    lines = [f"catalog version {version}   coordinator {address}   catalog broker {broker}"]
    executors = records("executors")
    queries = records("queries")
    shown: set[int] = set()
    lines.append(f"executors ({len(executors)})")
    for e in executors:
        b = brokers.get(e.broker_id)
        where = b.address if b is not None else "down"
        load = loads.get(e.executor_id)
        lines.append(f"  executor {e.executor_id} on {e.host} (broker {e.broker_id} at {where}; "
                     f"{e.resources.slots} slots)"
                     + ("" if load is None else f"; {load_text(load)}"))
        if e.shards:
            lines.append("    brokers " + ", ".join(
                f"{s} at {brokers[s].address if s in brokers else 'down'}" for s in e.shards))
        for q in queries:
            here = [str(i) for i, ex in enumerate(q.executors) if ex == e.executor_id]
            if q.ended or not here:
                continue
            shown.add(q.query_id)
            lines.append(f"    query {q.query_id} {q.name} [{q.state.value}] "
                         f"process{'es' if len(here) > 1 else ''} {','.join(here)}")
            lines += [line for line in process_lines(q, loads, "      ")
                      if int(line.split()[1].rstrip(":")) in map(int, here)]
            lines += party_lines(QueryRef(q.query_id), "      ")
    if not executors:
        lines.append("  (none: start one with `tq executor` or run `tq up`)")
    pending = [q for q in queries if q.state.value == "pending"]
    if pending:
        # The queue: placed in this order once their processes fit the free slots.
        lines.append(f"pending queries ({len(pending)}), oldest first")
        lines += [f"  query {q.query_id} {q.name} [pending] waits for {q.processes} free "
                  f"process slot{'s' if q.processes > 1 else ''}" for q in pending]
        shown.update(q.query_id for q in pending)
    others = [q for q in queries if q.query_id not in shown]
    if others:
        lines.append(f"other queries ({len(others)})")
        for q in others:
            reason = f": {q.reason}" if q.reason else ""
            codes = ",".join("-" if c is None else str(c) for c in q.exit_codes)
            lines.append(f"  query {q.query_id} {q.name} [{q.state.value}] exit codes "
                         f"{codes}{reason}")
            lines += party_lines(QueryRef(q.query_id), "    ")
    sessions = records("sessions")
    lines.append(f"sessions ({len(sessions)})")
    for session in sessions:
        lines.append(f"  session {session.session_id} {session.kind.value}: {session.peer}")
        lines += party_lines(SessionRef(session.session_id), "    ")
    if groups:
        lines.append(f"consumer groups ({len(groups)})")
        for group in groups:
            # Kafka takes any string as a group id: escaped, it stays on its line.
            lines.append(f"  group {printable(group['group_id'])} [{group['state']}] "
                         f"{group['members']} "
                         f"member{'' if group['members'] == 1 else 's'}")
            for c in group["committed"]:
                lag = "" if c["lag_records"] is None else \
                    f", lag {c['lag_records']} record{'' if c['lag_records'] == 1 else 's'}"
                lines.append(f"    {c['topic']} partition {c['partition']}: committed "
                             f"{c['offset']}{lag}")
    return lines


def _topic_label(topic: Any) -> str:
    if topic is None:
        return "(deleted topic)"
    return f"{topic.short_name} ({topic.partitions} partition{'s' if topic.partitions > 1 else ''})"
