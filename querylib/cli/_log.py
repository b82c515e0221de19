"""`tq log dump PATH`: print a segment's batches (and records), like kafka-dump-log.
`tq log check [--data DIR | PATH]`: report damaged ranges of partition logs (exit 1 if any).
`tq log repair PATH`: quarantine a partition's damaged ranges.

Thin adapters over `querylib.log` (`dump_segment`, `check_partition`, `repair_partition`):
this module only finds the directories and renders rows, as text (kafka-dump-log's
`key: value` lines for dump) or (--json) one JSON object per line.
"""

from __future__ import annotations

import argparse
import json
import os
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
    check = log_sub.add_parser(
        "check", help="report damaged ranges of partition logs (exit 1 when there are any)",
        description="Validate every segment of partition logs whole and report each damaged "
        "range: segment, byte range, offsets and what is wrong. Exit 0 when none is "
        "found (repaired ones are listed but do not count), 1 when some is. The broker "
        "holding the logs must be stopped. Repair with `tq log repair PARTITION_DIR`.")
    check.add_argument("path", nargs="?", help="a partition directory (<topic>-<partition>), "
                       "or a directory to search for them")
    check.add_argument("--data", metavar="DIR",
                       help="check every partition under this data directory (tq up's "
                       "--data covers the coordinator's and the executor's brokers)")
    check.add_argument("--json", action="store_true", help="one JSON object per line")
    check.set_defaults(func=_check)
    repair = log_sub.add_parser(
        "repair", help="quarantine the damaged ranges of a partition log",
        description="Move the damaged bytes of every segment of a partition aside, to "
        "<segment>.corrupt-<position> beside it, and rewrite the segment without them. The "
        "offsets they held stay a gap: Kafka clients step over it, tq readers get an error "
        "naming it and go on from after it when told to (e.g. `tq consume --from`). The "
        "broker holding the log must be stopped.")
    repair.add_argument("path", help="a partition directory (<topic>-<partition>)")
    repair.add_argument("--json", action="store_true", help="one JSON object per line")
    repair.set_defaults(func=_repair)


def _dump(args: argparse.Namespace) -> int:
    from querylib.log import dump_segment

    out = sys.stdout
    for row in dump_segment(args.path, records=args.records):
        out.write((json.dumps(row) if args.json else render_row(row)) + "\n")
    out.flush()
    return 0


def _check(args: argparse.Namespace) -> int:
    from catalog.errors import UserError
    from querylib.log import check_partition, find_partition_dirs

    if (args.path is None) == (args.data is None):
        raise UserError("give a partition directory or --data DIR (one of them)")
    partitions = find_partition_dirs(args.data or args.path)
    if not partitions:
        raise UserError(f"{args.data or args.path}: no partition logs (<offset>.log files) "
                        "under it")
    out = sys.stdout
    damaged = 0
    for partition in partitions:
        for finding in check_partition(partition):
            damaged += finding.kind != "repaired"
            out.write((json.dumps(finding.as_json()) if args.json
                       else finding.describe()) + "\n")
    if not args.json:
        verdict = (f"{damaged} damaged range(s); quarantine them with `tq log repair "
                   "PARTITION_DIR` (the broker stopped)" if damaged else "no damage found")
        out.write(f"checked {len(partitions)} partition(s): {verdict}\n")
    out.flush()
    return 1 if damaged else 0


def _repair(args: argparse.Namespace) -> int:
    from catalog.errors import UserError
    from querylib.log import find_partition_dirs, repair_partition

    path = os.path.normpath(args.path)
    if find_partition_dirs(path) != [path]:
        raise UserError(f"{args.path}: not a partition directory (<topic>-<partition> holding "
                        "<offset>.log files); `tq log check --data DIR` lists them")
    out = sys.stdout
    repaired = repair_partition(path)
    for finding in repaired:
        if args.json:
            out.write(json.dumps(finding.as_json()) + "\n")
        else:
            out.write(f"quarantined {finding.segment}: {finding.damage.describe()}\n")
    if not args.json:
        out.write(f"{path}: {len(repaired)} damaged range(s) quarantined\n" if repaired
                  else f"{path}: nothing to repair\n")
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
