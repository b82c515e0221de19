"""`tq user add|list|rotate|remove`: the named principals of a cluster and their credentials
(DESIGN §12).

    tq user add alice                  a user; writes ./alice.credential (mode 0600)
    tq user add ci --role admin -o ci.cred
    tq user add host-b --role executor  an executor credential for another host
    tq user rotate alice               a new key; the old one stops working
    tq user remove alice
    tq user list [--json]

A credential file is what the user passes as `--credentials FILE` (or `TQ_CREDENTIALS=FILE`);
its Kafka SASL password is printed by `add` and `rotate`. Only admins manage users; the holder
of the cluster secret is one. A thin adapter over `querylib.cluster.Cluster`.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from querylib.cli._catalog import add_cluster_options, connect


def register(sub: argparse._SubParsersAction) -> None:
    user = sub.add_parser("user", help="add, list, rotate and remove users and executor "
                          "credentials (admins)",
                          description="Manage the cluster's named principals: users (who "
                          "submit queries and own topics) and executors (host agents). "
                          "Each gets a credential file; its holder acts as that principal.")
    commands = user.add_subparsers(dest="user_command", metavar="ACTION")
    commands.required = True

    add = commands.add_parser("add", help="add a user (or an executor) and write its "
                              "credential file")
    add.add_argument("name", help="NAME, user:NAME or executor:NAME")
    add.add_argument("--role", choices=("user", "admin", "executor"), default=None,
                     help="user (default), admin, or executor (a host agent)")
    add.add_argument("-o", "--output", metavar="FILE",
                     help="where to write the credential (default ./NAME.credential)")
    add_cluster_options(add)
    add.set_defaults(func=_add)

    rotate = commands.add_parser("rotate", help="give a user a new key (the old one stops "
                                 "working) and write the new credential file")
    rotate.add_argument("name", help="NAME, user:NAME or executor:NAME")
    rotate.add_argument("-o", "--output", metavar="FILE",
                        help="where to write the credential (default ./NAME.credential)")
    add_cluster_options(rotate)
    rotate.set_defaults(func=_rotate)

    remove = commands.add_parser("remove", help="remove a user: its credential stops working")
    remove.add_argument("name", help="NAME, user:NAME or executor:NAME")
    add_cluster_options(remove)
    remove.set_defaults(func=_remove)

    listing = commands.add_parser("list", help="the cluster's users and executors")
    listing.add_argument("--json", action="store_true", help="one JSON object per user")
    add_cluster_options(listing)
    listing.set_defaults(func=_list)


def principal_of(name: str, role: str | None = None) -> str:
    """`alice` -> user:alice (executor:alice with the executor role); full names as given."""
    if ":" in name or name == "admin":
        return name
    return f"executor:{name}" if role == "executor" else f"user:{name}"


def _credential_file(principal: str, output: str | None) -> Any:
    """The file a new key of `principal` goes to, made before the coordinator mints the key:
    refused then, the cluster is unchanged (querylib.rpc.CredentialFile)."""
    from catalog import check_principal
    from querylib.rpc import CredentialFile

    check_principal(principal)  # its name makes the default path: no '/' in it
    return CredentialFile(output or f"{principal.partition(':')[2]}.credential")


def _write(cluster: Any, credential: Any, file: Any) -> int:
    from querylib.rpc import kafka_password

    file.write(credential, coordinator=cluster.address,
               coordinator_key=credential.coordinator_key)
    path = file.path
    print(f"{credential.principal}: credential written to {path} (use it with --credentials "
          f"{path} or TQ_CREDENTIALS={path})")
    name = credential.principal.partition(":")[2]
    if credential.principal.startswith("user:"):
        print(f"Kafka SASL (PLAIN or SCRAM-SHA-256/512): username {name}, password "
              f"{kafka_password(credential)}")
    return 0


def _add(args: argparse.Namespace) -> int:
    role = args.role or "user"
    principal = principal_of(args.name, role)
    with _credential_file(principal, args.output) as file, \
            connect(args, session=True) as cluster:
        return _write(cluster, cluster.add_user(principal, role), file)


def _existing(cluster: Any, name: str, timeout: float) -> str:
    """The principal NAME names: as given when it has a kind, else the one user:NAME or
    executor:NAME that exists (UserError when both or neither do)."""
    if ":" in name or name == "admin":
        return name
    records = cluster.snapshot("users", timeout=timeout)["users"].records
    found = [u.principal for u, _ in records
             if u.principal in (f"user:{name}", f"executor:{name}")]
    if len(found) != 1:
        from catalog.errors import UserError

        raise UserError(f"no user or executor named {name!r}" if not found else
                        f"both user:{name} and executor:{name} exist: say which")
    return found[0]


def _rotate(args: argparse.Namespace) -> int:
    with connect(args, session=True) as cluster:
        principal = _existing(cluster, args.name, args.timeout)
        with _credential_file(principal, args.output) as file:
            return _write(cluster, cluster.rotate_user(principal), file)


def _remove(args: argparse.Namespace) -> int:
    with connect(args, session=True) as cluster:
        principal = _existing(cluster, args.name, args.timeout)
        cluster.remove_user(principal)
    print(f"{principal} removed: its credential no longer works")
    return 0


def _list(args: argparse.Namespace) -> int:
    with connect(args) as cluster:
        records = cluster.snapshot("users", timeout=args.timeout)["users"].records
    users = sorted((user for user, _ in records), key=lambda u: u.principal)
    if args.json:
        for user in users:
            print(json.dumps({"principal": user.principal, "role": user.role,
                              "generation": user.generation,
                              "created_at_ms": user.created_at_ms}))
        return 0
    if not users:
        print("no users (the holder of the cluster secret is the admin)", file=sys.stderr)
        return 0
    width = max(len(u.principal) for u in users)
    print(f"{'PRINCIPAL':<{width}}  ROLE      KEY GENERATION")
    for user in users:
        print(f"{user.principal:<{width}}  {user.role:<8}  {user.generation}")
    return 0
