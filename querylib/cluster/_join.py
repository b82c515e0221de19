"""Join tokens on the client side (DESIGN §12 "Joining a host"): the string an admin copies to
a new host, and the one exchange that redeems it.

    tqjoin1.<coordinators>.<token id>.<secret>[.<coordinator key>]

`coordinators` is the coordinator addresses, comma-separated, in unpadded URL-safe base64;
`secret` is the key of principal `join:<token id>` (32 bytes, unpadded URL-safe base64), which
the coordinator derives from the cluster secret and the token's salt, so it stores no secret;
`coordinator key`, when the coordinator is a CURVE server (bound beyond loopback, DESIGN §2
"Handshake"), its CURVE public key (32 bytes, unpadded URL-safe base64): the joiner connects
with CURVE to exactly that server, so it is encrypted and the server proven from the first
byte.
Like kubeadm's and k3s's join tokens, one string says where to go and proves the right to.

`redeem(token, name)` connects to a coordinator the token names as `join:ID`, signing with the
token's key: the handshake shows a one-way token of it, as every credential does (DESIGN §2
"Handshake"), so a wrong or revoked token is refused before any message (SecretRejectedError,
said here as BadJoinTokenError); a used or expired one is answered JoinTokenError. The reply is
signed with the token's key and the executor key inside it is sealed with it, so the joiner
knows that only a holder of the cluster secret made it, and nobody on the wire reads it.

Must not: write files (the executor writes what it got, executor/_join.py), or keep a session.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from zmq.utils import z85

from catalog import TqError, check_principal, join_principal
from querylib.rpc import Credential, RpcClient, SecretRejectedError, remember_server_key, unseal

from . import messages as m
from ._advertise import local_address_toward
from ._errors import BadJoinTokenError

__all__ = ["BadJoinTokenError", "Joined", "ParsedToken", "format_token", "parse_token", "redeem"]

PREFIX = "tqjoin1"
_MAX_TOKEN = 4096


@dataclass(frozen=True)
class ParsedToken:
    coordinators: tuple[str, ...]
    token_id: int
    secret: bytes
    coordinator_key: str = ""  # Z85, "" for a PLAIN coordinator

    @property
    def credential(self) -> Credential:
        return Credential(join_principal(self.token_id), self.secret)


@dataclass(frozen=True)
class Joined:
    """What a redeemed token gave: the executor's credential, every coordinator address, the
    cluster's namespace, and the address this host reached the coordinator from."""

    credential: Credential
    coordinators: tuple[str, ...]
    namespace: str
    local_address: str | None
    coordinator_key: str = ""  # Z85, "" for a PLAIN coordinator


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def format_token(coordinators: list[str] | tuple[str, ...], token_id: int, secret: bytes,
                 coordinator_key: str = "") -> str:
    parts = [PREFIX, _b64(",".join(coordinators).encode()), str(token_id), _b64(secret)]
    if coordinator_key:
        parts.append(_b64(z85.decode(coordinator_key.encode())))
    return ".".join(parts)


def parse_token(text: str) -> ParsedToken:
    """The parts of a join token (BadJoinTokenError, saying what is wrong, if it is none)."""
    parts = text.strip().split(".")
    if len(text) > _MAX_TOKEN or len(parts) not in (4, 5) or parts[0] != PREFIX:
        raise BadJoinTokenError(f"not a join token (they look like {PREFIX}.<...>.<id>.<...>, "
                                "from tq token create)")
    try:
        coordinators = tuple(a for a in _unb64(parts[1]).decode().split(",") if a)
        token_id = int(parts[2])
        secret = _unb64(parts[3])
        key = ""
        if len(parts) == 5:
            raw = _unb64(parts[4])
            if len(raw) != 32:
                raise ValueError("the coordinator's key is not 32 bytes")
            key = z85.encode(raw).decode()
        check_principal(join_principal(token_id))
        parsed = ParsedToken(coordinators, token_id, secret, key)
        parsed.credential  # noqa: B018 - checks the secret's length (SecretFileError)
    except (ValueError, binascii.Error, UnicodeDecodeError, TqError) as exc:
        raise BadJoinTokenError(f"a damaged join token ({exc}); copy it again whole") from None
    if not coordinators:
        raise BadJoinTokenError("a join token that names no coordinator")
    return parsed


async def redeem(token: str | ParsedToken, name: str, *, timeout: float = 10.0) -> Joined:
    """Redeem a join token for executor `name` (a token minted with a name overrides it) at
    the first coordinator it names that answers."""
    parsed = parse_token(token) if isinstance(token, str) else token
    failure: Exception | None = None
    for address in parsed.coordinators:
        if parsed.coordinator_key:
            remember_server_key(address, parsed.coordinator_key)
        client = RpcClient(address, parsed.credential)
        try:
            await client.connect()
            reply = await client.request(m.JoinCluster(name=name), timeout=timeout)
        except SecretRejectedError:
            raise BadJoinTokenError(
                f"the coordinator at {address} refused join token {parsed.token_id}: it is not "
                "one of this cluster's, or it was revoked (tq token list shows them)") from None
        except TqError as exc:
            if not exc.retriable:  # used, expired, a name taken: the coordinator said why
                raise
            failure = exc  # unreachable, timed out: the next address may answer
            continue
        finally:
            await client.close()
        key = unseal(parsed.secret, reply.sealed_key)
        coordinator_key = reply.coordinator_key or parsed.coordinator_key
        return Joined(Credential(check_principal(reply.principal), key, coordinator_key),
                      tuple(reply.coordinators) or parsed.coordinators, reply.namespace,
                      local_address_toward(address), coordinator_key)
    raise BadJoinTokenError(f"no coordinator named in the join token answered "
                            f"({', '.join(parsed.coordinators)}): {failure}")
