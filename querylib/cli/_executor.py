"""`tq executor`: run a host agent in the foreground (DESIGN §6, §9).

A thin adapter over `executor.ExecutorAgent`, imported only when the command runs (the rest of
`querylib` never depends on the agent). SIGINT/SIGTERM stop it: its processes are killed and
their exits reported first. A coordinator not up yet is waited for (the agent says so on
stderr); one refusing our secret ends it with exit code 2. Losing the coordinator does not stop
it: the agent kills its processes and rejoins by itself (DESIGN §6 "Executor loss and
rejoin").

`tq up` runs its executor agent through this command, in a child process of its own (DESIGN §1,
§9 "Starting"), with options it does not show: `--parent-pid` (the kernel kills this process
when that parent dies, PR_SET_PDEATHSIG; already gone: exit at once), `--ready-fd` (once
registered, one JSON line there says what opened, and tq up prints it; this command prints
nothing of its own), `--endpoint-fallback` and `--endpoints-optional` (tq up's rules for
taken ports).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from typing import Any

from querylib._argtypes import integer, seconds, seconds_or_zero
from querylib.cli._broker import (
    add_connector_options,
    add_kafka_options,
    connector_config,
    kafka_config,
)
from querylib.cli._catalog import add_coordinator_key_option
from querylib.cli._console import add_metrics_options, start_metrics


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "executor", help="run an executor agent (spawns query processes, hosts a broker)",
        description="Run this host's executor agent in the foreground: it runs a broker for "
        "the host's topic partitions, registers with the coordinator, and starts, supervises "
        "and kills query processes as the coordinator asks.")
    parser.add_argument("--coordinator", metavar="ADDR", help="the coordinator's endpoint "
                        "(default: $TQ_COORDINATOR, else $TQ_HOME/cluster.json)")
    parser.add_argument("--credentials", "--secret-file", dest="secret_file", metavar="FILE",
                        help="who the executor is: an executor credential (`tq user add NAME "
                        "--role executor` on the coordinator's host), or the cluster secret "
                        "(default: $TQ_CREDENTIALS, else the secret file cluster.json names, "
                        "else $TQ_HOME/secret)")
    add_coordinator_key_option(parser)
    parser.add_argument("--join", metavar="TOKEN", help="join the cluster with a one-time "
                        "token (`tq token create` on the coordinator's host): the executor's "
                        "credential and the coordinator's address are kept in --data, so later "
                        "starts need no token (nor --coordinator or --credentials); default "
                        "$TQ_JOIN_TOKEN")
    parser.add_argument("--data", help="data directory (default $TQ_HOME/executor)")
    parser.add_argument("--slots", type=integer(1), help="process slots: query processes run at "
                        "once (default: 4 per core, at least 8)")
    parser.add_argument("--brokers", type=integer(1), metavar="N", help="this host's brokers, one "
                        "process each (broker 0 in this one, the others its children), its "
                        "partitions spread over them (default: one per core)")
    parser.add_argument("--host", help="host name to register (default: this host's name)")
    parser.add_argument("--broker-id", type=integer(1), metavar="N",
                        help="register this host's broker under id N, waiting for its old "
                        "registration to expire (default: the id in the data dir, else the "
                        "one this host and credential last had if it is down, else a new one)")
    parser.add_argument("--broker-listen", metavar="ADDR",
                        help="endpoint of this host's broker (default: a free port on "
                        "127.0.0.1; on every interface, tcp://0.0.0.0:0, for a host that "
                        "joined with a token)")
    parser.add_argument("--advertise", metavar="HOST",
                        help="the address other hosts reach this host at, registered for its "
                        "brokers (and its Kafka listener) when they listen on 0.0.0.0 "
                        "(default: this host's address towards the coordinator)")
    parser.add_argument("--grace", type=seconds_or_zero, default=5.0, metavar="SECONDS",
                        help="after SIGTERM, how long a killed process has before SIGKILL")
    parser.add_argument("--lease", type=seconds, default=10.0, metavar="SECONDS",
                        help="session lease: unheard by the coordinator this long, the agent "
                        "kills its processes and rejoins with a new session (default 10)")
    add_connector_options(parser, default_port=None)
    add_kafka_options(parser, default_port=None)
    add_metrics_options(parser)
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    # tq up's child (querylib/cli/_up_executor.py): not for people.
    parser.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--endpoint-fallback", default="", help=argparse.SUPPRESS)
    parser.add_argument("--endpoints-optional", action="store_true", help=argparse.SUPPRESS)
    # The agent's broker shards (executor/_shard.py): `tq executor --shard K`, its children.
    parser.add_argument("--shard", type=int, help=argparse.SUPPRESS)
    parser.set_defaults(func=_run)


def _die_with_parent(parent: int) -> None:
    """Be killed with tq up (querylib._parent; its Ctrl-C reaches tq up's whole process group:
    tq up stops us in its order, by SIGTERM, not the terminal). A parent already gone: exit."""
    from querylib._parent import die_with_parent

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not die_with_parent(parent):
        os._exit(1)  # nobody to serve


def _run(args: argparse.Namespace) -> int:
    if args.parent_pid is not None:
        _die_with_parent(args.parent_pid)
    from querylib._tcp import raise_fd_limit
    from querylib.cluster import discover, tq_home

    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    raise_fd_limit()
    data = args.data or str(tq_home() / "executor")
    joined = _joined(args, data)
    if joined is not None:
        address, secret, secret_file = joined.coordinators[0], joined.credential, \
            joined.credential_file
        coordinator_key = (args.coordinator_key or os.environ.get("TQ_COORDINATOR_KEY")
                           or joined.credential.coordinator_key)
        if coordinator_key:
            from querylib.rpc import remember_server_key

            for where in joined.coordinators:
                remember_server_key(where, coordinator_key)
    else:
        found = discover(args.coordinator, secret_file=args.secret_file,
                         coordinator_key=args.coordinator_key)
        address, secret, secret_file = found.address, found.secret, found.secret_file
        coordinator_key = found.coordinator_key
    if coordinator_key:  # its shards and query processes reach the coordinator so too
        os.environ["TQ_COORDINATOR_KEY"] = coordinator_key
    if args.broker_listen is None:  # a joined host serves other hosts
        args.broker_listen = "tcp://0.0.0.0:0" if joined is not None else "tcp://127.0.0.1:0"
    args.advertise = _advertise(args, address, joined)
    return asyncio.run(_serve(args, address, secret, secret_file, data))


def _joined(args: argparse.Namespace, data: str) -> Any:
    """The credential and coordinators of a host that joined with a token: redeemed now
    (`--join`), or kept in `data` by an earlier join; None for a host that did not join."""
    import socket

    from executor._join import join_host, joined_host

    if args.shard is not None or args.coordinator is not None or args.secret_file is not None:
        if args.join:  # $TQ_JOIN_TOKEN is for hosts that join, not for these
            from catalog import UserError

            raise UserError("--join takes no --coordinator or --credentials: the token says "
                            "where the coordinator is and gets the credential")
        return None
    token = args.join or os.environ.get("TQ_JOIN_TOKEN", "").strip()
    joined = joined_host(data)
    if joined is not None or not token:
        if joined is not None and token:
            print(f"tq executor: joined already as {joined.credential.principal} "
                  f"({joined.credential_file}); the token is not used", file=sys.stderr)
        return joined
    joined = asyncio.run(join_host(token, data, args.host or socket.gethostname()))
    print(f"tq executor: joined as {joined.credential.principal} (credential in "
          f"{joined.credential_file}; later starts need no token)", file=sys.stderr, flush=True)
    return joined


def _advertise(args: argparse.Namespace, coordinator: str, joined: Any) -> str | None:
    """The host this executor's brokers (and Kafka listener) register when they listen on a
    wildcard: --advertise, else the address this host reaches the coordinator from
    (DESIGN §6 "Advertised addresses"); None when nothing listens on a wildcard."""
    from querylib.cluster import advertised_host, is_wildcard

    broker_host = args.broker_listen.removeprefix("tcp://").rpartition(":")[0]
    wildcard = is_wildcard(broker_host) or (
        kafka_config(args) is not None and is_wildcard(args.kafka_host)
        and not args.advertised_host)
    if args.advertise or not wildcard:
        return args.advertise or None
    local = getattr(joined, "local_address", None)
    return advertised_host("0.0.0.0", advertise=local, toward=coordinator)


def _kafka(args: argparse.Namespace) -> Any:
    """The Kafka listener's config; on a wildcard it advertises --advertise."""
    import dataclasses

    from querylib.cluster import is_wildcard

    kafka: Any = kafka_config(args)
    if kafka is not None and args.advertise and not kafka.advertised_host \
            and is_wildcard(kafka.host):
        kafka = dataclasses.replace(kafka, advertised_host=args.advertise)
    return kafka


