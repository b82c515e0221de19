"""The console options of `tq up` and `tq coordinator`, and starting it (DESIGN §13
"Console"): `--console-port` (default $TQ_CONSOLE_PORT, else 7480, replaced by a free port
when taken; -1: none), `--console-host` (default 127.0.0.1; another address makes every page
ask for a login, and needs `--console-tls-cert/--console-tls-key` or `--insecure`: logins and
their cookies would cross the network in clear).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from catalog.errors import UserError
from querylib._argtypes import port_or_none

# querylib.server.console.DEFAULT_CONSOLE_PORT, spelled out so `tq --help` does not import it.
_CONSOLE_PORT = 7480


def add_console_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--console-port", type=port_or_none, default=None, metavar="PORT",
                        help=f"the web console's port (default $TQ_CONSOLE_PORT, else "
                        f"{_CONSOLE_PORT} or a free one when it is taken; -1: no console)")
    parser.add_argument("--console-host", default="127.0.0.1", metavar="HOST",
                        help="the address the console listens on (default 127.0.0.1; on any "
                        "other address every page asks for a login)")
    from querylib.cli._broker import add_insecure, add_tls_options

    add_tls_options(parser, "--console-tls", "the web console (HTTPS)")
    add_insecure(parser)


def start_console(args: argparse.Namespace, coordinator: Any, secret: bytes,
                  metrics: Any = None) -> Any:
    """The running console of `coordinator` (a coordinator.Coordinator of this process, on
    the running loop), or None when its port is -1. `metrics` (a
    querylib.server.ProcessMetrics) is served at /metrics."""
    asked, where = args.console_port, "--console-port"
    if asked is None and os.environ.get("TQ_CONSOLE_PORT", "").strip():
        where = "TQ_CONSOLE_PORT"
        try:
            asked = int(os.environ["TQ_CONSOLE_PORT"])
        except ValueError:
            raise UserError(f"TQ_CONSOLE_PORT={os.environ['TQ_CONSOLE_PORT']!r} is not a "
                            f"port number (-1: no console)") from None
    if asked is not None and asked < 0:
        return None
    if asked is not None and asked > 65535:
        raise UserError(f"{where} {asked} is not a port (0-65535, or -1 for no console)")
    import asyncio

    from querylib.cli._broker import exposed, server_tls
    from querylib.server.console import Console

    server_tls(args.console_tls_cert, args.console_tls_key, "--console-tls")  # loads, or says
    tls = None if args.console_tls_cert is None else (args.console_tls_cert,
                                                      args.console_tls_key)
    if tls is None:
        exposed(args.console_host, args.insecure, "--console-host",
                "give the console --console-tls-cert and --console-tls-key (logins and their "
                "cookies would cross the network in clear)")

    loop = asyncio.get_running_loop()

    async def groups() -> Any:  # on the console's loop; the groups live on the coordinator's
        return await asyncio.wrap_future(
            asyncio.run_coroutine_threadsafe(coordinator.consumer_groups(), loop))

    return Console(coordinator.endpoint, secret, host=args.console_host,
                   port=_CONSOLE_PORT if asked is None else asked,
                   fallback=asked is None, metrics=metrics, groups=groups, tls=tls).start()


def add_metrics_options(parser: argparse.ArgumentParser) -> None:
    """`--metrics-port` / `--metrics-host`: where a process without a console serves /metrics."""
    parser.add_argument("--metrics-port", type=port_or_none, default=-1, metavar="PORT",
                        help="serve Prometheus metrics at http://HOST:PORT/metrics (default "
                        "-1: none; 0: any free port)")
    parser.add_argument("--metrics-host", default="127.0.0.1", metavar="HOST",
                        help="the address metrics are served on (default 127.0.0.1)")


def start_metrics(args: argparse.Namespace, metrics: Any, name: str, *,
                  quiet: bool = False) -> tuple[str, Any] | None:
    """Serve `metrics` as the options ask: (its URL, the function that stops it), None when
    not served. `quiet`: do not print where."""
    if args.metrics_port < 0:
        return None
    from querylib.server import serve_metrics

    port, stop = serve_metrics(metrics, args.metrics_host, args.metrics_port, fallback=False)
    url = f"http://{args.metrics_host}:{port}/metrics"
    if not quiet:
        print(f"{name}: metrics at {url}", file=sys.stderr, flush=True)
    return url, stop


def console_line(console: Any) -> tuple[str, str, list[str]]:
    """The console's row among the endpoints a command prints when ready."""
    notes = [f"port {console.asked} is taken"] if console.moved else []
    if not console.access.loopback:
        notes.append("every page asks for a login")
    return "console", console.login_url, notes
