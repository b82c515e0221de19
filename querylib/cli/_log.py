"""`tq log dump PATH`: print a segment's batches (and records), like kafka-dump-log."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    log = sub.add_parser("log", help="inspect partition log files")
    log_sub = log.add_subparsers(dest="log_command", metavar="COMMAND")
    log_sub.required = True
    dump = log_sub.add_parser("dump", help="print the batches of a .log segment file")
    dump.add_argument("path", help="a segment file (<20-digit base offset>.log)")
    dump.add_argument("--records", action="store_true", help="also print every record")
    dump.add_argument("--json", action="store_true", help="one JSON object per line")
    dump.set_defaults(func=_dump)


def _dump(args: argparse.Namespace) -> int:
    raise NotImplementedError("tq log dump is built by the partition-log work")
