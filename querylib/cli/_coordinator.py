"""`tq coordinator`: run the coordinator in the foreground (DESIGN §9).

A thin adapter over `coordinator.run_coordinator`. It writes `$TQ_HOME/cluster.json` (the
coordinator's address and the secret file's path) so that clients on this machine need no
flags, and removes it on a clean exit; it refuses to start, naming the running one, when a
cluster already runs under this TQ_HOME (run_coordinator). The `coordinator` package is
imported only when the command runs: the rest of `querylib` never depends on the server.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import sys
from typing import Any

from querylib._argtypes import integer, seconds
from querylib.cli._broker import add_kafka_options, kafka_config
from querylib.cli._console import add_console_options, console_line, start_console


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "coordinator", help="run the coordinator (catalog, sessions, catalog topics)",
        description="Run the coordinator in the foreground: it serves the catalog over RPC, "
        "keeps client sessions alive by their leases, and persists the catalog as "
        "__catalog.* topics on an embedded broker under --data. That broker's Kafka listener "
        "(--kafka-port, default any free port) is the group coordinator of Kafka clients' and "
        "querylib's consumer groups. It writes "
        "$TQ_HOME/cluster.json so that other tq commands on this machine find it.")
    parser.add_argument("--data", help="data directory (default $TQ_HOME/coordinator)")
    parser.add_argument("--listen", default="tcp://127.0.0.1:7400",
                        help="ZeroMQ endpoint to serve RPC on (default tcp://127.0.0.1:7400)")
    parser.add_argument("--broker-listen", metavar="ADDR",
                        help="endpoint of the embedded broker serving the catalog topics "
                        "(default: the --listen port + 1)")
    parser.add_argument("--advertise", metavar="HOST",
                        help="the address other hosts reach this host at, when --listen (or "
                        "--broker-listen, --kafka-host) is 0.0.0.0; join tokens name it "
                        "(default: the address of this host's name)")
    parser.add_argument("--secret-file", help="cluster secret (default $TQ_HOME/secret, "
                        "created if missing)")
    parser.add_argument("--recovery-lease", type=seconds, default=10.0, metavar="SECONDS",
                        help="after a restart, how long sessions have to come back before "
                        "they expire (default 10)")
    parser.add_argument("--checkpoint-updates", type=integer(1), default=4096, metavar="N",
                        help="checkpoint the catalog topics after N updates (or half the "
                        "catalog's size, if more), so late followers and recovery read little "
                        "history (default 4096)")
    parser.add_argument("--etcd", metavar="HOST:PORT[,...]",
                        help="failover (DESIGN §3): the etcd members; the coordinator serves "
                        "only while it holds the active lease there, replicates every catalog "
                        "commit to etcd, and otherwise waits as a standby to take over")
    parser.add_argument("--standby", action="store_true",
                        help="with --etcd: say so (every coordinator given --etcd campaigns; "
                        "one that finds another active waits as a standby)")
    parser.add_argument("--cluster-name", default="tq", metavar="NAME",
                        help="with --etcd: the cluster's keys are under /tq/NAME/ (default tq)")
    parser.add_argument("--active-lease", type=seconds, default=5.0, metavar="SECONDS",
                        help="with --etcd: the active coordinator's etcd lease; a standby "
                        "takes over within it of the active one's death (default 5)")
    add_kafka_options(parser, default_port=0)
    add_namespace_options(parser)
    add_console_options(parser)
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    parser.set_defaults(func=_run)


def add_namespace_options(parser: argparse.ArgumentParser) -> None:
    """--tenant and --namespace: the cluster's default, what a bare topic name means."""
    parser.add_argument("--tenant", help="the default tenant: a topic name without one means "
                        "TENANT/NAMESPACE/NAME (default public; chosen when the cluster is "
                        "first started, kept after)")
    parser.add_argument("--namespace", help="the default namespace (default: default), as "
                        "--tenant")


def namespace_of(args: argparse.Namespace) -> str | None:
    """The default `tenant/namespace` asked for, or None (the cluster's own)."""
    if args.tenant is None and args.namespace is None:
        return None
    return f"{args.tenant or 'public'}/{args.namespace or 'default'}"


def _run(args: argparse.Namespace) -> int:
    # Imported here: `querylib` must not depend on the server package, only this command does.
    from coordinator import CoordinatorConfig, run_coordinator
    from querylib._tcp import raise_fd_limit
    from querylib.cluster import cluster_file, tq_home
    from querylib.rpc import default_secret_path, load_or_create_secret

    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    raise_fd_limit()
    secret_file = args.secret_file or str(default_secret_path())
    secret = load_or_create_secret(secret_file)
    data = args.data or str(tq_home() / "coordinator")
    config = CoordinatorConfig(recovery_lease_ms=int(args.recovery_lease * 1000),
                               checkpoint_updates=max(1, args.checkpoint_updates),
                               namespace=namespace_of(args),
                               active_lease_ms=int(args.active_lease * 1000))
    if args.standby and not args.etcd:
        print("tq coordinator: --standby needs --etcd", file=sys.stderr)
        return 2

    consoles: list[Any] = []

    async def attach(coordinator: Any) -> Any:
        from coordinator import coordinator_metrics
        from querylib.server import ProcessMetrics

        metrics = ProcessMetrics(asyncio.get_running_loop())
        coordinator_metrics(coordinator, metrics)
        console = start_console(args, coordinator, secret, metrics)
        if console is not None:
            consoles.append(console)

        async def close() -> None:
            if console is not None:
                await asyncio.to_thread(console.stop)
            metrics.close()

        return close

    def amend(info: Any) -> Any:
        return dataclasses.replace(info, console=consoles[0].url if consoles else "")

    def ready(coordinator: object) -> None:
        state = coordinator.state  # type: ignore[attr-defined]
        print(f"tq coordinator listening on {coordinator.endpoint} (catalog broker "  # type: ignore[attr-defined]
              f"{state.catalog_broker}, catalog version {state.catalog.version}, data {data}, "
              f"started in {coordinator.recovery_seconds:.2f}s); clients find it through "  # type: ignore[attr-defined]
              f"{cluster_file()}", file=sys.stderr, flush=True)
        for console in consoles:
            name, where, notes = console_line(console)
            print(f"tq coordinator: {name} {where}" + (f" ({'; '.join(notes)})" if notes else ""),
                  file=sys.stderr, flush=True)

    return run_coordinator(data, args.listen, secret, secret_file,
                           broker_listen=args.broker_listen, config=config, on_ready=ready,
                           attach=attach, amend=amend, kafka=_kafka(args),
                           advertise=args.advertise, etcd=args.etcd,
                           cluster=args.cluster_name)


def _kafka(args: argparse.Namespace) -> Any:
    """The group coordinator's Kafka listener; on a wildcard it advertises --advertise."""
    kafka: Any = kafka_config(args)
    if kafka is not None and args.advertise and not kafka.advertised_host \
            and kafka.host in ("0.0.0.0", "::", ""):
        kafka = dataclasses.replace(kafka, advertised_host=args.advertise)
    return kafka

