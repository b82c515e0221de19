"""The `tq` command: a thin adapter that parses arguments, calls a library function and renders.

Each command family lives in its own module with a `register(subparsers)` function; no logic lives
only here. A `TqError` becomes one line on stderr and its `exit_code`; anything else is a bug and
keeps its traceback.

Here too: `tq --version`, `tq --help` listing the commands in groups (`GROUPS`), and the one
example every command's help ends with (`EXAMPLES`, keyed by the command's words; a test checks
that every command, nested ones too, has its group and its example).
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
    "querylib.cli._token",
]


# How `tq --help` groups the commands, in this order.
GROUPS = {
    "cluster": ["up", "coordinator", "executor", "user", "token"],
    "queries": ["submit", "status", "logs", "kill"],
    "topics": ["topics", "topic", "produce", "consume", "ingest"],
    "tools": ["demo", "catalog", "log", "broker", "kafka"],
}

# One example per command (its words joined by spaces), shown at the end of its help.
EXAMPLES = {
    "up": "tq up --data ./tq-data        # then, in another shell: tq status",
    "coordinator": "tq coordinator --data ./coord --listen tcp://0.0.0.0:7400",
    "executor": "tq executor --join TOKEN --data /var/lib/tq   # TOKEN: tq token create",
    "user": "tq user add alice -o alice.cred",
    "user add": "tq user add alice -o alice.cred",
    "user rotate": "tq user rotate alice -o alice.cred",
    "user remove": "tq user remove alice",
    "user list": "tq user list --json",
    "token": "tq token create --ttl 30m      # then on the new host: tq executor --join TOKEN",
    "token create": "tq token create --ttl 30m --name gpu-1",
    "token list": "tq token list --json",
    "token revoke": "tq token revoke 3",
    "submit": "tq submit my_query.py --processes 2 --name clicks --wait",
    "status": "tq status          # or: tq status 12 (one query)",
    "logs": "tq logs 12 --follow",
    "kill": "tq kill 12 --reason 'wrong input'",
    "topics": "tq topics --json",
    "topic": "tq topic create readings --partitions 4",
    "topic create": "tq topic create readings --partitions 4",
    "topic delete": "tq topic delete readings",
    "produce": "seq 10 | tq produce nums --create",
    "consume": "tq consume nums --from earliest --count 10",
    "ingest": "tail -F app.log | tq ingest app-lines -",
    "demo": "tq demo --events 2000",
    "catalog": "tq catalog queries --follow",
    "log": "tq log check --data ./tq-data",
    "log dump": "tq log dump ./tq-data/executor/broker/nums-0/00000000000000000000.log "
                "--records",
    "log check": "tq log check --data ./tq-data      # while tq up is stopped",
    "log repair": "tq log repair ./tq-data/executor/broker/nums-0",
    "broker": "tq broker --data ./broker-data --listen tcp://127.0.0.1:7500",
    "broker decommission": "tq broker decommission 4   # broker 4's host is gone for good",
    "kafka": "tq kafka --data ./tq-data/executor/broker --port 9092",
}

_START = ("Start with `tq demo`, or `tq up` and then `tq submit my_query.py`. "
          "`tq COMMAND --help` shows a command's options and an example.")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tq", usage="tq [-h] [--version] COMMAND ...",
        description="tq: timely-style publish/subscribe for Python and Spark.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"tq {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", help=argparse.SUPPRESS,
                                prog="tq")
    sub.required = True
    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    for words, command in commands(parser):
        example = EXAMPLES.get(" ".join(words))
        if example is not None:
            command.epilog = f"example: {example}"
            command.formatter_class = _Formatter
    parser.description = "\n".join([parser.description or "", "", *_grouped(sub), "", _START])
    return parser


class _Formatter(argparse.HelpFormatter):
    """Reflows descriptions as usual, but not the example: a command is not prose."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith("example: "):
            return indent + text
        return super()._fill_text(text, width, indent)


def commands(parser: argparse.ArgumentParser,
             words: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every command under `parser`, nested ones too, with its words: [(("log", "dump"), p)]."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, command in action.choices.items():
                found.append(((*words, name), command))
                found += commands(command, (*words, name))
    return found


def _grouped(sub: argparse._SubParsersAction) -> list[str]:
    """The commands under their group names, each with its one-line help."""
    helps = {action.dest: action.help or "" for action in sub._choices_actions}
    grouped = [name for names in GROUPS.values() for name in names]
    groups = {**GROUPS, "other": [name for name in helps if name not in grouped]}
    width = max(len(name) for name in helps)
    lines = []
    for group, names in groups.items():
        shown = [name for name in names if name in helps]
        if shown:
            lines.append(f"{group}:")
            lines += [f"  {name.ljust(width)}  {helps[name]}" for name in shown]
    return lines


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tq")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "(not installed)"


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
