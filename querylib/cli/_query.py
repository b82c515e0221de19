"""`tq kill`, `tq logs` and `tq topic create`: acting on queries and topics (DESIGN §6, §9).

Thin adapters over the cluster client. A query is named by its id or its name (the newest
query of that name). `tq logs` prints a query's output (`_output`); `tq kill` returns once the
query's processes are gone (every exit code is in the catalog). A query the catalog does not
know is an error (exit 2), for `tq logs` as for `tq kill`.
"""

from __future__ import annotations

import argparse
import sys

from querylib.cli._catalog import add_cluster_options, connect


def register(sub: argparse._SubParsersAction) -> None:
    kill = sub.add_parser(
        "kill", help="kill a query (TERM, then KILL after a grace period)",
        description="Kill a query: its processes get SIGTERM, then SIGKILL after the "
        "executor's grace period. Returns once every process is gone.",
        epilog="example: tq kill clicks")
    kill.add_argument("query", help="the query's id or name (a name: its newest query)")
    kill.add_argument("--reason", default="killed by tq kill")
    kill.add_argument("--wait-timeout", type=float, default=60.0, metavar="SECONDS",
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
    logs.add_argument("--tail", type=int, metavar="N",
                      help="start with the last N lines only")
    logs.add_argument("-t", "--timestamps", action="store_true",
                      help="prefix each line with when it was written (UTC)")
    logs.add_argument("--json", action="store_true",
                      help="one JSON object per line: query, process, stream, time, text")
    add_cluster_options(logs)
    logs.set_defaults(func=_logs)

    topic = sub.add_parser("topic", help="manage topics")
    topic_sub = topic.add_subparsers(dest="topic_command", required=True)
    create = topic_sub.add_parser("create", help="create an ingest topic")
    create.add_argument("name")
    create.add_argument("--partitions", type=int, default=1)
    create.add_argument("--record-type", default="bytes")
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


def _kill(args: argparse.Namespace) -> int:
    from querylib.cli._output import wait_for_exits
    from querylib.cluster import resolve_query

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
    with connect(args, session=True) as cluster:
        info = cluster.create_topic(args.name, args.partitions, record_type=args.record_type,
                                    ingest=True)
    print(f"topic {info.topic.short_name}: {info.topic.partitions} partitions", file=sys.stderr)
    return 0


def _delete_topic(args: argparse.Namespace) -> int:
    with connect(args, session=True) as cluster:
        cluster.delete_topic(args.name, force=args.force)
    print(f"topic {args.name} deleted", file=sys.stderr)
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
