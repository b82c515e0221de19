"""Credentials and keyrings: which key signs a principal's messages, to whom (DESIGN §12).

Every principal's key is derived from the cluster secret (the admin's key is the secret
itself), so only the holder of the secret mints keys, and the coordinator, which holds it,
needs to store no key at all:

    principal_key(secret, "user:alice", generation)     the principal's own key
    audience_key(key, BROKER)                            what it signs broker messages with
    handshake_token(audience key)                        what it shows when it connects

Two audiences. A principal signs what it sends the coordinator with its key, and what it sends
any broker with a one-way derivation of it. Brokers learn audience keys from the coordinator
(`ResolvePrincipal`, for an executor's broker) or derive them (a broker holding the secret), so
a broker host can act as a principal towards brokers but never towards the coordinator: it
cannot kill, delete or manage users with what it learns.

A peer proves who it is twice: when it connects, with a token derived one-way from the key it
signs with for that server (ZMQ PLAIN, which travels in clear, so never the key itself: a
token seen on the wire lets its holder connect, not sign), and in every message, with the MAC.

A credential file is either the cluster secret (its holder is `admin`) or JSON written by
`write_credential`: {"principal": "user:alice", "key": "<64 hex digits>"}; both have mode 0600
and are refused when others may read them (`_secret`).

Keyrings answer a server's question "which signer checks messages of principal P?": `MasterKeyring`
derives (a server holding the secret; `valid` says which principals exist now), `RemoteKeyring`
asks an async `fetch` (an executor's broker asks the coordinator) and caches the answer for a
while. A CURVE server asks "whose public key is this?" (`principal_of_curve`: ZeroMQ's ZAP
request names no principal): `MasterKeyring` derives the public keys of the principals its
`principals` enumerates, `RemoteKeyring` asks `fetch_curve`. `seal` / `unseal` carry a key
inside a message to its one reader.

Must not: touch sockets or the catalog; everything here is keys and files.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import blake3

from catalog import ADMIN, InvalidCommandError, PrincipalKind, check_principal, principal_kind
from querylib._state_file import fsync_dir

from ._curve import curve_public
from ._errors import SecretFileError
from ._secret import MIN_SECRET_BYTES, check_secret_folder, read_private_file
from ._signer import Signer

__all__ = [
    "BROKER",
    "COORDINATOR",
    "Credential",
    "CredentialFile",
    "Keyring",
    "MasterKeyring",
    "RemoteKeyring",
    "audience_key",
    "handshake_token",
    "kafka_password",
    "load_credential",
    "principal_key",
    "seal",
    "unseal",
    "write_credential",
]

COORDINATOR = "coordinator"
BROKER = "broker"
AUDIENCES = (COORDINATOR, BROKER)

# BLAKE3 derive_key contexts: one per purpose, never reused.
_PRINCIPAL_CONTEXT = "tq 2026-11 principal key"
_BROKER_CONTEXT = "tq 2026-11 broker audience key"
_SEAL_CONTEXT = "tq 2026-11 sealed key"
_KAFKA_PASSWORD_CONTEXT = "tq 2026-11 kafka sasl password"
_HANDSHAKE_CONTEXT = "tq 2026-11 zmq handshake token"
_NONCE = 16


def principal_key(secret: bytes, principal: str, generation: int = 0) -> bytes:
    """The key of `principal` in the cluster of `secret` (the admin's is the secret)."""
    if principal == ADMIN:
        return secret
    material = b"\0".join((secret, check_principal(principal).encode(),
                           str(generation).encode()))
    return blake3.blake3(material, derive_key_context=_PRINCIPAL_CONTEXT).digest()


def audience_key(key: bytes, audience: str) -> bytes:
    """What a principal with `key` signs messages to `audience` with."""
    if audience == COORDINATOR:
        return key
    if audience == BROKER:
        return blake3.blake3(key, derive_key_context=_BROKER_CONTEXT).digest()
    raise ValueError(f"unknown audience {audience!r}")


def handshake_token(key: bytes) -> bytes:
    """What a peer signing with `key` (its key for the server's audience) shows as its ZMQ
    PLAIN password when it connects: 64 hex digits, one-way from the key."""
    return blake3.blake3(key, derive_key_context=_HANDSHAKE_CONTEXT).hexdigest().encode()


def kafka_password(credential: Credential | bytes, *, broker_key: bool = False) -> str:
    """The Kafka SASL password of a principal (PLAIN or SCRAM): 32 hex digits derived from
    its broker key, so any broker that may check its messages can check its password, and the
    password opens nothing else. `broker_key`: `credential` is that broker key already."""
    key = credential.key if isinstance(credential, Credential) else credential
    if not broker_key:
        key = audience_key(key, BROKER)
    return blake3.blake3(key, derive_key_context=_KAFKA_PASSWORD_CONTEXT).hexdigest()[:32]


@dataclass(frozen=True)
class Credential:
    """Who we are and the key that proves it."""

    principal: str
    key: bytes
    # The coordinator's CURVE public key, when the credential file names one (`tq user add`
    # on a coordinator reachable from other hosts): how to connect to it across hosts.
    coordinator_key: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if len(self.key) < MIN_SECRET_BYTES:
            raise SecretFileError(f"a key is at least {MIN_SECRET_BYTES} bytes")

    @classmethod
    def of(cls, secret: bytes | Credential) -> Credential:
        """A credential as given, or the admin's for a bare cluster secret."""
        return secret if isinstance(secret, Credential) else cls(ADMIN, bytes(secret))

    def for_audience(self, audience: str) -> Credential:
        return Credential(self.principal, audience_key(self.key, audience))

    def __repr__(self) -> str:  # never print a key
        return f"Credential({self.principal!r})"


def load_credential(path: str | os.PathLike[str]) -> Credential:
    """The credential in the file at `path`: a cluster secret (admin) or a principal's JSON."""
    data = read_private_file(Path(path)).strip()
    if not data.startswith(b"{"):
        if len(data) < MIN_SECRET_BYTES:
            raise SecretFileError(f"secret file {path} holds {len(data)} bytes; at least "
                                  f"{MIN_SECRET_BYTES} are needed")
        return Credential(ADMIN, data)
    try:
        found = json.loads(data)
        principal, key = check_principal(found["principal"]), bytes.fromhex(found["key"])
        coordinator_key = found.get("coordinator_key") or ""
        if not isinstance(coordinator_key, str):
            raise TypeError("coordinator_key is not text")
    except (ValueError, KeyError, TypeError, InvalidCommandError) as exc:
        raise SecretFileError(f"credential file {path} is not a tq credential ({exc})") \
            from None
    return Credential(principal, key, coordinator_key)


def write_credential(path: str | os.PathLike[str], credential: Credential, *,
                     coordinator: str = "", coordinator_key: str = "") -> None:
    """Write `credential` to a new private file (mode 0600, by rename); refuses to replace one
    that exists, so a credential is never lost by a typo. `coordinator_key`: the coordinator's
    CURVE public key, when it is a CURVE server."""
    with CredentialFile(path) as file:
        file.write(credential, coordinator=coordinator, coordinator_key=coordinator_key)


class CredentialFile:
    """A new credential file, made before the credential it will hold exists.

        with CredentialFile(path) as file:         # SecretFileError: path exists, no folder...
            credential = mint_it()                 # tq user add|rotate, a join token redeemed
            file.write(credential)

    The coordinator mints a key once (adding a user, rotating one, redeeming a join token), so
    a file that cannot be written is found out before asking: found out after, the key was
    lost, with the cluster changed (a user no credential proves, a rotation whose old key has
    stopped working, a token used up). Making it opens a private temporary file (0600) beside
    `path`, which `write` fills, fsyncs and links to `path`, fsyncing the folder after; leaving
    without writing removes it."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._tmp = self.path.with_name(
            f".{self.path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        if os.path.lexists(self.path):
            raise SecretFileError(f"{self.path} exists already; choose another file")
        check_secret_folder(self.path)
        try:
            self._fd: int | None = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                                           0o600)
        except OSError as exc:
            raise SecretFileError(f"cannot write credential file {self.path}: "
                                  f"{exc.strerror}") from exc
        self._kept = False

    def write(self, credential: Credential, *, coordinator: str = "",
              coordinator_key: str = "") -> None:
        """Fill the file with `credential` and put it in place. A file that appeared at
        `path` meanwhile is not replaced: the credential stays in the temporary file, and the
        error says where."""
        assert self._fd is not None, "a credential file is written once"
        body = {"principal": credential.principal, "key": credential.key.hex()}
        if coordinator:
            body["coordinator"] = coordinator
        if coordinator_key:
            body["coordinator_key"] = coordinator_key
        fd, self._fd = self._fd, None
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(body, f)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.link(self._tmp, self.path)
            self._tmp.unlink()
            # The coordinator has minted the key: a power loss must not take the file's link
            # (nor leave the temporary name holding the key).
            fsync_dir(self.path.parent)
        except FileExistsError:
            self._kept = True
            raise SecretFileError(f"{self.path} was made meanwhile; the credential is in "
                                  f"{self._tmp}") from None
        except OSError as exc:
            raise SecretFileError(f"cannot write credential file {self.path}: "
                                  f"{exc.strerror}") from exc

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if not self._kept:
            self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> CredentialFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _seal_stream(key: bytes, nonce: bytes, length: int) -> bytes:
    sealing = blake3.blake3(key, derive_key_context=_SEAL_CONTEXT).digest()
    return blake3.blake3(nonce, key=sealing).digest(length)


def seal(key: bytes, plaintext: bytes) -> bytes:
    """`plaintext` readable only by a holder of `key`. Confidentiality only: it travels in an
    RPC message whose MAC (under that same principal's key) protects its integrity."""
    nonce = os.urandom(_NONCE)
    stream = _seal_stream(key, nonce, len(plaintext))
    return nonce + bytes(a ^ b for a, b in zip(plaintext, stream, strict=True))


def unseal(key: bytes, sealed: bytes) -> bytes:
    if len(sealed) < _NONCE:
        raise SecretFileError("a sealed key is too short")
    nonce, body = sealed[:_NONCE], sealed[_NONCE:]
    stream = _seal_stream(key, nonce, len(body))
    return bytes(a ^ b for a, b in zip(body, stream, strict=True))


class Keyring:
    """Which signer verifies a principal's messages on one server. `signer` answers from what
    is known now; `resolve` learns a principal not known yet (False: it does not exist)."""

    audience: str = COORDINATOR

    def signer(self, principal: str) -> Signer | None:
        raise NotImplementedError

    @property
    def resolves(self) -> bool:
        """Whether `resolve` can learn principals `signer` does not know yet."""
        return False

    async def resolve(self, principal: str) -> bool:
        return self.signer(principal) is not None

    async def key_of(self, principal: str) -> bytes | None:
        """`principal`'s key for this keyring's audience, if it exists now (a broker checks a
        Kafka user's password with it: `kafka_password(key, broker_key=True)`)."""
        return None

    def refetch(self, principal: str) -> bool:
        """A credential did not match the key known for `principal`: forget that key if it
        may be stale (the principal's credential was rotated since), so `key_of` asks again.
        True when it was forgotten."""
        return False

    async def principal_of_curve(self, public: bytes) -> str | None:
        """The principal whose CURVE public key (Z85, `curve_public` of its key for this
        audience) is `public`, if one exists now; None when none does (a fetching keyring
        raises a TqError when it cannot ask)."""
        return None


class MasterKeyring(Keyring):
    """Derives keys from the cluster secret. `valid(principal)` is the principal's current
    generation, or None when it does not exist now (default: every well-formed principal, at
    generation 0: a standalone server with no catalog). `principals()` enumerates the
    principals that may connect to a CURVE server (default: the admin), whose public keys it
    derives once each (a name seen before costs a set lookup, so a stranger's key costs one
    pass over the names)."""

    def __init__(self, secret: bytes, *, audience: str = COORDINATOR,
                 valid: Callable[[str], int | None] | None = None,
                 principals: Callable[[], Iterable[str]] | None = None,
                 cache_size: int = 4096) -> None:
        if audience not in AUDIENCES:
            raise ValueError(f"unknown audience {audience!r}")
        self.audience = audience
        self._secret = secret
        self._valid = valid or _any_principal
        self._principals = principals or (lambda: (ADMIN,))
        self._cache: OrderedDict[tuple[str, int], Signer] = OrderedDict()
        self._cache_size = cache_size
        # CURVE public key -> (principal, generation), and which (principal, generation)
        # are in it already.
        self._curve: dict[bytes, tuple[str, int]] = {}
        self._curved: set[tuple[str, int]] = set()

    @property
    def secret(self) -> bytes:
        """The cluster secret it derives from (a server's CURVE keypair derives from it)."""
        return self._secret

    async def principal_of_curve(self, public: bytes) -> str | None:
        found = self._curve.get(public)
        if found is None:
            self._learn_curve()
            found = self._curve.get(public)
        if found is None or self._valid(found[0]) != found[1]:
            return None
        return found[0]

    def _learn_curve(self) -> None:
        names = [(p, g) for p in self._principals() if (g := self._valid(p)) is not None]
        if len(self._curved) > 2 * len(names) + 64:  # many are gone: start again
            self._curve.clear()
            self._curved.clear()
        for principal, generation in names:
            if (principal, generation) not in self._curved:
                key = self.key(principal, generation)
                assert key is not None
                self._curve[curve_public(key)] = (principal, generation)
                self._curved.add((principal, generation))

    def key(self, principal: str, generation: int | None = None) -> bytes | None:
        """`principal`'s key for this keyring's audience, if it exists now."""
        if generation is None:
            generation = self._valid(principal)
            if generation is None:
                return None
        return audience_key(principal_key(self._secret, principal, generation), self.audience)

    async def key_of(self, principal: str) -> bytes | None:
        return self.key(principal)

    def signer(self, principal: str) -> Signer | None:
        generation = self._valid(principal)
        if generation is None:
            return None
        cached = self._cache.get((principal, generation))
        if cached is None:
            key = self.key(principal, generation)
            assert key is not None
            cached = self._cache[(principal, generation)] = Signer(key)
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return cached


@functools.lru_cache(maxsize=4096)  # pure; asked once per message a server receives
def _any_principal(principal: str) -> int | None:
    """Every principal that may hold a key (never `system` or `anonymous`), at generation 0."""
    try:
        kind = principal_kind(principal)
    except InvalidCommandError:
        return None
    return None if kind in (PrincipalKind.SYSTEM, PrincipalKind.ANONYMOUS) else 0


class RemoteKeyring(Keyring):
    """Keys fetched from elsewhere (an executor's broker asks the coordinator), each kept for
    `ttl` seconds; an unknown principal is not asked for again for `negative_ttl` seconds, so a
    stream of made-up names costs one fetch each per interval at most. `fetch(principal)`
    returns the audience key, or None when the principal does not exist, and raises a TqError
    when it cannot ask (the server then neither admits nor refuses: the peer comes again).
    `fetch_curve(public)` returns (principal, audience key) of the holder of a CURVE public
    key, or None; without it
    only the principals it knows connect over CURVE."""

    def __init__(self, fetch: Callable[[str], Awaitable[bytes | None]], *,
                 fetch_curve: Callable[[bytes], Awaitable[tuple[str, bytes] | None]]
                 | None = None,
                 audience: str = BROKER, ttl: float = 60.0, negative_ttl: float = 5.0,
                 max_entries: int = 65536, clock: Callable[[], float] = time.monotonic) -> None:
        self.audience = audience
        self._fetch = fetch
        self._fetch_curve = fetch_curve
        # CURVE public key -> principal, as learned (its key is checked against the cache)
        self._curve: OrderedDict[bytes, str] = OrderedDict()
        self._ttl = ttl
        self._negative_ttl = negative_ttl
        self._max = max_entries
        self._clock = clock
        # principal -> (signer, key, expiry); signer and key None: it does not exist
        self._known: OrderedDict[str, tuple[Signer | None, bytes | None, float]] = OrderedDict()
        self._pinned: dict[str, tuple[Signer, bytes]] = {}
        self._pending: dict[str, asyncio.Future[bool]] = {}

    @property
    def resolves(self) -> bool:
        return True

    def pin(self, principal: str, key: bytes) -> None:
        """Know `principal`'s key for good (the server's own principal: it needs nobody to
        tell it its own key)."""
        self._pinned[principal] = (Signer(key), key)
        self._curve[curve_public(key)] = principal

    async def principal_of_curve(self, public: bytes) -> str | None:
        principal = self._curve.get(public)
        if principal is not None:
            key = await self.key_of(principal)
            if key is not None and curve_public(key) == public:
                return principal
        if self._fetch_curve is None:
            return None
        found = await self._fetch_curve(public)
        if found is None:
            return None
        principal, key = found
        if curve_public(key) != public:
            return None  # not what we asked for
        self._remember(principal, key)
        self._curve.pop(public, None)
        self._curve[public] = principal
        while len(self._curve) > self._max:
            self._curve.popitem(last=False)
        return principal

    def _fresh(self, principal: str) -> tuple[Signer | None, bytes | None, float] | None:
        pinned = self._pinned.get(principal)
        if pinned is not None:
            return (*pinned, float("inf"))
        found = self._known.get(principal)
        return None if found is None or found[2] <= self._clock() else found

    def signer(self, principal: str) -> Signer | None:
        found = self._fresh(principal)
        return None if found is None else found[0]

    async def key_of(self, principal: str) -> bytes | None:
        if not await self.resolve(principal):
            return None
        found = self._fresh(principal)
        return None if found is None else found[1]

    def refetch(self, principal: str) -> bool:
        """Forget a cached (not pinned) key fetched at least `negative_ttl` seconds ago, so a
        rotated credential works at once and a wrong one costs one fetch per interval."""
        found = self._known.get(principal)
        if found is None or found[0] is None or principal in self._pinned:
            return False
        if self._clock() < found[2] - self._ttl + self._negative_ttl:
            return False  # fetched moments ago: that is the key
        del self._known[principal]
        return True

    def refused(self, principal: str) -> bool:
        """Known not to exist (for the negative interval): do not ask again yet."""
        found = self._fresh(principal)
        return found is not None and found[0] is None

    async def resolve(self, principal: str) -> bool:
        if self.signer(principal) is not None:
            return True
        if self.refused(principal):
            return False
        pending = self._pending.get(principal)
        if pending is None:
            pending = asyncio.get_running_loop().create_future()
            self._pending[principal] = pending
            try:
                key = await self._fetch(principal)
            except BaseException as exc:
                pending.set_exception(exc)
                pending.exception()  # retrieved: waiters re-raise it themselves
                raise
            finally:
                del self._pending[principal]
            self._remember(principal, key)
            pending.set_result(key is not None)
            return key is not None
        return await asyncio.shield(pending)

    def _remember(self, principal: str, key: bytes | None) -> None:
        ttl = self._ttl if key is not None else self._negative_ttl
        self._known.pop(principal, None)
        self._known[principal] = (None if key is None else Signer(key), key,
                                  self._clock() + ttl)
        while len(self._known) > self._max:
            self._known.popitem(last=False)
