"""`tq produce TOPIC [FILE|-]`: lines become records of a topic (DESIGN §9).

A thin adapter over `querylib.cluster.TopicWriter`: the coordinator (--coordinator,
TQ_COORDINATOR or $TQ_HOME/cluster.json) says which brokers host the topic's partitions, and
the lines go there, to --partition N, else by key hash (--key-separator), else round-robin.
`--create --partitions N` creates a missing topic, owned by ingest. Line i gets logical time
i (the tq.time header) unless --time T gives all of them T. At end of input every partition
written ends its stream, unless --keep-open (then the frontier moves past the last time).
`--broker ADDR` writes one partition of a standalone broker directly.
Lines are checked against the topic's serde (`_records_text.LineEncoder`): a json topic takes
one JSON value per line and refuses the first that is not, naming its line number; a msgpack
topic takes JSON lines and encodes them; bytes take anything; pickle topics are refused.
`--header K=V` (repeatable) sets headers on every record.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, BinaryIO

from catalog.errors import UserError
from querylib._argtypes import integer
from querylib.cli._consume import add_topic_client_options, open_route, standalone
from querylib.cli._records_text import SERDES, LineEncoder, serde_of

if TYPE_CHECKING:
    from querylib.cluster import TopicRoute
    from querylib.rpc import Credential


def register(sub: argparse._SubParsersAction) -> None:
    produce = sub.add_parser(
        "produce", help="send lines (stdin or a file) as records to a topic",
        description="Send each line as one record. Lines are checked against the topic's "
        "serde: a json topic takes one JSON value per line, a msgpack topic takes JSON lines "
        "and encodes them, a bytes topic takes anything.",
        epilog="example: printf '{\"x\": 1}\\n' | tq produce events --header source=cli")
    produce.add_argument("topic")
    produce.add_argument("file", nargs="?", default="-",
                         help="file of lines to send (default -, stdin)")
    add_topic_client_options(produce)
    produce.add_argument("--partition", type=integer(0),
                         help="send every line to this partition (default: by key, else "
                         "round-robin; 0 with --broker)")
    produce.add_argument("--key-separator", metavar="SEP",
                         help="split each line at the first SEP into key and value")
    produce.add_argument("--time", type=int, metavar="T",
                         help="logical time of every record (default: line number, from 0)")
    produce.add_argument("--create", action="store_true",
                         help="create the topic (owned by ingest) if it does not exist")
    produce.add_argument("--partitions", type=integer(1), default=1, metavar="N",
                         help="partitions of a topic made by --create (default 1)")
    produce.add_argument("-H", "--header", action="append", default=[], metavar="K=V",
                         dest="headers", help="a header on every record (repeatable)")
    produce.add_argument("--serde", choices=SERDES,
                         help="check and encode lines for this serde instead of the topic's "
                         "(a standalone --broker has no catalog: bytes unless given)")
    produce.add_argument("--keep-open", "--no-end", dest="keep_open", action="store_true",
                         help="do not end the stream at end of input")
    produce.set_defaults(func=_produce)


def _lines(path: str) -> Iterator[bytes]:
    source: BinaryIO
    if path == "-":
        source = sys.stdin.buffer
        yield from (line.rstrip(b"\r\n") for line in source)
        return
    try:
        source = open(path, "rb")  # noqa: SIM115 - closed below, also when abandoned
    except OSError as exc:
        raise UserError(f"{path}: {exc.strerror or exc}") from exc
    with source:
        yield from (line.rstrip(b"\r\n") for line in source)


def _header(text: str) -> tuple[str, bytes]:
    from querylib.records import DIFF_HEADER, TIME_HEADER

    name, sep, value = text.partition("=")
    if not sep or not name:
        raise UserError(f"--header {text!r}: give NAME=VALUE")
    if name in (TIME_HEADER, DIFF_HEADER):
        raise UserError(f"--header {name}: tq sets that header itself (--time sets the "
                        "logical time)")
    return name, value.encode()


def _produce(args: argparse.Namespace) -> int:
    from querylib.cli._broker import client_secret
    from querylib.cluster import TopicRoute

    if args.partitions < 1:
        raise UserError(f"--partitions {args.partitions}: a topic has at least one partition")
    headers = tuple(_header(h) for h in args.headers)
    if standalone(args):
        partition = args.partition or 0
        if partition < 0:
            raise UserError(f"--partition {partition}: a partition is >= 0")
        # A standalone broker has no catalog: the partition exists once it is written.
        route = TopicRoute(name=args.topic, partitions=partition + 1,
                           addresses=(args.broker,) * (partition + 1), ingest=True)
        args.partition = partition
        return _write(args, route, client_secret(args), headers)
    with open_route(args, create_partitions=args.partitions if args.create
                    else None) as (route, secret):
        return _write(args, route, secret, headers)


def _write(args: argparse.Namespace, route: TopicRoute, secret: bytes | Credential,
           headers: tuple[tuple[str, bytes], ...]) -> int:
    """Send the lines of args.file to `route`'s topic, as `args` ask."""
    from querylib.cluster import TopicWriter

    sep = args.key_separator.encode() if args.key_separator else None
    encoder = LineEncoder(args.serde or serde_of(route.record_type), route.name,
                          "stdin" if args.file == "-" else args.file)
    count = 0
    time = args.time
    with TopicWriter(route, secret, timeout=args.timeout, lease=args.broker_lease) as writer:
        for value in _lines(args.file):
            key = None
            if sep is not None and sep in value:
                key, value = value.split(sep, 1)
                key = encoder.key(key)
            writer.send(encoder.value(value, count + 1), key=key, partition=args.partition,
                        time=count if args.time is None else args.time, headers=headers)
            count += 1
        if args.keep_open:
            last = count - 1 if time is None else time
            if last >= 0:
                writer.advance(last + 1)  # readers may go past what was sent
            writer.close(end=False)
    counts = ", ".join(f"{route.name}-{p}: {n}" for p, n in sorted(writer.counts.items()))
    print(f"produced {count} records" + (f" ({counts})" if counts else ""), file=sys.stderr)
    return 0
