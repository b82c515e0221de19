"""`tq kill`, `tq logs` and `tq topic create|delete|describe|alter|add-partitions|
delete-records`: acting on queries and topics (DESIGN §6, §9).

Thin adapters over the cluster client. A query is named by its id or its name (the newest
query of that name). `tq logs` prints a query's output (`_output`); `tq kill` returns once the
query's processes are gone (every exit code is in the catalog). A query the catalog does not
know is an error (exit 2), for `tq logs` as for `tq kill`. `tq topic describe` joins the
catalog's record of a topic with what its hosting brokers say of each partition (offsets,
bytes, frontier).
"""

from __future__ import annotations

import argparse
import json
import sys

from querylib._argtypes import integer, seconds
from querylib.cli._catalog import add_cluster_options, connect, describe, human_bytes


def register(sub: argparse._SubParsersAction) -> None:
    kill = sub.add_parser(
        "kill", help="kill a query (TERM, then KILL after a grace period)",
        description="Kill a query: its processes get SIGTERM, then SIGKILL after the "
        "executor's grace period. Returns once every process is gone.",
        epilog="example: tq kill clicks")
    kill.add_argument("query", help="the query's id or name (a name: its newest query)")
    kill.add_argument("--reason", default="killed by tq kill")
    kill.add_argument("--wait-timeout", type=seconds, default=60.0, metavar="SECONDS",
                      help="how long to wait for the processes to be gone (default 60)")
    add_cluster_options(kill)
    kill.set_defaults(func=_kill)

    logs = sub.add_parser(
        "logs", help="print a query's output lines",
        description="Print what a query's processes wrote: `[P] line` for process P's "
        "stdout, `[P stderr] line` for its stderr. With --follow, go on printing new lines "
        "until the query ends.",
        epilog="example: tq logs clicks --follow --tail 20")
    logs.add_argument("query", help="the query's id or name (a name: its newest query)")
    logs.add_argument("-f", "--follow", action="store_true",
                      help="keep printing new lines until the query ends")
    logs.add_argument("--tail", type=integer(0), metavar="N",
                      help="start with the last N lines only")
    logs.add_argument("-t", "--timestamps", action="store_true",
                      help="prefix each line with when it was written (UTC)")
    logs.add_argument("--json", action="store_true",
                      help="one JSON object per line: query, process, stream, time, text")
    add_cluster_options(logs)
    logs.set_defaults(func=_logs)

    topic = sub.add_parser("topic", help="manage topics")
    topic_sub = topic.add_subparsers(dest="topic_command", required=True)
    create = topic_sub.add_parser(
        "create", help="create an ingest topic",
        description="Create a topic fed from outside (tq produce, tq ingest, Kafka clients).",
        epilog="example: tq topic create events --partitions 4 --record-type json")
    create.add_argument("name")
    create.add_argument("--partitions", type=integer(1), default=1)
    create.add_argument("--replication-factor", type=integer(1), metavar="N",
                        help="copies of each partition, on as many executor hosts (default: "
                        "1 with one executor host, else min(3, hosts))")
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
    alter = topic_sub.add_parser(
        "alter", help="set a topic's retention, segment size and min.insync.replicas",
        description="Set (or with --reset, remove) the Kafka topic configs tq keeps per topic, "
        "in the catalog: every broker hosting the topic applies them, now and after restarts "
        "(Kafka clients: IncrementalAlterConfigs). Unset ones are the broker's. -1: no limit.",
        epilog="example: tq topic alter events --retention-ms 86400000 --retention-bytes -1")
    alter.add_argument("name")
    for flag, config in _CONFIG_FLAGS.items():
        alter.add_argument(flag, type=int, metavar="N", dest=config.replace(".", "_"),
                           help=f"Kafka's {config}")
    alter.add_argument("--reset", action="append", default=[], metavar="CONFIG",
                       choices=sorted(_CONFIG_FLAGS.values()),
                       help="go back to the broker's value of CONFIG (e.g. retention.ms)")
    add_cluster_options(alter)
    alter.set_defaults(func=_alter_topic)
    grow = topic_sub.add_parser(
        "add-partitions", help="add partitions to a topic",
        description="Add N partitions to a topic (they only grow), placed by the coordinator "
        "(Kafka clients: CreatePartitions with the new total). Readers planned before see the "
        "partitions they had; new subscriptions and Spark reads see all.",
        epilog="example: tq topic add-partitions events 2")
    grow.add_argument("name")
    grow.add_argument("count", type=integer(1), metavar="N", help="how many partitions to add")
    add_cluster_options(grow)
    grow.set_defaults(func=_add_partitions)
    trim = topic_sub.add_parser(
        "delete-records", help="delete a partition's records before an offset",
        description="Move a partition's log start up to OFFSET (Kafka's DeleteRecords): "
        "reads below it fail, whole segments below it are removed from disk. The topic's "
        "writers and the admin may.",
        epilog="example: tq topic delete-records events --partition 0 --before 1000")
    trim.add_argument("name")
    trim.add_argument("--partition", type=integer(0), required=True, metavar="P")
    trim.add_argument("--before", required=True, metavar="OFFSET",
                      help="the first offset kept, or 'end' for every record so far")
    add_cluster_options(trim)
    trim.set_defaults(func=_delete_records)


