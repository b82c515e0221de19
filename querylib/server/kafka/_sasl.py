"""SASL on the Kafka listener (DESIGN §12): PLAIN and SCRAM-SHA-256/512, mapped to tq principals.

Kafka's SASL runs inside the protocol: SaslHandshake (api key 17) picks a mechanism, then each
SaslAuthenticate (36) carries one token of the exchange; the server answers each with its own
token. One `SaslExchange` per connection does the mechanism's part, sans-I/O:

    exchange = SaslExchange("SCRAM-SHA-256")
    user = exchange.username(first_token)          # who claims to connect
    secret = await passwords(user)                 # the caller looks the password up (I/O)
    reply = exchange.respond(first_token, secret)  # server-first; later tokens: respond(t)
    exchange.principal                              # set once the exchange succeeded

Usernames are tq principals without their kind: `admin`, or NAME for `user:NAME` (users with
the user or admin role). A user's password is `querylib.rpc.kafka_password` of its broker key:
any broker that may check the user's messages can check its password, and the password opens
nothing but Kafka listeners. SCRAM stores nothing: the salt is derived from the same key and
the salted password computed on first use (4096 PBKDF2 iterations, Kafka's minimum) and kept
per principal and key (`ScramCache`).

Must not: read sockets or look passwords up itself (the listener does); know topics or groups.
"""

from __future__ import annotations

import hmac
from collections import OrderedDict
from dataclasses import dataclass

import blake3
import scramp

from querylib.kafka._errors import (
    IllegalSaslStateError,
    SaslAuthenticationFailedError,
    UnsupportedSaslMechanismError,
)

__all__ = [
    "MECHANISMS",
    "SaslExchange",
    "ScramCache",
    "ScramSecret",
    "principal_of_username",
]

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
SCRAM_ITERATIONS = 4096
_SALT_CONTEXT = "tq 2026-11 kafka scram salt"
_MAX_TOKEN = 4096  # a SASL token of ours is a few hundred bytes


def principal_of_username(username: str) -> str:
    """The tq principal a Kafka username names: `admin`, else `user:NAME`."""
    return "admin" if username == "admin" else f"user:{username}"


@dataclass(frozen=True)
class ScramSecret:
    """What a SCRAM server keeps of a password (RFC 5802): salt, stored and server key."""

    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int


class ScramCache:
    """Salted passwords per (mechanism, principal, password): PBKDF2 costs milliseconds, and a
    client reconnects often. Bounded; keyed by the password too, so a rotated key is a miss."""

    def __init__(self, size: int = 1024) -> None:
        self._size = size
        self._entries: OrderedDict[tuple[str, str, str], ScramSecret] = OrderedDict()

    def get(self, mechanism: str, principal: str, password: str) -> ScramSecret:
        key = (mechanism, principal, password)
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
            return found
        salt = blake3.blake3(password.encode(), derive_key_context=_SALT_CONTEXT).digest(16)
        info = scramp.ScramMechanism(mechanism).make_auth_info(
            password, iteration_count=SCRAM_ITERATIONS, salt=salt)
        found = ScramSecret(info[0], info[1], info[2], iterations=info[3])
        self._entries[key] = found
        if len(self._entries) > self._size:
            self._entries.popitem(last=False)
        return found


_CACHE = ScramCache()


