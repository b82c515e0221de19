"""`tq submit`: pack a program, upload it to the coordinator, and run it as a query (DESIGN §6).

A thin adapter over `querylib.artifacts` and the cluster client. The command returns once every
process of the query registered (the query runs; one that waits for free process slots says it
is pending first), or fails with the reason it could not start. With `--wait` it then prints
the query's output as it comes (as `tq logs --follow`) until the query ends, and exits 0 if
it finished, 1 if it failed or was killed (saying why), 130 on Ctrl-C (the query runs on; it
says how to follow or kill it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from querylib._argtypes import seconds
from querylib.cli._catalog import add_cluster_options, connect


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "submit", help="run a program (file or directory) as a query on the executors",
        description="Pack PROGRAM (a .py file, or a directory with __main__.py), upload it "
        "to the coordinator, and start it as a query of N processes x W workers. Arguments "
        "after `--` go to the program. With --wait, print its output until it ends.",
        epilog="example: tq submit count.py --processes 2 --wait -- --limit 1000")
    parser.add_argument("program", help="a Python file, or a directory with __main__.py")
    _add_options(parser)
    # Everything after PROGRAM: its options (re-parsed in _submit), then `--` and the
    # program's arguments. argparse alone cannot take options after a REMAINDER positional.
    parser.add_argument("rest", nargs=argparse.REMAINDER, help="-- then the program's arguments")
    parser.set_defaults(func=_submit)


def _add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--processes", type=int, default=1, help="processes (default 1)")
    parser.add_argument("--workers", type=int, default=1,
                        help="workers per process (default 1)")
    parser.add_argument("--name", help="query name (default: the program's name)")
    parser.add_argument("--executor", type=int, action="append", dest="executors",
                        metavar="ID", help="pin process i to this executor (repeat once per "
                        "process)")
    parser.add_argument("--wait", action="store_true",
                        help="print the query's output until it ends; exit 0 if it "
                        "finished, 1 if not, 130 on Ctrl-C (the query runs on)")
    parser.add_argument("--start-timeout", type=seconds, metavar="SECONDS",
                        help="fail the query unless every process has started this long "
                        "after submission, waiting for free slots included (default: the "
                        "coordinator's, 60)")
    add_cluster_options(parser)


def _split(args: argparse.Namespace) -> list[str]:
    """Parse the options given after PROGRAM into `args`; returns the program's arguments.
    (argparse drops a `--` right after PROGRAM itself, so what it does not know goes to the
    program too.)"""
    rest = list(args.rest)
    cut = rest.index("--") if "--" in rest else len(rest)
    late = argparse.ArgumentParser(prog="tq submit PROGRAM", add_help=False)
    _add_options(late)
    _, unknown = late.parse_known_args(rest[:cut], namespace=args)
    return unknown + rest[cut + 1:]


def _submit(args: argparse.Namespace) -> int:
    from catalog import UserError
    from querylib.api._submit import MAX_PROGRAM_BYTES
    from querylib.artifacts import pack_path, sha256_hex
    from querylib.cli._output import OutputOptions, print_output

    program_args = _split(args)
    if args.executors is not None and len(args.executors) != args.processes:
        raise UserError(f"--executor given {len(args.executors)} times for "
                        f"{args.processes} processes: pin every process or none")
    path = Path(args.program)
    pack = pack_path(path, max_bytes=MAX_PROGRAM_BYTES)
    digest = sha256_hex(pack)
    with connect(args, session=True) as cluster:
        source = cluster.upload_artifact(digest, pack)
        query = cluster.submit_query(
            args.name or path.stem, source, processes=args.processes, workers=args.workers,
            args=tuple(program_args),
            executors=None if args.executors is None else tuple(args.executors),
            start_timeout=args.start_timeout)
        if query.state.value == "pending":
            print(f"query {query.query_id} ({query.name}) pending: waits for "
                  f"{query.processes} free process slots (`tq status` shows the queue)",
                  file=sys.stderr, flush=True)
        query = cluster.await_start(query.query_id)
        print(f"query {query.query_id} ({query.name}) {query.state.value}: "
              f"{query.processes} x {query.workers} on executors "
              f"{', '.join(map(str, query.executors))}", file=sys.stderr, flush=True)
        sys.stdout.write(f"{query.query_id}\n")
        sys.stdout.flush()
        if not args.wait:
            return 0
        try:
            ended = print_output(cluster, query, OutputOptions(), follow=True,
                                 timeout=args.timeout)
        except KeyboardInterrupt:
            print(f"\ntq: stopped waiting; query {query.query_id} ({query.name}) runs on: "
                  f"`tq logs {query.query_id} --follow` follows it, `tq kill "
                  f"{query.query_id}` stops it", file=sys.stderr, flush=True)
            return 130
    print(ended_line(ended), file=sys.stderr, flush=True)
    return 0 if ended.state.value == "finished" else 1


def ended_line(query: Any) -> str:
    """How a query ended, in one line: its state, exit codes, and why (or where to look)."""
    codes = ",".join("-" if c is None else str(c) for c in query.exit_codes)
    line = f"query {query.query_id} ({query.name}) {query.state.value}; exit codes {codes}"
    if query.reason:
        line += f": {query.reason}"
    if query.state.value == "failed":
        line += f" (its output: tq logs {query.query_id})"
    return line

