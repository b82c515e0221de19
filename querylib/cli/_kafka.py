"""`tq kafka`: serve a data directory over the Kafka protocol, standalone (development, tests):
a tq broker with only its Kafka listener.

A thin adapter over `querylib.kafka.run_kafka`.
"""

from __future__ import annotations

import argparse
import logging
import sys

from querylib._argtypes import integer, port
from querylib.cli._broker import add_kafka_limit_options, kafka_limits


def register(sub: argparse._SubParsersAction) -> None:
    kafka = sub.add_parser(
        "kafka", help="serve a data directory to Kafka clients (development, tests)",
        description="Serve the partitions of a data directory over the Kafka protocol, so "
        "kcat, confluent-kafka, kafka-python and aiokafka can list, consume, commit and "
        "produce: a tq broker with only its Kafka listener (no RPC port). One process; stop "
        "with Ctrl-C.")
    kafka.add_argument("--data", required=True, help="data directory holding the partitions")
    kafka.add_argument("--host", default="127.0.0.1",
                       help="address to bind (default 127.0.0.1)")
    kafka.add_argument("--port", type=port, default=9092, help="port to bind (default 9092)")
    kafka.add_argument("--advertised-host",
                       help="host name clients are told to connect to (default: --host)")
    kafka.add_argument("--no-auto-create", action="store_true",
                       help="refuse to create topics that producers or Metadata name")
    kafka.add_argument("--partitions", type=integer(1), default=1,
                       help="partitions of auto-created topics (default 1)")
    kafka.add_argument("--flush", choices=["never", "interval", "always"], default="never",
                       help="when appends are fsynced before acks=all is answered")
    kafka.add_argument("--max-frame-bytes", type=integer(1), default=100 * 1024 * 1024,
                       help="largest request accepted (default 100 MiB)")
    add_kafka_limit_options(kafka)
    kafka.add_argument("-v", "--verbose", action="store_true", help="log connections")
    kafka.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from querylib._tcp import raise_fd_limit
    from querylib.log import LogConfig
    from querylib.server import run_kafka

    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    raise_fd_limit()

    def ready(listener: object) -> None:
        port = getattr(listener, "port", args.port)
        print(f"tq kafka listening on {args.host}:{port} (data {args.data})",
              file=sys.stderr, flush=True)

    return run_kafka(
        args.data, args.host, args.port, on_ready=ready,
        advertised_host=args.advertised_host, log_config=LogConfig(flush=args.flush),
        limits=kafka_limits(args, max_frame_bytes=args.max_frame_bytes),
        auto_create_topics=not args.no_auto_create, default_partitions=args.partitions)
