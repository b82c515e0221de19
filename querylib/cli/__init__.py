"""The `tq` command: a thin adapter that parses arguments, calls a library function and renders.

Each command family lives in its own module with a `register(subparsers)` function; no logic lives
only here. A `TqError` becomes one line on stderr and its `exit_code`; anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from catalog.errors import TqError

# Command modules, in the order `tq --help` lists them. Each defines register(subparsers).
_COMMAND_MODULES = [
    "querylib.cli._demo",
    "querylib.cli._log",
    "querylib.cli._coordinator",
    "querylib.cli._catalog",
    "querylib.cli._broker",
    "querylib.cli._produce",
    "querylib.cli._consume",
    "querylib.cli._kafka",
    "querylib.cli._ingest",
    "querylib.cli._up",
    "querylib.cli._executor",
    "querylib.cli._submit",
    "querylib.cli._query",
    "querylib.cli._user",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tq",
        description="tq: timely-style publish/subscribe for Python and Spark.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = args.func(args)
    except TqError as exc:
        print(f"tq: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
