"""The console options of `tq up` and `tq coordinator`, and starting it (DESIGN §13
"Console"): `--console-port` (default $TQ_CONSOLE_PORT, else 7480, replaced by a free port
when taken; -1: none) and `--console-host` (default 127.0.0.1; another address makes every
page ask for a login).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from catalog.errors import UserError

# querylib.server.console.DEFAULT_CONSOLE_PORT, spelled out so `tq --help` does not import it.
_CONSOLE_PORT = 7480


def add_console_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--console-port", type=int, default=None, metavar="PORT",
                        help=f"the web console's port (default $TQ_CONSOLE_PORT, else "
                        f"{_CONSOLE_PORT} or a free one when it is taken; -1: no console)")
    parser.add_argument("--console-host", default="127.0.0.1", metavar="HOST",
                        help="the address the console listens on (default 127.0.0.1; on any "
                        "other address every page asks for a login)")


def start_console(args: argparse.Namespace, coordinator: str, secret: bytes) -> Any:
    """The running console, or None when its port is -1."""
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
    from querylib.server.console import Console

    return Console(coordinator, secret, host=args.console_host,
                   port=_CONSOLE_PORT if asked is None else asked,
                   fallback=asked is None).start()


def console_line(console: Any) -> tuple[str, str, list[str]]:
    """The console's row among the endpoints a command prints when ready."""
    notes = [f"port {console.asked} is taken"] if console.moved else []
    if not console.access.loopback:
        notes.append("every page asks for a login")
    return "console", console.login_url, notes
