"""What a host that joined with a token keeps (DESIGN §6 "Joining a host"): its credential and
where the coordinator is, in its data directory, so later starts need no token.

    <data>/credential        the executor's credential (JSON, mode 0600, `CredentialFile`)
    <data>/coordinator.json  {"coordinators": [...], "namespace": ...}: where to find it

    joined = await join_host(token, data_dir, name)   # redeem the token, write both files
    found = joined_host(data_dir)                     # a later start: None if never joined

Must not: start brokers or register anything (the agent does, with what this returns).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from querylib._state_file import replace_file
from querylib.cluster import ParsedToken, parse_token, redeem
from querylib.rpc import Credential, CredentialFile, SecretFileError, load_credential

__all__ = ["CREDENTIAL_FILE", "COORDINATOR_FILE", "JoinedHost", "join_host", "joined_host"]

CREDENTIAL_FILE = "credential"
COORDINATOR_FILE = "coordinator.json"
_MAX_COORDINATOR_FILE = 65536


@dataclass(frozen=True)
class JoinedHost:
    """A joined host's credential (and its file) and the coordinators' addresses."""

    credential: Credential
    credential_file: str
    coordinators: tuple[str, ...]
    local_address: str | None = None  # this host's address towards the coordinator (a join)


def joined_host(data_dir: str | os.PathLike[str]) -> JoinedHost | None:
    """The credential and coordinators a join left in `data_dir`, or None if it holds none
    (SecretFileError when they are there but damaged or readable by others)."""
    data = Path(data_dir)
    where = data / COORDINATOR_FILE
    if not (data / CREDENTIAL_FILE).exists() and not where.exists():
        return None
    credential = load_credential(data / CREDENTIAL_FILE)
    try:
        with open(where, "rb") as f:
            text = f.read(_MAX_COORDINATOR_FILE + 1)
        if len(text) > _MAX_COORDINATOR_FILE:
            raise ValueError(f"more than {_MAX_COORDINATOR_FILE} bytes")
        found = json.loads(text)["coordinators"]
        # A list of addresses, as join_host writes it: a string's letters or a number made
        # into text would be tried as addresses.
        if not isinstance(found, list) or not all(isinstance(a, str) and a for a in found):
            raise ValueError("'coordinators' is not a list of addresses")
        coordinators = tuple(found)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SecretFileError(f"{where} does not say where the coordinator is ({exc}); join "
                              "again with a new token (tq token create)") from None
    if not coordinators:
        raise SecretFileError(f"{where} names no coordinator")
    return JoinedHost(credential, str(data / CREDENTIAL_FILE), coordinators)


async def join_host(token: str | ParsedToken, data_dir: str | os.PathLike[str],
                    name: str) -> JoinedHost:
    """Redeem `token` for executor `name` and keep what it gave in `data_dir`."""
    parsed = parse_token(token) if isinstance(token, str) else token
    # The folder and the credential's file first: a token is redeemed once, so a data dir
    # that cannot hold what it gives must be found out before (CredentialFile).
    data = Path(data_dir)
    try:
        data.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise SecretFileError(f"cannot use {data} as the data directory: {exc.strerror}; "
                              "the join token was not used") from exc
    with CredentialFile(data / CREDENTIAL_FILE) as file:
        joined = await redeem(parsed, name)
        file.write(joined.credential, coordinator=joined.coordinators[0],
                   coordinator_key=joined.coordinator_key)
    # Atomically and durably, through a temporary file no one can predict or plant a link
    # at (the data dir may be on a shared disk), as the broker's id (`replace_file`).
    replace_file(data / COORDINATOR_FILE, json.dumps(
        {"coordinators": list(joined.coordinators), "namespace": joined.namespace}).encode()
        + b"\n")
    return JoinedHost(joined.credential, str(data / CREDENTIAL_FILE), joined.coordinators,
                      joined.local_address)
