"""`python -m querylib.connector`: a standalone broker with its connector endpoint in the
foreground (development and tests; `tq broker --connector-port` once the broker CLI has it).

    python -m querylib.connector --data DIR [--listen tcp://127.0.0.1:7500]
        [--connector-port 7600] [--connector-host 127.0.0.1] [--connector-cookie C]
        [--secret-file F] [--flush never|interval|always] [--credits N]
        [--checkpoint-interval S]

Prints one line on stderr once both listen; SIGINT or SIGTERM stop it cleanly.
"""

from __future__ import annotations

import argparse
import sys

from querylib._argtypes import integer, port, seconds
from querylib.log import LogConfig
from querylib.server._connector_main import run_connector_broker

from ._endpoint import EndpointConfig


def main(argv: list[str] | None = None) -> int:
    from querylib.rpc import default_secret_path, load_or_create_secret

    parser = argparse.ArgumentParser(prog="python -m querylib.connector")
    parser.add_argument("--data", required=True)
    parser.add_argument("--listen", default="tcp://127.0.0.1:7500")
    parser.add_argument("--connector-host", default="127.0.0.1")
    parser.add_argument("--connector-port", type=port, default=7600)
    parser.add_argument("--connector-cookie")
    parser.add_argument("--secret-file")
    parser.add_argument("--flush", choices=["never", "interval", "always"], default="never")
    parser.add_argument("--credits", type=integer(1), default=1024)
    parser.add_argument("--checkpoint-interval", type=seconds, default=1.0)
    args = parser.parse_args(argv)
    secret = load_or_create_secret(args.secret_file or default_secret_path())
    config = EndpointConfig(host=args.connector_host, port=args.connector_port,
                            cookie=args.connector_cookie, initial_credits=args.credits,
                            checkpoint_interval=args.checkpoint_interval)

    def ready(address: str, bound: tuple[str, int]) -> None:
        print(f"tq broker listening on {address}, connectors on {bound[0]}:{bound[1]}",
              file=sys.stderr, flush=True)

    return run_connector_broker(args.data, args.listen, secret, config,
                                log_config=LogConfig(flush=args.flush), on_ready=ready)


if __name__ == "__main__":
    sys.exit(main())
