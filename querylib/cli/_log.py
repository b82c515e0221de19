"""`tq log dump PATH`: print a segment's batches (and records), like kafka-dump-log.

A thin adapter over `querylib.log.dump_segment`: this module only renders its rows, as
kafka-dump-log's `key: value` lines or (--json) one JSON object per line.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def register(sub: argparse._SubParsersAction) -> None:
    log = sub.add_parser("log", help="inspect partition log files")
    log_sub = log.add_subparsers(dest="log_command", metavar="COMMAND")
    log_sub.required = True
    dump = log_sub.add_parser(
        "dump", help="print the batches of a .log segment file",
        description="Print the batches of a segment file like kafka-dump-log: a .log file (or "
        "every .log of a partition directory), or the entries of a .index or .timeindex file.")
    dump.add_argument("path", help="a segment file (<20-digit base offset>.log)")
    dump.add_argument("--records", action="store_true", help="also print every record")
    dump.add_argument("--json", action="store_true", help="one JSON object per line")
    dump.set_defaults(func=_dump)


def _dump(args: argparse.Namespace) -> int:
    from querylib.log import dump_segment

    out = sys.stdout
    for row in dump_segment(args.path, records=args.records):
        out.write((json.dumps(row) if args.json else render_row(row)) + "\n")
    out.flush()
    return 0


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ",".join(map(str, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def _pairs(row: dict[str, Any], skip: tuple[str, ...] = ("type",)) -> str:
    return " ".join(f"{k}: {_value(v)}" for k, v in row.items() if k not in skip)


def render_row(row: dict[str, Any]) -> str:
    """One row as kafka-dump-log prints it."""
    kind = row["type"]
    if kind == "segment":
        return f"Dumping {row['path']}\nLog starting offset: {_value(row['baseOffset'])}"
    if kind in ("index", "timeindex"):
        return f"Dumping {row['path']} ({row['entries']} entries)"
    if kind == "record":
        return "| " + _pairs(row)
    if kind == "invalid":
        where = f"at position {row['position']}" if "position" in row else (
            f"in batch {row.get('baseOffset')}")
        size = f"{row['invalidBytes']} invalid bytes " if "invalidBytes" in row else ""
        return f"Found {size}{where}: {row['reason']}"
    return _pairs(row)
