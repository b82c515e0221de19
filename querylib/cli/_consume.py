"""`tq consume TOPIC --broker ADDR`: print the records of a topic's partitions.

A thin adapter over `querylib.broker.Subscriber`: one line per record (the value, or a JSON
object with --json), progress and end-of-stream as JSON lines with --json. Without --follow it
stops at the end of what was stored when it started.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys

from catalog.errors import UserError
from querylib.cli._broker import add_client_options, client_secret


def register(sub: argparse._SubParsersAction) -> None:
    consume = sub.add_parser("consume", help="print the records of a topic")
    consume.add_argument("topic")
    add_client_options(consume)
    consume.add_argument("--partition", type=int, action="append", dest="partitions",
                         help="partition to read (repeatable; default all)")
    consume.add_argument("--from", dest="start", default="earliest",
                         help="earliest, latest or an offset (default earliest)")
    consume.add_argument("--follow", action="store_true",
                         help="keep printing new records until end-of-stream")
    consume.add_argument("--json", action="store_true", help="one JSON object per line")
    consume.set_defaults(func=_consume)


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
    from querylib.records import TIME_HEADER

    start = parse_start(args.start)
    out = sys.stdout
    with Subscriber(args.broker, args.topic, args.partitions, secret=client_secret(args),
                    start=start, follow=args.follow, timeout=args.timeout) as sub:
        for event in sub:
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
            elif isinstance(event, Progress) and args.json:
                out.write(json.dumps({"progress": event.frontier}) + "\n")
            elif isinstance(event, EndOfStream) and args.json:
                out.write(json.dumps({"end_of_stream": True}) + "\n")
            out.flush()
    return 0
