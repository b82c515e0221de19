"""`tq token create|list|revoke`: one-time join tokens for new executor hosts (DESIGN §12
"Joining a host").

    tq token create [--ttl 1h] [--name NAME]   prints the token: tq executor --join TOKEN
    tq token list [--json]                     every token: id, name, expiry, used by whom
    tq token revoke ID                         it joins nobody any more

Only admins make and revoke tokens (the holder of the cluster secret is one). The token is
printed once: the catalog keeps no secret to show it again. A thin adapter over
`querylib.cluster.Cluster`.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from typing import Any

from querylib.cli._catalog import add_cluster_options, connect

_TTL = re.compile(r"(\d+)\s*([smhd]?)")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def register(sub: argparse._SubParsersAction) -> None:
    token = sub.add_parser("token", help="one-time join tokens for new executor hosts "
                           "(admins)",
                           description="Make, list and revoke join tokens: `tq executor "
                           "--join TOKEN` on a new host joins the cluster with one, once, "
                           "before it expires, and keeps the executor credential it gets.")
    commands = token.add_subparsers(dest="token_command", metavar="ACTION")
    commands.required = True

    create = commands.add_parser("create", help="make a join token and print it")
    create.add_argument("--ttl", default="1h", metavar="DURATION",
                        help="how long it may be used: 90s, 30m, 1h (default), 2d; at most 7d")
    create.add_argument("--name", default="", metavar="NAME",
                        help="the executor name the joining host gets (default: its host "
                        "name)")
    add_cluster_options(create)
    create.set_defaults(func=_create)

    listing = commands.add_parser("list", help="every join token and what became of it")
    listing.add_argument("--json", action="store_true", help="one JSON object per token")
    add_cluster_options(listing)
    listing.set_defaults(func=_list)

    revoke = commands.add_parser("revoke", help="revoke a join token: it joins nobody")
    revoke.add_argument("token_id", type=int, metavar="ID", help="the token's id (tq token "
                        "list)")
    add_cluster_options(revoke)
    revoke.set_defaults(func=_revoke)


def parse_ttl(text: str) -> int:
    """A duration (90s, 30m, 1h, 2d; a bare number is seconds) in milliseconds."""
    found = _TTL.fullmatch(text.strip())
    if found is None:
        from catalog.errors import UserError

        raise UserError(f"--ttl {text!r}: a duration such as 90s, 30m, 1h or 2d")
    return int(found.group(1)) * _UNIT_S[found.group(2)] * 1000


def _create(args: argparse.Namespace) -> int:
    from querylib.cluster import parse_token
    from querylib.rpc import leaves_host

    with connect(args, session=True) as cluster:
        record, token = cluster.create_token(parse_ttl(args.ttl), args.name)
    parsed = parse_token(token)
    print(token)
    expires = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(record.expires_at_ms / 1000))
    print(f"join token {record.token_id} (once, until {expires}): on the new host run\n"
          f"  tq executor --join {token} --data DIR", file=sys.stderr)
    if not any(leaves_host(address) for address in parsed.coordinators):
        print(f"note: it names {', '.join(parsed.coordinators)}, which only this host "
              "reaches; start the coordinator with --listen tcp://0.0.0.0:PORT --advertise "
              "HOST for other hosts", file=sys.stderr)
    return 0


def _revoke(args: argparse.Namespace) -> int:
    with connect(args, session=True) as cluster:
        cluster.revoke_token(args.token_id)
    print(f"join token {args.token_id} revoked: it joins nobody", file=sys.stderr)
    return 0


def _state(token: Any, now_ms: int) -> str:
    if token.used:
        return f"used by {token.used_by}"
    return "expired" if now_ms >= token.expires_at_ms else "valid"


def _list(args: argparse.Namespace) -> int:
    with connect(args) as cluster:
        records = cluster.snapshot("tokens", timeout=args.timeout)["tokens"].records
    tokens = sorted((token for token, _ in records), key=lambda t: t.token_id)
    now_ms = int(time.time() * 1000)
    if args.json:
        for token in tokens:
            print(json.dumps({"token_id": token.token_id, "name": token.name,
                              "created_by": token.created_by,
                              "created_at_ms": token.created_at_ms,
                              "expires_at_ms": token.expires_at_ms,
                              "used_at_ms": token.used_at_ms, "used_by": token.used_by,
                              "state": _state(token, now_ms).partition(" ")[0]}))
        return 0
    if not tokens:
        print("no join tokens (tq token create makes one)", file=sys.stderr)
        return 0
    print(f"{'ID':>4}  {'NAME':<16}  {'EXPIRES':<19}  STATE")
    for token in tokens:
        expires = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(token.expires_at_ms / 1000))
        print(f"{token.token_id:>4}  {token.name or '(host name)':<16}  {expires:<19}  "
              f"{_state(token, now_ms)}")
    return 0