async def _serve(args: argparse.Namespace, address: str, secret: Any, secret_file: str,
                 data: str) -> int:
    from executor import ExecutorAgent

    if args.shard is not None:
        return await _serve_shard(args, address, secret, data)
    brokers = (os.cpu_count() or 1) if args.brokers is None else args.brokers
    from catalog import MAX_BROKER_SLOT, UserError

    if not 1 <= brokers <= MAX_BROKER_SLOT + 1:
        raise UserError(f"--brokers {brokers}: an executor runs 1 to {MAX_BROKER_SLOT + 1} "
                        "brokers")

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # tq up's child stops when tq up says (SIGTERM), not on the terminal's Ctrl-C.
    for sig in (signal.SIGINT, signal.SIGTERM) if args.parent_pid is None else (signal.SIGTERM,):
        loop.add_signal_handler(sig, stop.set)
    agent = ExecutorAgent(address, secret, secret_file, data, slots=args.slots,
                          host=args.host, broker_listen=args.broker_listen,
                          grace=args.grace, lease=args.lease,
                          connector=connector_config(args),
                          kafka=_kafka(args), advertise=args.advertise,
                          endpoints_required=not args.endpoints_optional,
                          endpoint_fallback=[n for n in args.endpoint_fallback.split(",") if n],
                          brokers=brokers, shard_args=_shard_args(args),
                          broker_id=args.broker_id)
    # start() waits for a coordinator that is not up yet: a signal must still stop it.
    starting = loop.create_task(agent.start())
    stopping = loop.create_task(stop.wait())
    await asyncio.wait((starting, stopping), return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        starting.cancel()  # start() closes what it opened
        await asyncio.gather(starting, return_exceptions=True)
        return 0
    stopping.cancel()
    starting.result()  # a refused secret or a broken start: the CLI says it and exits
    from executor import executor_metrics
    from querylib.server import ProcessMetrics

    metrics = ProcessMetrics(loop)
    executor_metrics(agent, metrics)
    stop_metrics = None
    try:
        served = start_metrics(args, metrics, f"tq executor {agent.executor_id}",
                               quiet=args.ready_fd is not None)
        stop_metrics = served and served[1]
        if args.ready_fd is not None:  # tq up's child: it says what opened, tq up prints it
            _report_ready(args.ready_fd, agent, served[0] if served else "")
            await stop.wait()
            return 0
        extra = "".join(f", {name} {where}" for name, where in (
            ("connector", agent.connector_address), ("kafka", agent.kafka_address)) if where)
        print(f"tq executor {agent.executor_id} on {agent.host}: broker {agent.broker_address}"
              f"{extra}, {agent.slots.total} slots, coordinator {address}", file=sys.stderr,
              flush=True)
        await stop.wait()
    finally:
        agent.closing()  # before anything that takes time: shards may be stopping already
        if stop_metrics is not None:
            await asyncio.to_thread(stop_metrics)
        metrics.close()
        await agent.close()
    return 0


def _shard_args(args: argparse.Namespace) -> list[str]:
    """The options of this executor's shards: its Kafka options, on any free port (remembered
    per shard; none without a Kafka listener), and, when it serves metrics, metrics on any
    free loopback port, which it merges into its own. Connector endpoints stay with broker 0."""
    from querylib.cli._up_executor import options_argv

    metrics = ["--metrics-port", "0"] if args.metrics_port >= 0 else []
    if kafka_config(args) is None:
        return metrics
    options = argparse.ArgumentParser(add_help=False)
    add_kafka_options(options, default_port=None)
    return [*options_argv(argparse.Namespace(**{**vars(args), "kafka_port": 0}), options),
            *metrics]


async def _serve_shard(args: argparse.Namespace, address: str, secret: Any, data: str) -> int:
    """One broker shard of an executor (executor/_shard.py), until SIGTERM."""
    import socket

    from executor._shard import serve_shard

    stop = asyncio.Event()
    # The agent stops its shards in its order, by SIGTERM: a terminal's Ctrl-C reaches the
    # whole process group, and the agent handles it first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await serve_shard(args.shard, address, secret, data, host=args.host or socket.gethostname(),
                      listen=args.broker_listen, lease=args.lease, kafka=_kafka(args),
                      ready_fd=args.ready_fd, stop=stop, metrics=args.metrics_port >= 0,
                      advertise=args.advertise)
    return 0


def _report_ready(fd: int, agent: Any, metrics_url: str) -> None:
    """One JSON line on `fd` (then closed): what tq up prints and writes to cluster.json."""
    endpoints = agent.endpoints
    ready = {"pid": os.getpid(), "executor_id": agent.executor_id, "host": agent.host,
             "broker": agent.broker_address, "broker_id": agent.broker_id,
             "slots": agent.slots.total, "connector": agent.connector_address or "",
             "kafka": agent.kafka_address or "", "metrics": metrics_url,
             "moved": dict(endpoints.moved), "skipped": list(endpoints.skipped),
             "shards": list(agent.shard_ids)}
    with os.fdopen(fd, "w") as out:
        out.write(json.dumps(ready) + "\n")