# `tq topic alter` flags and the Kafka topic config each sets (catalog.TOPIC_CONFIGS).
_CONFIG_FLAGS = {"--retention-ms": "retention.ms", "--retention-bytes": "retention.bytes",
                 "--segment-bytes": "segment.bytes",
                 "--min-insync-replicas": "min.insync.replicas"}


def _kill(args: argparse.Namespace) -> int:
    from querylib.cluster import resolve_query, wait_for_exits

    with connect(args, session=True) as cluster:
        query = resolve_query(cluster, args.query, timeout=max(args.timeout, 30.0))
        started = query.state.value != "pending"  # a pending query has no processes yet
        query = cluster.kill_query(query.query_id, args.reason)
        if started and any(code is None for code in query.exit_codes):
            query = wait_for_exits(cluster, query.query_id, settle=args.wait_timeout)
    running = [str(p) for p, code in enumerate(query.exit_codes) if code is None and started]
    if running:
        print(f"tq: query {query.query_id} ({query.name}) {query.state.value}, but process"
              f"{'es' if len(running) > 1 else ''} {', '.join(running)} did not report an exit "
              f"within {args.wait_timeout:g}s (is its executor gone? see `tq status`)",
              file=sys.stderr)
        return 1
    print(f"query {query.query_id} ({query.name}) {query.state.value}; its processes are gone",
          file=sys.stderr)
    return 0


def _create_topic(args: argparse.Namespace) -> int:
    from catalog import TopicExistsError

    with connect(args, session=True) as cluster:
        try:
            info = cluster.create_topic(args.name, args.partitions,
                                        record_type=args.record_type, ingest=True,
                                        replication_factor=args.replication_factor)
        except TopicExistsError as exc:
            if not args.if_not_exists:
                raise TopicExistsError(f"{exc}; --if-not-exists accepts it, `tq topic "
                                       "describe` shows it") from None
            topic = cluster.lookup_topic(args.name).topic
            print(f"topic {topic.short_name} exists already: {topic.partitions} partitions, "
                  f"{topic.record_type}, owner {describe(topic.owner)}", file=sys.stderr)
            return 0
    print(f"topic {info.topic.short_name}: {info.topic.partitions} partitions, replication "
          f"factor {info.topic.replication_factor}", file=sys.stderr)
    return 0


def _describe_topic(args: argparse.Namespace) -> int:
    from catalog import TqError
    from querylib.cli._records_text import serde_of
    from querylib.cluster import TopicRoute, partition_infos

    with connect(args) as cluster:
        found = cluster.lookup_topic(args.name)
        secret = cluster.secret
    topic = found.topic
    addresses = tuple(found.brokers.get(b, "") for b in topic.locations)
    route = TopicRoute(name=topic.short_name, partitions=topic.partitions,
                       addresses=addresses, ingest=False, record_type=topic.record_type)
    try:
        infos = partition_infos(route, secret, timeout=args.timeout)
        silent = ""
    except TqError as exc:  # what the catalog says stands on its own: offsets unknown
        infos, silent = {}, str(exc)
    serde = serde_of(topic.record_type)
    record_type = topic.record_type.partition("/")[2] or None
    parts = []
    for p, broker in enumerate(topic.locations):
        info = infos.get(p)
        # A topic of one replica has it on its leader, in sync, at leader epoch 0.
        replicas = topic.replicas[p] if topic.replicas else (broker,)
        parts.append({"partition": p, "broker": broker, "address": addresses[p] or None,
                      "start": info and info.log_start, "end": info and info.log_end,
                      "bytes": info and info.size, "frontier": info and info.frontier,
                      "ended": info and info.ended, "epoch": info and info.epoch,
                      "replicas": list(replicas),
                      "isr": list(topic.isr[p] if topic.isr else replicas),
                      "leader_epoch": topic.leader_epochs[p] if topic.leader_epochs else 0,
                      "offline_replicas": [b for b in replicas if b not in found.brokers]})
    if args.json:
        sys.stdout.write(json.dumps({
            "name": topic.short_name, "topic_id": topic.topic_id, "kind": topic.kind.value,
            "serde": serde, "record_type": record_type, "tag": topic.record_type,
            "owner": describe(topic.owner), "internal": topic.internal,
            "created_ms": topic.created_at_ms, "configs": dict(topic.configs),
            "replication_factor": topic.replication_factor, "partitions": parts}) + "\n")
        return 0
    total = sum(p["bytes"] or 0 for p in parts)
    out = [f"topic {topic.short_name} (id {topic.topic_id}): kind {topic.kind.value}, serde "
           f"{serde}, record type {record_type or '-'}, owner {describe(topic.owner)}, "
           f"{topic.partitions} partition{'s' if topic.partitions > 1 else ''}, "
           f"replication factor {topic.replication_factor}, {human_bytes(total)}"]
    if topic.configs:
        out[0] += ", " + ", ".join(f"{k}={v}" for k, v in topic.configs)
    cells = [["PARTITION", "START", "END", "BYTES", "FRONTIER", "BROKER"]]
    if topic.replicas:  # the leader is BROKER; who else holds it and who is in sync
        cells[0] += ["REPLICAS", "ISR", "LEADER EPOCH"]
    for part in parts:
        unknown = part["end"] is None
        frontier = "ended" if part["ended"] else str(part["frontier"])
        if part["epoch"]:  # a later run's (DESIGN §5 "Epochs")
            frontier += f" (epoch {part['epoch']})"
        cells.append([str(part["partition"]), "-" if unknown else str(part["start"]),
                      "-" if unknown else str(part["end"]),
                      "-" if unknown else str(part["bytes"]), "-" if unknown else frontier,
                      f"{part['broker']} ({part['address'] or 'down'})"]
                     + ([",".join(map(str, part["replicas"])), ",".join(map(str, part["isr"])),
                         str(part["leader_epoch"])] if topic.replicas else []))
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    out += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
            for row in cells]
    if any(p["end"] is None for p in parts):
        out.append(f"(-: its broker did not answer{': ' + silent if silent else ''})")
    sys.stdout.write("\n".join(out) + "\n")
    return 0


