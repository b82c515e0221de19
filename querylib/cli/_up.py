"""`tq up`: the embedded default for one machine (DESIGN §1, §9): the coordinator (with the
broker of the catalog topics) and one executor agent (with this host's broker) in one process.

A thin adapter over `coordinator.run_coordinator` and `executor.ExecutorAgent`, imported only
when the command runs. It writes `$TQ_HOME/cluster.json` once the executor is registered, so a
client that finds the file can submit at once.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "up", help="run a coordinator and one executor in one process (one machine)",
        description="Run the coordinator and one executor agent in the foreground, in one "
        "process: everything tq needs on one machine. Writes $TQ_HOME/cluster.json so that "
        "other tq commands find it.")
    parser.add_argument("--data", help="data directory (default $TQ_HOME)")
    parser.add_argument("--listen", default="tcp://127.0.0.1:7400",
                        help="coordinator endpoint (default tcp://127.0.0.1:7400)")
    parser.add_argument("--secret-file", help="cluster secret (default $TQ_HOME/secret, "
                        "created if missing)")
    parser.add_argument("--slots", type=int, help="the executor's process slots "
                        "(default: CPU count)")
    parser.add_argument("--grace", type=float, default=5.0, metavar="SECONDS",
                        help="after SIGTERM, how long a killed process has before SIGKILL")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from coordinator import run_coordinator
    from executor import ExecutorAgent
    from querylib.cluster import cluster_file, tq_home
    from querylib.rpc import default_secret_path, load_or_create_secret

    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    secret_file = args.secret_file or str(default_secret_path())
    secret = load_or_create_secret(secret_file)
    data = args.data or str(tq_home())

    async def attach(coordinator: Any) -> Any:
        agent = await ExecutorAgent(coordinator.endpoint, secret, secret_file,
                                    os.path.join(data, "executor"), slots=args.slots,
                                    grace=args.grace).start()
        print(f"tq up: coordinator {coordinator.endpoint}, executor {agent.executor_id} "
              f"({agent.slots.total} slots, broker {agent.broker_address}), data {data}; "
              f"clients find it through {cluster_file()}", file=sys.stderr, flush=True)
        return agent.close

    return run_coordinator(os.path.join(data, "coordinator"), args.listen, secret, secret_file,
                           attach=attach)
