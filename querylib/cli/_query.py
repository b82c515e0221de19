"""`tq kill`, `tq logs` and `tq topic create|delete|describe`: acting on queries and topics
(DESIGN §6, §9).

Thin adapters over the cluster client. `tq logs` reads the `__logs` topic of every executor's
broker (each executor writes its processes' lines to its own broker) and keeps the lines of
one query, keyed `<query>/<process>`. A query the catalog does not know is an error (exit 2),
for `tq logs` as for `tq kill`. `tq topic describe` joins the catalog's record of a topic with
what its hosting brokers say of each partition (offsets, bytes, frontier).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from typing import Any

from querylib.cli._catalog import add_cluster_options, connect, describe, human_bytes


def register(sub: argparse._SubParsersAction) -> None:
    kill = sub.add_parser("kill", help="kill a query (TERM, then KILL after a grace period)")
    kill.add_argument("query", type=int, help="the query id")
    kill.add_argument("--reason", default="killed by tq kill")
    add_cluster_options(kill)
    kill.set_defaults(func=_kill)

    logs = sub.add_parser("logs", help="print a query's output lines")
    logs.add_argument("query", type=int, help="the query id")
    logs.add_argument("--follow", action="store_true", help="keep printing new lines")
    add_cluster_options(logs)
    logs.set_defaults(func=_logs)

    topic = sub.add_parser("topic", help="manage topics")
    topic_sub = topic.add_subparsers(dest="topic_command", required=True)
    create = topic_sub.add_parser(
        "create", help="create an ingest topic",
        description="Create a topic fed from outside (tq produce, tq ingest, Kafka clients).",
        epilog="example: tq topic create events --partitions 4 --record-type json")
    create.add_argument("name")
    create.add_argument("--partitions", type=int, default=1)
    create.add_argument("--record-type", default="bytes", metavar="TAG",
                        help="serde, or serde/record_type: bytes (default), json, msgpack, "
                        "e.g. json/Reading")
    create.add_argument("--if-not-exists", action="store_true",
                        help="succeed, changing nothing, when the topic exists already")
    add_cluster_options(create)
    create.set_defaults(func=_create_topic)
    delete = topic_sub.add_parser(
        "delete", help="delete a topic and its data",
        description="Delete a topic: it leaves the catalog, and the brokers hosting it drop "
        "its partitions and files (one that is down does when it is back). Only its owner "
        "may delete a topic while that owner lives, unless --force.")
    delete.add_argument("name")
    delete.add_argument("--force", action="store_true",
                        help="delete even though its owner (a live query or session) did not")
    add_cluster_options(delete)
    delete.set_defaults(func=_delete_topic)
    describe = topic_sub.add_parser(
        "describe", help="a topic's kind, serde, owner and partitions",
        description="A topic as the catalog records it (kind, serde, record type, owner) and "
        "each partition as its broker holds it: start and end offsets, bytes, frontier.",
        epilog="example: tq topic describe nums --json")
    describe.add_argument("name")
    describe.add_argument("--json", action="store_true", help="one JSON object")
    add_cluster_options(describe)
    describe.set_defaults(func=_describe_topic)


def _kill(args: argparse.Namespace) -> int:
    with connect(args, session=True) as cluster:
        query = cluster.kill_query(args.query, args.reason)
    print(f"query {query.query_id} ({query.name}) {query.state.value}", file=sys.stderr)
    return 0


def _create_topic(args: argparse.Namespace) -> int:
    from catalog import TopicExistsError

    with connect(args, session=True) as cluster:
        try:
            info = cluster.create_topic(args.name, args.partitions,
                                        record_type=args.record_type, ingest=True)
        except TopicExistsError as exc:
            if not args.if_not_exists:
                raise TopicExistsError(f"{exc}; --if-not-exists accepts it, `tq topic "
                                       "describe` shows it") from None
            topic = cluster.lookup_topic(args.name).topic
            print(f"topic {topic.short_name} exists already: {topic.partitions} partitions, "
                  f"{topic.record_type}, owner {describe(topic.owner)}", file=sys.stderr)
            return 0
    print(f"topic {info.topic.short_name}: {info.topic.partitions} partitions", file=sys.stderr)
    return 0


def _describe_topic(args: argparse.Namespace) -> int:
    from querylib.cli._records_text import serde_of
    from querylib.cluster import TopicRoute, partition_infos

    with connect(args) as cluster:
        found = cluster.lookup_topic(args.name)
        secret = cluster.secret
    topic = found.topic
    addresses = tuple(found.brokers.get(b, "") for b in topic.locations)
    route = TopicRoute(name=topic.short_name, partitions=topic.partitions,
                       addresses=addresses, ingest=False, record_type=topic.record_type)
    infos = partition_infos(route, secret, timeout=args.timeout)
    serde = serde_of(topic.record_type)
    record_type = topic.record_type.partition("/")[2] or None
    parts = []
    for p, broker in enumerate(topic.locations):
        info = infos.get(p)
        parts.append({"partition": p, "broker": broker, "address": addresses[p] or None,
                      "start": info and info.log_start, "end": info and info.log_end,
                      "bytes": info and info.size, "frontier": info and info.frontier,
                      "ended": info and info.ended})
    if args.json:
        sys.stdout.write(json.dumps({
            "name": topic.short_name, "topic_id": topic.topic_id, "kind": topic.kind.value,
            "serde": serde, "record_type": record_type, "tag": topic.record_type,
            "owner": describe(topic.owner), "internal": topic.internal,
            "created_ms": topic.created_at_ms, "partitions": parts}) + "\n")
        return 0
    total = sum(p["bytes"] or 0 for p in parts)
    out = [f"topic {topic.short_name} (id {topic.topic_id}): kind {topic.kind.value}, serde "
           f"{serde}, record type {record_type or '-'}, owner {describe(topic.owner)}, "
           f"{topic.partitions} partition{'s' if topic.partitions > 1 else ''}, "
           f"{human_bytes(total)}"]
    cells = [["PARTITION", "START", "END", "BYTES", "FRONTIER", "BROKER"]]
    for p in parts:
        unknown = p["end"] is None
        frontier = "ended" if p["ended"] else str(p["frontier"])
        cells.append([str(p["partition"]), "-" if unknown else str(p["start"]),
                      "-" if unknown else str(p["end"]),
                      "-" if unknown else str(p["bytes"]), "-" if unknown else frontier,
                      f"{p['broker']} ({p['address'] or 'down'})"])
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    out += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
            for row in cells]
    if any(p["end"] is None for p in parts):
        out.append("(-: its broker did not answer)")
    sys.stdout.write("\n".join(out) + "\n")
    return 0


def _delete_topic(args: argparse.Namespace) -> int:
    with connect(args, session=True) as cluster:
        cluster.delete_topic(args.name, force=args.force)
    print(f"topic {args.name} deleted", file=sys.stderr)
    return 0


def log_brokers(cluster: Any, timeout: float) -> list[str]:
    """The address of every executor's broker (where the `__logs` partitions live)."""
    snaps = cluster.snapshot("executors", "brokers", timeout=timeout)
    brokers = {b.broker_id: b.address for b, _ in snaps["brokers"].records}
    return sorted({brokers[e.broker_id] for e, _ in snaps["executors"].records
                   if e.broker_id in brokers})


def _logs(args: argparse.Namespace) -> int:
    from querylib.broker import Data, Subscriber
    from querylib.cluster import find_query

    prefix = f"{args.query}/".encode()
    with connect(args) as cluster:
        # An unknown query has no lines: say so rather than print nothing and succeed.
        find_query(cluster, args.query, timeout=max(args.timeout, 30.0))
        addresses = log_brokers(cluster, max(args.timeout, 30.0))
        secret = cluster.secret
    lock = threading.Lock()

    def read(address: str) -> None:
        with Subscriber(address, "__logs", [0], secret=secret, start="earliest",
                        follow=args.follow, timeout=args.timeout) as sub:
            for event in sub:
                if not isinstance(event, Data):
                    continue
                for record in event.records:
                    if record.key is None or not record.key.startswith(prefix):
                        continue
                    process = record.key[len(prefix):].decode(errors="replace")
                    text = (record.value or b"").decode(errors="replace")
                    with lock:
                        sys.stdout.write(f"[{process}] {text}\n")
                        sys.stdout.flush()

    threads = [threading.Thread(target=read, args=(a,), daemon=True) for a in addresses]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return 0
