"""The SASL exchanges of the Kafka listener, against scramp's own SCRAM client."""

from __future__ import annotations

import pytest
import scramp

from querylib.kafka._errors import (
    IllegalSaslStateError,
    SaslAuthenticationFailedError,
    UnsupportedSaslMechanismError,
)
from querylib.server.kafka._sasl import SaslExchange, ScramCache, principal_of_username

PASSWORD = "0123456789abcdef0123456789abcdef"


def test_plain_maps_the_user_to_its_principal() -> None:
    exchange = SaslExchange("PLAIN")
    token = b"\0alice\0" + PASSWORD.encode()
    assert exchange.username(token) == "alice"
    assert exchange.respond(token, PASSWORD) == b""
    assert exchange.principal == "user:alice"
    with pytest.raises(IllegalSaslStateError):
        exchange.respond(token, PASSWORD)
    admin = SaslExchange("PLAIN")
    admin.respond(b"admin\0admin\0" + PASSWORD.encode(), PASSWORD)
    assert admin.principal == "admin" == principal_of_username("admin")


@pytest.mark.parametrize("token", [b"\0alice\0wrong", b"\0alice", b"bob\0alice\0x",
                                   b"\0\0" + PASSWORD.encode(), b"\xff\0alice\0x"])
def test_plain_refuses_wrong_and_malformed_tokens(token: bytes) -> None:
    exchange = SaslExchange("PLAIN")
    with pytest.raises(SaslAuthenticationFailedError):
        exchange.respond(token, PASSWORD)
    assert exchange.principal is None


def test_an_unknown_user_fails_like_a_wrong_password() -> None:
    plain, scram = SaslExchange("PLAIN"), SaslExchange("SCRAM-SHA-256")
    with pytest.raises(SaslAuthenticationFailedError) as unknown:
        plain.respond(b"\0nobody\0" + PASSWORD.encode(), None)
    with pytest.raises(SaslAuthenticationFailedError) as wrong:
        SaslExchange("PLAIN").respond(b"\0alice\0nope", PASSWORD)
    assert str(unknown.value) == str(wrong.value)
    client = scramp.ScramClient(["SCRAM-SHA-256"], "nobody", PASSWORD)
    with pytest.raises(SaslAuthenticationFailedError):
        scram.respond(client.get_client_first().encode(), None)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
@pytest.mark.parametrize("user", ["alice", "we,ird=name"])
def test_scram_with_a_real_client(mechanism: str, user: str) -> None:
    exchange = SaslExchange(mechanism, cache=ScramCache())
    client = scramp.ScramClient([mechanism], user, PASSWORD)
    first = client.get_client_first().encode()
    assert exchange.username(first) == user
    client.set_server_first(exchange.respond(first, PASSWORD).decode())
    assert not exchange.done
    final = exchange.respond(client.get_client_final().encode())
    client.set_server_final(final.decode())  # the client checks the server's proof
    assert exchange.principal == f"user:{user}"


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_with_a_wrong_password_fails(mechanism: str) -> None:
    exchange = SaslExchange(mechanism, cache=ScramCache())
    client = scramp.ScramClient([mechanism], "alice", "not the password")
    first = client.get_client_first().encode()
    client.set_server_first(exchange.respond(first, PASSWORD).decode())
    with pytest.raises(SaslAuthenticationFailedError):
        exchange.respond(client.get_client_final().encode())
    assert exchange.principal is None


def test_mechanisms_and_sizes_are_bounded() -> None:
    with pytest.raises(UnsupportedSaslMechanismError, match="GSSAPI"):
        SaslExchange("GSSAPI")
    with pytest.raises(SaslAuthenticationFailedError, match="at most"):
        SaslExchange("PLAIN").respond(b"\0a\0" + b"x" * 10_000, PASSWORD)


def test_the_salted_password_is_computed_once_per_key() -> None:
    cache = ScramCache(size=2)
    first = cache.get("SCRAM-SHA-256", "user:alice", PASSWORD)
    assert cache.get("SCRAM-SHA-256", "user:alice", PASSWORD) is first
    assert cache.get("SCRAM-SHA-256", "user:alice", "rotated") is not first
    assert first.iterations == 4096


def _scram_client_final(mechanism: str, password: str, client_first_bare: str,
                        server_first: str, nonce: str) -> bytes:
    """RFC 5802 client-final computed by hand, with whatever nonce the client puts in."""
    import base64
    import hashlib
    import hmac

    name = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}[mechanism]
    attrs = dict(part.split("=", 1) for part in server_first.split(","))
    salted = hashlib.pbkdf2_hmac(name, password.encode(), base64.b64decode(attrs["s"]),
                                 int(attrs["i"]))
    client_key = hmac.new(salted, b"Client Key", name).digest()
    stored = hashlib.new(name, client_key).digest()
    without_proof = f"c=biws,r={nonce}"
    auth = f"{client_first_bare},{server_first},{without_proof}".encode()
    signature = hmac.new(stored, auth, name).digest()
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()


def test_librdkafkas_doubled_client_nonce_is_accepted_and_nothing_else() -> None:
    """librdkafka < 2.6.1 (Debian's kcat) sends r = cnonce + cnonce + snonce; any other
    nonce, the RFC's own form aside, is refused."""
    for sent, accepted in [("doubled", True), ("rfc", True), ("other", False)]:
        exchange = SaslExchange("SCRAM-SHA-256", cache=ScramCache())
        bare = "n=alice,r=CLIENTNONCE"
        server_first = exchange.respond(f"n,,{bare}".encode(), PASSWORD).decode()
        combined = dict(p.split("=", 1) for p in server_first.split(","))["r"]
        nonce = {"doubled": "CLIENTNONCE" + combined, "rfc": combined,
                 "other": "CLIENTNONCE" + combined + "x"}[sent]
        final = _scram_client_final("SCRAM-SHA-256", PASSWORD, bare, server_first, nonce)
        if accepted:
            exchange.respond(final)
            assert exchange.principal == "user:alice", sent
        else:
            with pytest.raises(SaslAuthenticationFailedError):
                exchange.respond(final)
