"""`tq consume TOPIC`: print the records of a topic's partitions (DESIGN §9).

A thin adapter: the coordinator (--coordinator, TQ_COORDINATOR or $TQ_HOME/cluster.json) says
which brokers host the topic and its serde, and `querylib.cluster.read_topic` reads them, all
partitions merged or the ones named with --partition; `--broker ADDR` reads one standalone
broker instead. One line per record, decoded and escaped by `_records_text` (the value, KEY<TAB>
VALUE for keyed records, --format, or a JSON object with --json; progress and end-of-stream are
JSON lines too with --json). Without --follow it stops at the end of what was stored when it
started; with it, at the end of stream; --count N stops after N records either way. `--from -N`
starts where each partition holds its last N records; `--from @T` / `@DATETIME` read from the
start and skip records of earlier logical time / timestamp. `--group G` reads through
querylib's consumer group member instead.

Also home of the options `tq produce` shares (`add_topic_client_options`, `open_route`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from catalog.errors import UserError
from querylib._argtypes import integer, seconds, seconds_or_zero
from querylib.cli._catalog import add_cluster_options, connect
from querylib.cli._records_text import (
    FORMAT_HELP,
    SERDES,
    RecordFormat,
    ValueText,
    escape,
    parse_start,
    serde_of,
)

if TYPE_CHECKING:
    from querylib.rpc import Credential


def register(sub: argparse._SubParsersAction) -> None:
    consume = sub.add_parser(
        "consume", help="print the records of a topic",
        description="Print a topic's records, one line each, decoded with the topic's serde: "
        "json and msgpack values as JSON text, bytes as UTF-8 text with control characters "
        "escaped, pickle never unpickled. A keyed record prints KEY<TAB>VALUE.",
        epilog="examples:\n  tq consume nums --from -5\n"
        "  tq consume clicks --format '%p:%o t=%L %k=%s\\n'\n"
        "  tq consume nums --group readers", formatter_class=_Raw)
    consume.add_argument("topic")
    add_topic_client_options(consume)
    consume.add_argument("--partition", type=integer(0), action="append", dest="partitions",
                         help="partition to read (repeatable; default all)")
    consume.add_argument("--from", dest="start", default="earliest", metavar="WHERE",
                         help="earliest (default), latest, an offset, -N (the last N records "
                         "of each partition), @T (records of logical time >= T) or @DATETIME "
                         "(records stamped at or after it, e.g. @2026-11-25T21:00:00, local "
                         "time unless it has a zone); with --group: where a partition with no "
                         "committed offset starts")
    consume.add_argument("--count", type=int, metavar="N",
                         help="stop after N records")
    consume.add_argument("--follow", action="store_true",
                         help="keep printing new records until end-of-stream")
    consume.add_argument("--wait", type=seconds_or_zero, default=0.0, metavar="SECONDS",
                         help="wait this long for a topic that does not exist yet (default 0)")
    consume.add_argument("--json", action="store_true",
                         help="one JSON object per line: partition, offset, timestamp, time, "
                         "key, value (decoded: JSON values for json and msgpack), headers")
    consume.add_argument("-f", "--format", metavar="FMT", help=FORMAT_HELP)
    consume.add_argument("--serde", choices=SERDES,
                         help="decode with this serde instead of the topic's (a standalone "
                         "--broker has no catalog: bytes unless given)")
    consume.add_argument("--group", metavar="G",
                         help="read as a member of Kafka consumer group G: the partitions the "
                         "group assigns, from its committed offsets, committing as it goes; "
                         "reads until end of stream (or --count, rounded up to the end of the "
                         "records of one time it falls in: the group commits those whole); "
                         "offset, key, timestamp and headers are not shown")
    consume.set_defaults(func=_consume)


class _Raw(argparse.RawDescriptionHelpFormatter):
    pass


def add_topic_client_options(parser: argparse.ArgumentParser) -> None:
    """Where the topic is: through the coordinator (default) or on one standalone broker."""
    add_cluster_options(parser, timeout=30.0, waits_for="the coordinator and brokers")
    parser.add_argument("--broker", metavar="ADDR",
                        help="talk to this standalone broker directly, e.g. "
                        "tcp://127.0.0.1:7500 (no coordinator)")
    parser.add_argument("--broker-lease", type=seconds, default=10.0, metavar="SECONDS",
                        help="how long a broker may be silent before it is presumed gone "
                        "and looked for again (default 10; a replicated topic's moved "
                        "leader is followed at once, from the catalog)")


@contextlib.contextmanager
def open_route(args: argparse.Namespace, *, create_partitions: int | None = None,
               wait: float = 0.0,
               watch: bool = True) -> Iterator[tuple[Any, bytes | Credential]]:
    """The topic's TopicRoute, from the coordinator, and the secret its brokers take, for
    the `with` block. A replicated topic's route follows its leaders through a coordinator
    connection kept open for the block (`Cluster.watch_leader`, one catalog follower for
    every partition; `locate` asks it too), closed at its end; not `watch`: no route to
    follow (the topic's description only)."""
    from querylib.cluster import route_topic

    with connect(args, session=create_partitions is not None) as cluster:
        route = route_topic(cluster, args.topic, create_partitions=create_partitions, wait=wait)
        secret = cluster.secret
    if not (route.replicated and watch):
        yield route, secret
        return
    with connect(args) as leaders:
        def locate(partition: int) -> str:
            """Where the partition is led now (asked when its broker is gone or deposed, or
            the catalog named another leader)."""
            return leaders.lookup_topic(args.topic).leader_address(partition)

        yield dataclasses.replace(route, locate=locate, watch_leader=leaders.watch_leader), \
            secret


def standalone(args: argparse.Namespace) -> bool:
    """True when --broker names a standalone broker to talk to directly."""
    if args.broker is not None and args.coordinator is not None:
        raise UserError("give --broker or --coordinator, not both")
    return args.broker is not None


def _headers_text(headers: Any, text: ValueText) -> str:
    from querylib.records import DIFF_HEADER, TIME_HEADER, decode_int64

    shown = []
    for k, v in headers:
        if k == TIME_HEADER:
            continue
        value = str(decode_int64(v)) if k == DIFF_HEADER else escape(v or b"")
        shown.append(f"{escape(k.encode())}={value}")
    return ",".join(shown)


def _headers_json(headers: Any) -> list[list[Any]]:
    from querylib.records import DIFF_HEADER, TIME_HEADER, decode_int64

    return [[k, decode_int64(v) if k == DIFF_HEADER else _json_bytes(v)]
            for k, v in headers if k != TIME_HEADER]


def _json_bytes(value: bytes | None) -> dict[str, str] | str | None:
    return ValueText("bytes").json(value)


class _Printer:
    """Records of one topic as lines: --json, --format, or the default format."""

    def __init__(self, args: argparse.Namespace, topic: str, serde: str) -> None:
        self.topic, self.json = topic, args.json
        self.text = ValueText(serde)
        self.keys = ValueText(serde)
        if args.format is not None and args.json:
            raise UserError("give --format or --json, not both")
        self.format = RecordFormat(args.format) if args.format is not None else None
        self.plain = RecordFormat("%s\n")
        self.keyed = RecordFormat("%k\t%s\n")

    def line(self, partition: int, time: int | None, offset: int | None,
             timestamp: int | None, key: bytes | None, value: bytes | None,
             headers: Any) -> str:
        if self.json:
            body: dict[str, Any] = {"partition": partition, "offset": offset,
                                    "timestamp": timestamp, "time": time,
                                    "key": self.keys.json(key), "value": self.text.json(value)}
            if headers is not None:
                body["headers"] = _headers_json(headers)
            return json.dumps(body) + "\n"
        fmt = self.format or (self.plain if key is None else self.keyed)
        fields: dict[str, str] = {"t": escape(self.topic.encode()), "p": str(partition)}
        uses = fmt.uses
        if "s" in uses:
            fields["s"] = self.text.text(value)
        if "k" in uses:
            fields["k"] = self.keys.text(key)
        if "S" in uses:
            fields["S"] = "-1" if value is None else str(len(value))
        if "K" in uses:
            fields["K"] = "-1" if key is None else str(len(key))
        for letter, number in (("o", offset), ("T", timestamp), ("L", time)):
            if number is not None:
                fields[letter] = str(number)
        if "h" in uses and headers is not None:
            fields["h"] = _headers_text(headers, self.text)
        return fmt.render(fields)

    def warn(self) -> None:
        """One line on stderr if some keys or values were not valid for the serde."""
        bad = self.text.invalid + self.keys.invalid
        if bad:
            print(f"tq: warning: {bad} keys or values of topic {self.topic!r} are not valid "
                  f"{self.text.serde}; they are shown as escaped bytes (--serde bytes shows "
                  "every value so)", file=sys.stderr)


def _consume(args: argparse.Namespace) -> int:
    from querylib.broker import Subscriber
    from querylib.cluster import last_records_start, read_topic

    kind, where = parse_start(args.start)
    if args.count is not None and args.count < 0:
        raise UserError(f"--count {args.count}: a count is >= 0")
    if args.count == 0:
        return 0
    if args.group is not None:
        return _consume_group(args, kind, where)
    start: Any = where if kind == "offset" else kind if kind in ("earliest", "latest") \
        else "earliest"
    if standalone(args):
        # Standalone: every partition the broker has, unless named (it has no catalog).
        from querylib.cli._broker import client_secret

        if kind == "last":
            raise UserError("--from -N finds the last records through the coordinator; with "
                            "--broker give an offset")
        with Subscriber(args.broker, args.topic, args.partitions, secret=client_secret(args),
                        start=start, follow=args.follow, timeout=args.timeout,
                        lease=args.broker_lease) as events:
            return _print(args, events, args.serde or "bytes", kind, where)
    with open_route(args, wait=args.wait) as (route, secret):
        if kind == "last":
            start = last_records_start(route, secret, where, partitions=args.partitions,
                                       timeout=args.timeout)
        found = read_topic(route, secret, partitions=args.partitions, start=start,
                           follow=args.follow, timeout=args.timeout, lease=args.broker_lease)
        with contextlib.closing(found):
            return _print(args, found, args.serde or serde_of(route.record_type), kind, where)


def _print(args: argparse.Namespace, events: Any, serde: str, kind: str, where: Any) -> int:
    """Print the records of `events` as `args` ask (until --count of them)."""
    from querylib.broker import Data, EndOfStream, Progress

    printer = _Printer(args, args.topic, serde)
    out = sys.stdout
    left = args.count
    try:
        for event in events:
            if isinstance(event, Data):
                if kind == "time" and (event.time is None or event.time < where):
                    continue
                for r in event.records:
                    if kind == "timestamp" and r.timestamp < where:
                        continue
                    out.write(printer.line(event.partition, event.time, r.offset,
                                           r.timestamp, r.key, r.value, r.headers))
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
    finally:
        printer.warn()
    return 0


def _consume_group(args: argparse.Namespace, kind: str, where: Any) -> int:
    """Read as a member of a Kafka consumer group, through querylib's group member."""
    import querylib
    from querylib.api import Data, EndOfStream
    from querylib.api.serdes import Serde

    if standalone(args):
        raise UserError("--group needs the coordinator (the group's offsets live on a "
                        "cluster broker); leave out --broker")
    if kind not in ("earliest", "latest", "offset"):
        raise UserError(f"--from {args.start!r} with --group: use earliest, latest or an "
                        "offset (where a partition with no committed offset starts)")
    with open_route(args, wait=args.wait, watch=False) as (route, _):  # the topic's serde
        serde = args.serde or serde_of(route.record_type)
    printer = _Printer(args, args.topic, serde)
    # The member checks the topic's serde: it gets the stored bytes and this prints them.
    raw = Serde(serde_of(route.record_type), bytes, bytes)
    out = sys.stdout
    left = args.count
    with querylib.connect(args.coordinator, secret_file=args.secret_file) as ctx, \
            ctx.subscribe(args.topic, partitions=args.partitions,
                          start=where if kind == "offset" else kind, serde=raw,
                          group=args.group, timeout=max(args.timeout, args.wait or 0.1)) as sub:
        try:
            for event in sub:
                if isinstance(event, EndOfStream):
                    if args.json:
                        out.write(json.dumps({"end_of_stream": True}) + "\n")
                    break
                if not isinstance(event, Data):
                    continue
                for record in event.records:
                    value = record[0] if isinstance(record, tuple) else record
                    out.write(printer.line(event.partition, event.time, None, None, None,
                                           value, None))
                # A member commits whole events: --count ends after the event it falls in,
                # so no record is committed unprinted.
                if left is not None:
                    left -= len(event.records)
                    if left <= 0:
                        return 0
                out.flush()
        finally:
            out.flush()
            printer.warn()
    return 0
