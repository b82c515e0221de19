"""`tq ingest TOPIC [FILE|-]`: lines or JSON lines into a topic through the connector protocol.

A thin adapter over `querylib.connector.ingest`. The endpoint is --connector, else
$TQ_CONNECTOR, else the one `tq up` wrote into cluster.json, else 127.0.0.1:7600. The cookie is
--cookie, else derived from the cluster secret file (the endpoint derives the same one), else
empty. Progress goes to stderr:
a live line when stderr is a terminal, otherwise one line every 10 seconds for long runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import TYPE_CHECKING

from querylib._argtypes import seconds

if TYPE_CHECKING:
    import ssl


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ingest", help="push lines or JSON lines into a topic through the "
                       "connector protocol (exactly once per line when re-run)")
    p.add_argument("topic", help="topic, optionally with a partition: TOPIC:N")
    p.add_argument("file", nargs="?", default="-", help="input file, or - for stdin (default)")
    p.add_argument("--format", choices=["lines", "jsonl"], default="lines",
                   help="lines: each line is a value; jsonl: each line is JSON, objects with "
                   "a \"value\" member give value, key and timestamp (default lines)")
    p.add_argument("--connector", metavar="ADDR", default=None,
                   help="the connector endpoint, HOST:PORT (default $TQ_CONNECTOR, else "
                   "the one in $TQ_HOME/cluster.json, else 127.0.0.1:7600)")
    p.add_argument("--dialect", choices=["draft", "released"], default="draft",
                   help="connector protocol dialect (default draft)")
    p.add_argument("--program", default="tq-ingest", help="connector program name")
    p.add_argument("--instance", help="connector instance name: the same program and instance "
                   "resume where they stopped (default: the file's path; a new one for stdin)")
    p.add_argument("--cookie", help="connector cookie (default: derived from the secret file)")
    p.add_argument("--tls-ca", metavar="FILE",
                   help="speak TLS to the endpoint, trusting the certificates in FILE (PEM)")
    p.add_argument("--secret-file", help="cluster secret (default $TQ_HOME/secret)")
    p.add_argument("--no-end", action="store_true", help="do not end the stream at end of input")
    p.add_argument("--timeout", type=seconds, default=30.0,
                   help="seconds without an answer before reconnecting (default 30)")
    p.set_defaults(func=_ingest)


def client_tls(ca_file: str | None) -> ssl.SSLContext | None:
    """A TLS client context trusting `ca_file` (None: no TLS); UserError if unreadable."""
    if ca_file is None:
        return None
    import ssl

    from catalog.errors import UserError

    try:
        return ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise UserError(f"--tls-ca {ca_file}: {exc}") from None


def _cluster() -> object | None:
    """What cluster.json says, if anything usable: it only supplies defaults here."""
    from catalog.errors import TqError
    from querylib.cluster import read_cluster_file

    try:
        return read_cluster_file()
    except TqError:
        return None


def _cookie(args: argparse.Namespace, cluster: object | None) -> str:
    if args.cookie is not None:
        return args.cookie
    from querylib.rpc import default_secret_path, load_secret
    from querylib.server.connector import derive_cookie

    path = args.secret_file or getattr(cluster, "secret_file", None) or default_secret_path()
    if args.secret_file is None and not os.path.exists(path):
        return ""
    return derive_cookie(load_secret(path))


class _Progress:
    """Renders progress on stderr: a live line on a terminal, else a line every 10 s."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.start = time.monotonic()
        self.last = self.start

    def __call__(self, done: int, skipped: int) -> None:
        now = time.monotonic()
        rate = done / max(now - self.start, 1e-9)
        text = f"ingested {done:,} lines ({skipped:,} already stored), {rate:,.0f}/s"
        if self.tty:
            print(f"\r{text}", end="", file=sys.stderr, flush=True)
        elif now - self.last >= 10.0:
            self.last = now
            print(text, file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.tty:
            print(file=sys.stderr)


def _ingest(args: argparse.Namespace) -> int:
    from querylib.connector import ingest

    cluster = _cluster()
    address = (args.connector or os.environ.get("TQ_CONNECTOR")
               or getattr(cluster, "connector", "") or "127.0.0.1:7600")
    progress = _Progress()
    try:
        result = ingest(args.file, args.topic, address=address, dialect=args.dialect,
                        fmt=args.format, program=args.program, instance=args.instance,
                        cookie=_cookie(args, cluster), timeout=args.timeout, end=not args.no_end,
                        progress=progress, ssl_context=client_tls(args.tls_ca))
    finally:
        progress.done()
    where = "" if result.processed is None else f", stream at message {result.processed}"
    print(f"ingested {result.sent:,} lines into {args.topic} ({result.skipped:,} already "
          f"stored{where}) in {result.seconds:.1f}s", file=sys.stderr)
    return 0
