"""CurveZMQ keypairs derived from tq keys, and which links use CURVE (DESIGN §2 "Handshake").

A link that can leave the host is encrypted and authenticated with CurveZMQ (RFC 26): a
server bound to a non-loopback address (0.0.0.0 included) is a CURVE server; one on loopback
stays PLAIN unless CURVE is forced (`TQ_RPC_CURVE=1`, or `curve=True`). Both keypairs of a
link derive from keys tq has already, so nothing new is stored:

    server_keypair(key, audience)   a server's: the coordinator's from the cluster secret, a
                                    broker's from the key of the principal running it
    client_keypair(audience key)    a peer's: from the key it signs with for that server

A server publishes its public key only when it is a CURVE server (cluster.json, credential
files and `--coordinator-key` for the coordinator, the catalog's broker record for a broker),
and a client uses CURVE exactly when it has the public key of the server it connects to:
given, or remembered for that address (`remember_server_key`, a process's known_hosts, fed
where addresses are learned: the coordinator's by `discover`, brokers' from the catalog). A server
learns whose a client's public key is from its keyring (`Keyring.principal_of_curve`), since
ZeroMQ's ZAP request carries the key but no name.

Keys travel as Z85 text (40 characters), as ZeroMQ's options take them.

Must not: open sockets or read files.
"""

from __future__ import annotations

import ipaddress
import os
from urllib.parse import urlsplit

import blake3
import zmq
from zmq.utils import z85

__all__ = [
    "CURVE_ENV",
    "KeyPair",
    "client_keypair",
    "coordinator_public_key",
    "curve_forced",
    "curve_public",
    "leaves_host",
    "remember_server_key",
    "server_key_of",
    "server_keypair",
]

CURVE_ENV = "TQ_RPC_CURVE"
"""`1`: every RPC server is a CURVE server, loopback ones too (tests, paranoid operators)."""

_SERVER_CONTEXT = "tq 2026-11 curve server secret key"
_CLIENT_CONTEXT = "tq 2026-11 curve client secret key"

KeyPair = tuple[bytes, bytes]
"""(public, secret), each 40 bytes of Z85."""


def _pair(secret: bytes) -> KeyPair:
    encoded = z85.encode(secret)
    return zmq.curve_public(encoded), encoded


def server_keypair(key: bytes, audience: str) -> KeyPair:
    """The CURVE keypair of a server of `audience` run by the holder of `key` (the cluster
    secret for the coordinator and its catalog broker; an executor's key for its brokers)."""
    material = audience.encode() + b"\0" + key
    return _pair(blake3.blake3(material, derive_key_context=_SERVER_CONTEXT).digest())


def client_keypair(key: bytes) -> KeyPair:
    """The CURVE keypair of a peer signing with `key` (its key for the server's audience):
    one-way from the key, so a server that can check the peer's messages can tell its public
    key, and the public key seen on the wire gives nothing away."""
    return _pair(blake3.blake3(key, derive_key_context=_CLIENT_CONTEXT).digest())


def curve_public(key: bytes) -> bytes:
    """The public key of the peer signing with `key` (Z85), as a server's keyring maps it."""
    return client_keypair(key)[0]


def coordinator_public_key(secret: bytes) -> str:
    """The coordinator's public CURVE key (Z85 text) in the cluster of `secret`: what a client
    needs to connect to it across hosts (`--coordinator-key`, TQ_COORDINATOR_KEY)."""
    return server_keypair(secret, "coordinator")[0].decode()  # _credentials.COORDINATOR


_known: dict[str, bytes] = {}  # address -> public key of the CURVE server there


def remember_server_key(address: str, public: str | bytes) -> None:
    """The CURVE server at `address` has public key `public` (Z85): clients of this process
    connecting there use CURVE with it. An empty key forgets the address (a PLAIN server)."""
    key = public.encode() if isinstance(public, str) else public
    if key:
        _known[address] = key
    else:
        _known.pop(address, None)


def server_key_of(address: str) -> bytes | None:
    """The public key remembered for the CURVE server at `address`, if any."""
    return _known.get(address)


def curve_forced() -> bool:
    """Whether CURVE is forced on every server (TQ_RPC_CURVE=1)."""
    return os.environ.get(CURVE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def leaves_host(endpoint: str) -> bool:
    """Whether a server bound to `endpoint` can be reached from another host: every TCP
    address but loopback ones (a name is resolved by nobody here: it counts as leaving)."""
    parts = urlsplit(endpoint)
    if parts.scheme != "tcp":
        return False  # inproc, ipc: this host only
    host = (parts.hostname or "").strip("[]")
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True
