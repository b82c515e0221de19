"""`tq up`: the embedded default for one machine (DESIGN §1, §9): the coordinator (with the
broker of the catalog topics) in this process and one executor agent (with this host's broker)
in a child process of its own, so the data path and control never share a loop or a core.

A thin adapter over `coordinator.run_coordinator` and `tq executor` (started, watched and
stopped by `_up_executor.ExecutorChild`), imported only when the command runs. It writes
`$TQ_HOME/cluster.json` once the executor is registered, so a
client that finds the file can submit at once; the file also names the executor broker's
connector endpoint (default port 7600) and Kafka listener (default 9092) when it could open
them. A default port that is taken (7400 and 7401 for the coordinator and its broker, 7600,
9092) is replaced by a free one, said on the endpoint's line; a port the user named that is
taken is refused (the coordinator's) or skipped, naming the port and the flag (the connector's
and Kafka's). A second `tq up` under the same TQ_HOME is refused, naming the running one
(run_coordinator). It prints each endpoint once, in one block, when the cluster is ready.
Ctrl-C or SIGTERM stops the executor (its queries first) and then the coordinator; a SIGKILL
takes the child with it (PR_SET_PDEATHSIG); a child that dies on its own is said, and tq up
stops with exit code 1.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import sys
from typing import Any

from querylib._argtypes import integer, port_or_none, seconds_or_zero
from querylib.cli._broker import (
    add_connector_options,
    add_kafka_options,
    connector_config,
    kafka_config,
)
from querylib.cli._console import add_console_options, console_line, start_console
from querylib.cli._coordinator import add_namespace_options, namespace_of

# The connector endpoint's usual port (querylib.connector.DEFAULT_CONNECTOR_PORT, which `tq
# ingest` connects to), spelled out so `tq --help` does not import the connector package.
_CONNECTOR_PORT = 7600
_KAFKA_PORT = 9092
_LISTEN = "tcp://127.0.0.1:7400"


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "up", help="run a coordinator and one executor (one machine, one command)",
        description="Run the coordinator and one executor agent in the foreground (the "
        "executor in a child process): everything tq needs on one machine. Writes "
        "$TQ_HOME/cluster.json so that other tq commands find it.")
    parser.add_argument("--data", help="data directory (default $TQ_HOME)")
    parser.add_argument("--listen", help=f"coordinator endpoint; its catalog broker takes the "
                        f"next port (default {_LISTEN}, or free ports when those are taken)")
    parser.add_argument("--advertise", metavar="HOST",
                        help="the address other hosts reach this one at: the executor's "
                        "brokers then listen on every interface and register HOST, and with "
                        "--listen tcp://0.0.0.0:PORT the coordinator and its catalog broker "
                        "too (join tokens name it)")
    parser.add_argument("--secret-file", help="cluster secret (default $TQ_HOME/secret, "
                        "created if missing)")
    parser.add_argument("--slots", type=integer(1), help="the executor's process slots "
                        "(a slot runs one query process; default: 4 per core, at least 8)")
    parser.add_argument("--brokers", type=integer(1), metavar="N",
                        help="the executor's brokers, one process each, its partitions spread "
                        "over them (default: one per core)")
    parser.add_argument("--grace", type=seconds_or_zero, default=5.0, metavar="SECONDS",
                        help="after SIGTERM, how long a killed process has before SIGKILL")
    add_connector_options(parser, default_port=_CONNECTOR_PORT)
    add_kafka_options(parser, default_port=_KAFKA_PORT)
    parser.add_argument("--coordinator-kafka-port", type=port_or_none, default=0, metavar="PORT",
                        help="Kafka listener of the coordinator's broker, the group "
                        "coordinator of every consumer group (FindCoordinator names it); "
                        "0: any free port (default), -1: none")
    add_namespace_options(parser)
    add_console_options(parser)
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    # None: the default port, replaced by a free one when taken (a named port is not).
    parser.set_defaults(func=_run, connector_port=None, kafka_port=None)


def _run(args: argparse.Namespace) -> int:
    from coordinator import Attached, CoordinatorConfig, run_coordinator
    from querylib._tcp import raise_fd_limit
    from querylib.cli._up_executor import ChildMetrics, ExecutorChild, child_args
    from querylib.cluster import cluster_file, tq_home
    from querylib.rpc import default_secret_path, load_or_create_secret

    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    raise_fd_limit()  # before anything opens a descriptor-hungry listener
    fallback = []  # the endpoints on their default ports, which move when those are taken
    for name, option, default in (("connector", "connector_port", _CONNECTOR_PORT),
                                  ("kafka", "kafka_port", _KAFKA_PORT)):
        if getattr(args, option) is None:
            setattr(args, option, default)
            fallback.append(name)
    # The child opens them; a bad option is refused here, before anything starts.
    connector_config(args)
    kafka_config(args)
    secret_file = args.secret_file or str(default_secret_path())
    secret = load_or_create_secret(secret_file)
    data = args.data or str(tq_home())
    started: list[Any] = []  # the executor child, then the console (or None)

    async def attach(coordinator: Any) -> Any:
        # The executor agent and its broker run in a child process (DESIGN §1): a flood of
        # data there never waits behind the coordinator's loop, nor the reverse. A named port
        # that is taken (another tq up, a Kafka on 9092) is skipped, said; a default one moves.
        child = await ExecutorChild(
            child_args(args, coordinator.endpoint, secret_file,
                       os.path.join(data, "executor"), fallback,
                       coordinator_key=coordinator.public_key), args.grace).start()
        started.append(child)
        assert child.ready is not None  # start() returns once it reported
        from coordinator import coordinator_metrics
        from querylib.server import ProcessMetrics

        metrics = ProcessMetrics(asyncio.get_running_loop())
        remote = ChildMetrics(child.ready.metrics)
        metrics.add_remote(remote.families)
        coordinator_metrics(coordinator, metrics, ends=lambda: remote.ends)
        try:
            console = start_console(args, coordinator, secret, metrics)
        except BaseException:
            metrics.close()
            await child.close()
            raise
        started.append(console)
        for message in child.ready.skipped:
            print(f"tq up: {message}", file=sys.stderr, flush=True)
        for line in ready_lines(coordinator, child.ready, data, str(cluster_file()), console):
            print(line, file=sys.stderr, flush=True)

        async def close() -> None:
            if console is not None:
                await asyncio.to_thread(console.stop)
            metrics.close()
            await child.close()  # its queries first, while the coordinator hears their exits

        return Attached(close, child.ended)

    def amend(info: Any) -> Any:
        child, console = started
        return dataclasses.replace(info, connector=child.ready.connector,
                                   kafka=child.ready.kafka,
                                   console=console.url if console is not None else "")

    return run_coordinator(os.path.join(data, "coordinator"), args.listen or _LISTEN, secret,
                           secret_file, attach=attach, amend=amend,
                           config=CoordinatorConfig(namespace=namespace_of(args)),
                           kafka=_group_coordinator(args), fallback=args.listen is None,
                           name="tq up", advertise=args.advertise)


def ready_lines(coordinator: Any, executor: Any, data: str, found_through: str,
                console: Any = None) -> list[str]:
    """What tq up prints once ready: each endpoint once, with the port it replaced if a
    default one was taken. `executor`: what its child reported (an ExecutorReady)."""
    def taken(asked: str | int | None) -> list[str]:
        return [] if asked is None else [f"port {str(asked).rpartition(':')[2]} is taken"]

    rows = [("coordinator", coordinator.endpoint, taken(coordinator.moved.get("coordinator"))),
            ("catalog broker", coordinator.broker_endpoint,
             taken(coordinator.moved.get("catalog broker"))),
            (f"executor {executor.executor_id}", f"{executor.slots} process "
             f"slot{'' if executor.slots == 1 else 's'}, broker {executor.broker} (pid "
             f"{executor.pid})", [f"and brokers {', '.join(map(str, executor.shards))}"]
             if executor.shards else [])]
    if coordinator.kafka_address:
        rows.append(("group coordinator", coordinator.kafka_address, []))
    if executor.kafka:
        rows.append(("kafka", executor.kafka,
                     ["bootstrap.servers", *taken(executor.moved.get("kafka"))]))
    if executor.connector:
        rows.append(("connector", executor.connector, taken(executor.moved.get("connector"))))
    if console is not None:
        rows.append(console_line(console))
    width = max(len(name) for name, _, _ in rows)
    return [f"tq up: ready (pid {os.getpid()}, data {data}); Ctrl-C stops it",
            *(f"  {name.ljust(width)}  {where}" + (f"  ({'; '.join(notes)})" if notes else "")
              for name, where, notes in rows),
            f"  clients find it through {found_through}"]


def _group_coordinator(args: argparse.Namespace) -> object | None:
    """The coordinator broker's Kafka listener: the same options, its own port."""
    return kafka_config(argparse.Namespace(**{**vars(args),
                                              "kafka_port": args.coordinator_kafka_port}))