def _delete_topic(args: argparse.Namespace) -> int:
    with connect(args, session=True) as cluster:
        cluster.delete_topic(args.name, force=args.force)
    print(f"topic {args.name} deleted", file=sys.stderr)
    return 0


def _alter_topic(args: argparse.Namespace) -> int:
    from catalog import InvalidCommandError

    configs: dict[str, str | None] = {name: None for name in args.reset}
    for config in _CONFIG_FLAGS.values():
        value = getattr(args, config.replace(".", "_"))
        if value is not None:
            configs[config] = str(value)
    if not configs:
        raise InvalidCommandError("nothing to alter: give --retention-ms, --retention-bytes, "
                                  "--segment-bytes, --min-insync-replicas or --reset")
    with connect(args, session=True) as cluster:
        topic = cluster.alter_topic(args.name, configs=configs).topic
    own = ", ".join(f"{k}={v}" for k, v in topic.configs) or "the broker's for every config"
    print(f"topic {topic.short_name}: {own}", file=sys.stderr)
    return 0


def _add_partitions(args: argparse.Namespace) -> int:
    from catalog import InvalidPartitionsError

    if args.count < 1:
        raise InvalidPartitionsError(f"add at least one partition, not {args.count}")
    with connect(args, session=True) as cluster:
        had = cluster.lookup_topic(args.name).topic.partitions
        topic = cluster.alter_topic(args.name, partitions=had + args.count).topic
    print(f"topic {topic.short_name}: {topic.partitions} partitions (was {had})",
          file=sys.stderr)
    return 0


def _delete_records(args: argparse.Namespace) -> int:
    from catalog import InvalidCommandError, UnknownTopicError
    from querylib.broker import delete_records

    if args.before == "end":
        offset = -1
    elif args.before.isdigit():
        offset = int(args.before)
    else:
        raise InvalidCommandError(f"--before {args.before!r}: an offset, or 'end'")
    with connect(args) as cluster:
        found = cluster.lookup_topic(args.name)
        secret = cluster.secret
    topic = found.topic
    if not 0 <= args.partition < topic.partitions:
        raise UnknownTopicError(f"topic {topic.short_name} has no partition {args.partition} "
                                f"(it has {topic.partitions})")
    address = found.brokers.get(topic.locations[args.partition])
    if not address:
        raise UnknownTopicError(f"partition {args.partition} of {topic.short_name}: its broker "
                                f"{topic.locations[args.partition]} is down")
    info = delete_records(address, secret, topic.short_name, args.partition, offset,
                          timeout=args.timeout)
    print(f"topic {topic.short_name} partition {args.partition}: starts at {info.log_start} "
          f"(ends at {info.log_end})", file=sys.stderr)
    return 0


def _logs(args: argparse.Namespace) -> int:
    from querylib.cli._output import OutputOptions, print_output
    from querylib.cluster import resolve_query

    options = OutputOptions(tail=args.tail, timestamps=args.timestamps, json=args.json)
    with connect(args) as cluster:
        # An unknown query has no lines: say so rather than print nothing and succeed.
        query = resolve_query(cluster, args.query, timeout=max(args.timeout, 30.0))
        print_output(cluster, query, options, follow=args.follow, timeout=args.timeout)
    return 0
