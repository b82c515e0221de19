"""`tq up`: the embedded default for one machine (DESIGN §1, §9): the coordinator (with the
broker of the catalog topics) and one executor agent (with this host's broker) in one process.

A thin adapter over `coordinator.run_coordinator` and `executor.ExecutorAgent`, imported only
when the command runs. It writes `$TQ_HOME/cluster.json` once the executor is registered, so a
client that finds the file can submit at once; the file also names the executor broker's
connector endpoint (default port 7600) and Kafka listener (default 9092) when it could open
them. A default port that is taken (7400 and 7401 for the coordinator and its broker, 7600,
9092) is replaced by a free one, said on the endpoint's line; a port the user named that is
taken is refused (the coordinator's) or skipped, naming the port and the flag (the connector's
and Kafka's). A second `tq up` under the same TQ_HOME is refused, naming the running one
(run_coordinator). It prints each endpoint once, in one block, when the cluster is ready.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import sys
from typing import Any

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
        "up", help="run a coordinator and one executor in one process (one machine)",
        description="Run the coordinator and one executor agent in the foreground, in one "
        "process: everything tq needs on one machine. Writes $TQ_HOME/cluster.json so that "
        "other tq commands find it.")
    parser.add_argument("--data", help="data directory (default $TQ_HOME)")
    parser.add_argument("--listen", help=f"coordinator endpoint; its catalog broker takes the "
                        f"next port (default {_LISTEN}, or free ports when those are taken)")
    parser.add_argument("--secret-file", help="cluster secret (default $TQ_HOME/secret, "
                        "created if missing)")
    parser.add_argument("--slots", type=int, help="the executor's process slots "
                        "(a slot runs one query process; default: 4 per core, at least 8)")
    parser.add_argument("--grace", type=float, default=5.0, metavar="SECONDS",
                        help="after SIGTERM, how long a killed process has before SIGKILL")
    add_connector_options(parser, default_port=_CONNECTOR_PORT)
    add_kafka_options(parser, default_port=_KAFKA_PORT)
    parser.add_argument("--coordinator-kafka-port", type=int, default=0, metavar="PORT",
                        help="Kafka listener of the coordinator's broker, the group "
                        "coordinator of every consumer group (FindCoordinator names it); "
                        "0: any free port (default), -1: none")
    add_namespace_options(parser)
    add_console_options(parser)
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    # None: the default port, replaced by a free one when taken (a named port is not).
    parser.set_defaults(func=_run, connector_port=None, kafka_port=None)


def _run(args: argparse.Namespace) -> int:
    from coordinator import CoordinatorConfig, run_coordinator
    from executor import ExecutorAgent
    from querylib._tcp import raise_fd_limit
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
    secret_file = args.secret_file or str(default_secret_path())
    secret = load_or_create_secret(secret_file)
    data = args.data or str(tq_home())
    started: list[Any] = []  # the agent, then the console (or None)

    async def attach(coordinator: Any) -> Any:
        # A named port may be taken (another tq up, a Kafka on 9092): go on without that
        # endpoint, saying so; the rest of tq up is still useful. A default one moves.
        agent = await ExecutorAgent(coordinator.endpoint, secret, secret_file,
                                    os.path.join(data, "executor"), slots=args.slots,
                                    grace=args.grace, connector=connector_config(args),
                                    kafka=kafka_config(args), endpoints_required=False,
                                    endpoint_fallback=fallback).start()
        started.append(agent)
        from coordinator import coordinator_metrics
        from executor import executor_metrics
        from querylib.server import ProcessMetrics

        metrics = ProcessMetrics(asyncio.get_running_loop())
        coordinator_metrics(coordinator, metrics,
                            brokers=lambda: [] if agent.broker is None else [agent.broker])
        executor_metrics(agent, metrics)
        try:
            console = start_console(args, coordinator, secret, metrics)
        except BaseException:
            metrics.close()
            await agent.close()
            raise
        started.append(console)
        assert agent.endpoints is not None  # set by start()
        for message in agent.endpoints.skipped:
            print(f"tq up: {message}", file=sys.stderr, flush=True)
        for line in ready_lines(coordinator, agent, data, str(cluster_file()), console):
            print(line, file=sys.stderr, flush=True)

        async def close() -> None:
            if console is not None:
                await asyncio.to_thread(console.stop)
            metrics.close()
            await agent.close()

        return close

    def amend(info: Any) -> Any:
        agent, console = started
        return dataclasses.replace(info, connector=agent.connector_address or "",
                                   kafka=agent.kafka_address or "",
                                   console=console.url if console is not None else "")

    return run_coordinator(os.path.join(data, "coordinator"), args.listen or _LISTEN, secret,
                           secret_file, attach=attach, amend=amend,
                           config=CoordinatorConfig(namespace=namespace_of(args)),
                           kafka=_group_coordinator(args), fallback=args.listen is None,
                           name="tq up")


def ready_lines(coordinator: Any, agent: Any, data: str, found_through: str,
                console: Any = None) -> list[str]:
    """What tq up prints once ready: each endpoint once, with the port it replaced if a
    default one was taken."""
    def taken(asked: str | int | None) -> list[str]:
        return [] if asked is None else [f"port {str(asked).rpartition(':')[2]} is taken"]

    endpoints = agent.endpoints
    rows = [("coordinator", coordinator.endpoint, taken(coordinator.moved.get("coordinator"))),
            ("catalog broker", coordinator.broker_endpoint,
             taken(coordinator.moved.get("catalog broker"))),
            (f"executor {agent.executor_id}", f"{agent.slots.total} process "
             f"slot{'' if agent.slots.total == 1 else 's'}, broker {agent.broker_address}", [])]
    if coordinator.kafka_address:
        rows.append(("group coordinator", coordinator.kafka_address, []))
    if agent.kafka_address:
        rows.append(("kafka", agent.kafka_address,
                     ["bootstrap.servers", *taken(endpoints.moved.get("kafka"))]))
    if agent.connector_address:
        rows.append(("connector", agent.connector_address,
                     taken(endpoints.moved.get("connector"))))
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
