"""`tq consume TOPIC`: print the records of a topic's partitions (DESIGN §9).

A thin adapter: the coordinator (--coordinator, TQ_COORDINATOR or $TQ_HOME/cluster.json) says
which brokers host the topic and `querylib.cluster.read_topic` reads them, all partitions merged
or the ones named with --partition; `--broker ADDR` reads one standalone broker instead. One line
per record (the value, or a JSON object with --json; progress and end-of-stream are JSON lines
too with --json). Without --follow it stops at the end of what was stored when it started; with
it, at the end of stream; --count N stops after N records either way.

Also home of the options `tq produce` shares (`add_topic_client_options`, `open_route`).
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from typing import Any

from catalog.errors import UserError
from querylib.cli._catalog import add_cluster_options


def register(sub: argparse._SubParsersAction) -> None:
    consume = sub.add_parser("consume", help="print the records of a topic")
    consume.add_argument("topic")
    add_topic_client_options(consume)
    consume.add_argument("--partition", type=int, action="append", dest="partitions",
                         help="partition to read (repeatable; default all)")
    consume.add_argument("--from", dest="start", default="earliest",
                         help="earliest, latest or an offset (default earliest)")
    consume.add_argument("--count", type=int, metavar="N",
                         help="stop after N records")
    consume.add_argument("--follow", action="store_true",
                         help="keep printing new records until end-of-stream")
    consume.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                         help="wait this long for a topic that does not exist yet (default 0)")
    consume.add_argument("--json", action="store_true",
                         help="one JSON object per line: partition, offset, timestamp, time, "
                         "key, value, headers")
    consume.set_defaults(func=_consume)


def add_topic_client_options(parser: argparse.ArgumentParser) -> None:
    """Where the topic is: through the coordinator (default) or on one standalone broker."""
    add_cluster_options(parser, timeout=30.0, waits_for="the coordinator and brokers")
    parser.add_argument("--broker", metavar="ADDR",
                        help="talk to this standalone broker directly, e.g. "
                        "tcp://127.0.0.1:7500 (no coordinator)")


def open_route(args: argparse.Namespace, *, create_partitions: int | None = None,
               wait: float = 0.0) -> tuple[Any, bytes]:
    """The topic's TopicRoute, from the coordinator, and the secret its brokers take."""
    from querylib.cluster import Cluster, route_topic

    with Cluster.connect(args.coordinator, secret_file=args.secret_file,
                         session=create_partitions is not None,
                         connect_timeout=args.timeout, timeout=max(args.timeout, 30.0)) as cluster:
        route = route_topic(cluster, args.topic, create_partitions=create_partitions, wait=wait)
        return route, cluster.secret


def standalone(args: argparse.Namespace) -> bool:
    """True when --broker names a standalone broker to talk to directly."""
    if args.broker is not None and args.coordinator is not None:
        raise UserError("give --broker or --coordinator, not both")
    return args.broker is not None


def parse_start(text: str) -> str | int:
    if text in ("earliest", "latest"):
        return text
    try:
        offset = int(text)
    except ValueError:
        raise UserError(f"--from {text!r}: use earliest, latest or an offset") from None
    if offset < 0:
        raise UserError(f"--from {offset}: an offset is >= 0")
    return offset


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("utf-8", "replace")


def _json_bytes(value: bytes | None) -> dict[str, str] | str | None:
    if value is None:
        return None
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(value).decode()}


def _consume(args: argparse.Namespace) -> int:
    from querylib.broker import Data, EndOfStream, Progress, Subscriber
    from querylib.cluster import read_topic
    from querylib.records import TIME_HEADER

    start = parse_start(args.start)
    if args.count is not None and args.count < 0:
        raise UserError(f"--count {args.count}: a count is >= 0")
    out = sys.stdout
    left = args.count
    if left == 0:
        return 0
    if standalone(args):
        # Standalone: every partition the broker has, unless named (it has no catalog).
        from querylib.cli._broker import client_secret

        events: Any = Subscriber(args.broker, args.topic, args.partitions,
                                 secret=client_secret(args), start=start,
                                 follow=args.follow, timeout=args.timeout)
    else:
        route, secret = open_route(args, wait=args.wait)
        events = read_topic(route, secret, partitions=args.partitions, start=start,
                            follow=args.follow, timeout=args.timeout)
    with _closing(events):
        for event in events:
            if isinstance(event, Data):
                for r in event.records:
                    if args.json:
                        out.write(json.dumps({
                            "partition": event.partition, "offset": r.offset,
                            "timestamp": r.timestamp, "time": event.time,
                            "key": _json_bytes(r.key), "value": _json_bytes(r.value),
                            "headers": [[k, _json_bytes(v)] for k, v in r.headers
                                        if k != TIME_HEADER]}) + "\n")
                    else:
                        out.write(f"{_text(r.value)}\n")
                    if left is not None:
                        left -= 1
                        if left == 0:
                            out.flush()
                            return 0
            elif isinstance(event, Progress) and args.json:
                out.write(json.dumps({"progress": event.frontier}) + "\n")
            elif isinstance(event, EndOfStream) and args.json:
                out.write(json.dumps({"end_of_stream": True}) + "\n")
            out.flush()
    return 0


class _closing:
    """Close a Subscriber or a generator on the way out, whichever `events` is."""

    def __init__(self, events: Any) -> None:
        self.events = events

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        self.events.close()
