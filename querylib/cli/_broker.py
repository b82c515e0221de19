"""`tq broker`: run a standalone broker in the foreground (development, tests).

A thin adapter over `querylib.broker.run_broker`; also home of the options every broker client
command shares (`--broker`, `--secret-file`).
"""

from __future__ import annotations

import argparse
import sys


def register(sub: argparse._SubParsersAction) -> None:
    broker = sub.add_parser("broker", help="run a standalone broker (development, tests)")
    broker.add_argument("--data", required=True, help="data directory holding the partitions")
    broker.add_argument("--listen", default="tcp://127.0.0.1:7500",
                        help="ZeroMQ endpoint to bind (default tcp://127.0.0.1:7500)")
    broker.add_argument("--secret-file", help="cluster secret (default $TQ_HOME/secret, "
                        "created if missing)")
    broker.add_argument("--flush", choices=["never", "interval", "always"], default="never",
                        help="when appends are fsynced before they are acknowledged "
                        "(default never: the OS writes back, as Kafka's default)")
    broker.add_argument("--flush-interval-ms", type=int, default=1000,
                        help="with --flush interval: fsync at most this long after an append")
    broker.add_argument("--segment-bytes", type=int, default=1024 * 1024 * 1024,
                        help="roll a segment at this size (default 1 GiB)")
    broker.add_argument("--retention-bytes", type=int, default=-1,
                        help="keep at most this many bytes per partition (-1: no limit)")
    broker.set_defaults(func=_run)


def add_client_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--broker", required=True, metavar="ADDR",
                        help="the broker's endpoint, e.g. tcp://127.0.0.1:7500")
    parser.add_argument("--secret-file", help="cluster secret (default $TQ_HOME/secret)")
    parser.add_argument("--timeout", type=float, default=30.0,
                        help="seconds to wait for the broker (default 30)")


def client_secret(args: argparse.Namespace) -> bytes:
    from querylib.rpc import default_secret_path, load_secret

    return load_secret(args.secret_file or default_secret_path())


def _run(args: argparse.Namespace) -> int:
    from querylib.broker import run_broker
    from querylib.log import LogConfig
    from querylib.rpc import default_secret_path, load_or_create_secret

    secret = load_or_create_secret(args.secret_file or default_secret_path())
    config = LogConfig(segment_bytes=args.segment_bytes, retention_bytes=args.retention_bytes,
                       flush=args.flush, flush_interval_ms=args.flush_interval_ms)

    def ready(endpoint: str) -> None:
        print(f"tq broker listening on {endpoint} (data {args.data}, flush {args.flush})",
              file=sys.stderr, flush=True)

    return run_broker(args.data, args.listen, secret, log_config=config, on_ready=ready)
