"""`tq produce TOPIC --broker ADDR`: stdin lines become records of one partition.

A thin adapter over `querylib.broker.Producer`. At end of input the producer ends its stream
(end-of-stream control record) unless --no-end is given.
"""

from __future__ import annotations

import argparse
import sys

from querylib.cli._broker import add_client_options, client_secret


def register(sub: argparse._SubParsersAction) -> None:
    produce = sub.add_parser("produce", help="send stdin lines as records to a topic partition")
    produce.add_argument("topic")
    add_client_options(produce)
    produce.add_argument("--partition", type=int, default=0, help="partition (default 0)")
    produce.add_argument("--key-separator", metavar="SEP",
                         help="split each line at the first SEP into key and value")
    produce.add_argument("--time", type=int, metavar="T",
                         help="logical time of every record (the tq.time header)")
    produce.add_argument("--no-end", action="store_true",
                         help="do not end the stream at end of input")
    produce.set_defaults(func=_produce)


def _produce(args: argparse.Namespace) -> int:
    from querylib.broker import Producer

    sep = args.key_separator.encode() if args.key_separator else None
    count = 0
    with Producer(args.broker, args.topic, args.partition, secret=client_secret(args),
                  timeout=args.timeout) as producer:
        try:
            for line in sys.stdin.buffer:
                value = line.rstrip(b"\r\n")
                key = None
                if sep is not None and sep in value:
                    key, value = value.split(sep, 1)
                producer.send(value, key=key, time=args.time)
                count += 1
        finally:
            producer.close(end=not args.no_end)
    last = producer.last_acked
    where = f", last offset {last.next_offset - 1}" if last is not None else ""
    print(f"produced {count} records to {args.topic}-{args.partition}{where}", file=sys.stderr)
    return 0