class SaslExchange:
    """One connection's authentication with one mechanism: tokens in, tokens out."""

    def __init__(self, mechanism: str, *, cache: ScramCache | None = None) -> None:
        if mechanism not in MECHANISMS:
            raise UnsupportedSaslMechanismError(
                f"SASL mechanism {mechanism[:40]!r} is not enabled; this listener offers "
                f"{', '.join(MECHANISMS)}")
        self.mechanism = mechanism
        self.principal: str | None = None  # set when the exchange succeeded
        self._cache = cache or _CACHE
        self._scram: scramp.ScramServer | None = None
        self._user: str | None = None
        self._client_nonce = ""
        self._rounds = 0

    @property
    def done(self) -> bool:
        return self.principal is not None

    @property
    def username_needed(self) -> bool:
        """Whether the next token is the first (the caller looks its user's password up)."""
        return self._rounds == 0

    def username(self, token: bytes) -> str:
        """Who the first token says is connecting (for the caller to look the password up)."""
        _check_size(token)
        if self.mechanism == "PLAIN":
            return _plain_parts(token)[1]
        try:
            text = token.decode("utf-8")
        except UnicodeDecodeError:
            raise SaslAuthenticationFailedError("the SCRAM client-first message is not "
                                                "UTF-8") from None
        # gs2-header "n,," then "n=USER,r=NONCE[,...]": the first "n=" attribute is the user.
        user = _attribute(text, "n")
        if not user:
            raise SaslAuthenticationFailedError("the SCRAM client-first message names no user")
        return user.replace("=2C", ",").replace("=3D", "=")

    def respond(self, token: bytes, password: str | None = None) -> bytes:
        """The server's token for `token`. The first call takes the password of the user
        `username(token)` named (None: no such user); the exchange fails with
        SaslAuthenticationFailedError on any mismatch, naming no detail a guesser could use."""
        _check_size(token)
        if self.done:
            raise IllegalSaslStateError("this connection has authenticated already")
        self._rounds += 1
        if self.mechanism == "PLAIN":
            return self._plain(token, password)
        return self._scram_step(token, password)

    def _plain(self, token: bytes, password: str | None) -> bytes:
        authzid, user, given = _plain_parts(token)
        if authzid and authzid != user:
            raise SaslAuthenticationFailedError("authenticating as another user is not "
                                                "supported")
        if password is None or not hmac.compare_digest(given.encode(), password.encode()):
            raise SaslAuthenticationFailedError(_FAILED)
        self.principal = principal_of_username(user)
        return b""

    def _scram_step(self, token: bytes, password: str | None) -> bytes:
        try:
            if self._scram is None:
                user = self.username(token)
                if password is None:
                    raise SaslAuthenticationFailedError(_FAILED)
                secret = self._cache.get(self.mechanism, principal_of_username(user),
                                         password)
                self._user = user
                self._scram = scramp.ScramMechanism(self.mechanism).make_server(
                    lambda _name: (secret.salt, secret.stored_key, secret.server_key,
                                   secret.iterations))
                self._scram.set_client_first(token.decode("utf-8"))
                self._client_nonce = _attribute(token.decode("utf-8"), "r")
                return self._scram.get_server_first().encode()
            if self._rounds != 2:
                raise IllegalSaslStateError("the SCRAM exchange is over")
            client_final = token.decode("utf-8")
            self._accept_doubled_nonce(client_final)
            self._scram.set_client_final(client_final)
            final = self._scram.get_server_final().encode()
        except scramp.ScramException:
            raise SaslAuthenticationFailedError(_FAILED) from None
        except UnicodeDecodeError:
            raise SaslAuthenticationFailedError("a SCRAM message is not UTF-8") from None
        assert self._user is not None
        self.principal = principal_of_username(self._user)
        return final

    def _accept_doubled_nonce(self, client_final: str) -> None:
        """librdkafka before 2.6.1 (Debian 12's kcat has 2.0.2) puts its own nonce in front
        of the server's once more (confluentinc/librdkafka#4895): r = cnonce + cnonce +
        snonce. Kafka up to 3.8 let it pass (its check was `endsWith`), Kafka 4 refuses it.
        tq lets exactly that form pass: the server's fresh nonce is still all there, so a
        replayed exchange still fails; the proof is checked over the message as sent."""
        assert self._scram is not None
        expected = str(self._scram.nonce)
        for part in client_final.split(","):
            if part.startswith("r="):
                sent = part[2:]
                cnonce = self._client_nonce
                if cnonce and sent == cnonce + expected:
                    self._scram.nonce = type(self._scram.nonce)(sent)
                return


_FAILED = "authentication failed: wrong username or password (or not a user of this cluster)"


def _attribute(message: str, name: str) -> str:
    """The value of attribute `name` of a SCRAM message ("" if absent)."""
    for part in message.split(","):
        if part.startswith(name + "="):
            return part[len(name) + 1:]
    return ""


def _check_size(token: bytes) -> None:
    if len(token) > _MAX_TOKEN:
        raise SaslAuthenticationFailedError(f"a SASL token of {len(token)} bytes; at most "
                                            f"{_MAX_TOKEN}")


def _plain_parts(token: bytes) -> tuple[str, str, str]:
    """RFC 4616: [authzid] NUL authcid NUL passwd."""
    parts = token.split(b"\0")
    if len(parts) != 3 or not parts[1]:
        raise SaslAuthenticationFailedError("a PLAIN token is [authzid] NUL user NUL password")
    try:
        authzid, user, password = (p.decode("utf-8") for p in parts)
    except UnicodeDecodeError:
        raise SaslAuthenticationFailedError("a PLAIN token is not UTF-8") from None
    return authzid, user, password
