"""Principals: who a request acts for, and what each kind of principal may do (DESIGN §12).

A principal is a string, parsed and checked here and nowhere else:

    admin            the holder of the cluster secret file: every operation, `force` included
    user:NAME        a person or program an admin gave a credential (`tq user add NAME`); an
                     admin may give a user the admin role
    executor:NAME    a host agent with an executor credential (`tq user add NAME --role
                     executor`): registers itself and its broker, reports its processes' exits
    query:ID         a process of query ID; its credential is minted by the coordinator when it
                     spawns the process and is valid while the query has not ended
    join:ID          the holder of join token ID (`tq token create`): it may only redeem the
                     token for an executor credential (`tq executor --join`), nothing else
    system           tq's own writers inside a server process (catalog writer, group store,
                     connector checkpoints, log forwarding); never authenticated on the wire
    anonymous        an unauthenticated Kafka client or connector, where a listener allows one

NAME is 1 to 64 characters of letters, digits, `.`, `_` and `-`, starting with a letter or a
digit; ID is a query id (a token id for `join:`). Names are compared exactly.

Must not: know keys or credentials (querylib.rpc derives and checks those), read clocks, do I/O.
"""

from __future__ import annotations

import enum
import functools
import re

from catalog.errors import InvalidCommandError

__all__ = [
    "ADMIN",
    "ANONYMOUS",
    "SYSTEM_PRINCIPAL",
    "PrincipalKind",
    "Role",
    "check_principal",
    "join_principal",
    "principal_kind",
    "query_principal",
    "token_of_principal",
    "query_of_principal",
]

ADMIN = "admin"
SYSTEM_PRINCIPAL = "system"
ANONYMOUS = "anonymous"
MAX_PRINCIPAL = 80

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_QUERY = re.compile(r"[1-9][0-9]{0,17}")


class PrincipalKind(enum.StrEnum):
    ADMIN = "admin"
    USER = "user"
    EXECUTOR = "executor"
    QUERY = "query"
    JOIN = "join"
    SYSTEM = "system"
    ANONYMOUS = "anonymous"


class Role(enum.StrEnum):
    """What a named principal in the catalog's `users` collection may do."""

    USER = "user"          # its own queries and topics; ingest topics; reading
    ADMIN = "admin"        # everything, `force` included, and managing users
    EXECUTOR = "executor"  # a host agent: register, report exits and drops

    @classmethod
    def parse(cls, text: str) -> Role:
        try:
            return cls(text)
        except ValueError:
            raise InvalidCommandError(f"unknown role {text!r}; one of "
                                      f"{', '.join(r.value for r in cls)}") from None


@functools.lru_cache(maxsize=4096)  # asked for every message a server receives
def principal_kind(principal: str) -> PrincipalKind:
    """The kind of a well-formed principal; InvalidCommandError for anything else."""
    if principal == ADMIN:
        return PrincipalKind.ADMIN
    if principal == SYSTEM_PRINCIPAL:
        return PrincipalKind.SYSTEM
    if principal == ANONYMOUS:
        return PrincipalKind.ANONYMOUS
    kind, sep, rest = principal.partition(":")
    if sep and len(principal) <= MAX_PRINCIPAL:
        if kind in ("user", "executor") and _NAME.fullmatch(rest):
            return PrincipalKind(kind)
        if kind == "query" and _QUERY.fullmatch(rest):
            return PrincipalKind.QUERY
        if kind == "join" and _QUERY.fullmatch(rest):
            return PrincipalKind.JOIN
    shown = principal[:MAX_PRINCIPAL]
    raise InvalidCommandError(
        f"{shown!r} is not a principal: admin, user:NAME, executor:NAME, query:ID or join:ID, "
        "where NAME is 1-64 letters, digits, '.', '_' or '-'")


def check_principal(principal: str) -> str:
    """`principal` itself if well formed (InvalidCommandError otherwise)."""
    principal_kind(principal)
    return principal


def query_principal(query_id: int) -> str:
    """The principal of query `query_id`'s processes."""
    return f"query:{query_id}"


def query_of_principal(principal: str) -> int | None:
    """The query id of a `query:ID` principal, else None."""
    if principal.startswith("query:") and _QUERY.fullmatch(principal[6:]):
        return int(principal[6:])
    return None


def join_principal(token_id: int) -> str:
    """The principal of join token `token_id`'s holder."""
    return f"join:{token_id}"


def token_of_principal(principal: str) -> int | None:
    """The token id of a `join:ID` principal, else None."""
    if principal.startswith("join:") and _QUERY.fullmatch(principal[5:]):
        return int(principal[5:])
    return None
