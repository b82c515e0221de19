"""CURVE keys derive from tq keys (DESIGN §2 "Handshake"): a keyring maps a client's public
key to the principal whose key gives it, only while that principal holds that key."""

from __future__ import annotations

import asyncio

from querylib.rpc import (
    BROKER,
    MasterKeyring,
    audience_key,
    client_keypair,
    curve_public,
    principal_key,
    server_keypair,
)
from tests.querylib.rpc._support import SECRET


def test_a_master_keyring_knows_the_curve_keys_of_its_principals_now() -> None:
    generations = {"admin": 0, "user:alice": 0}
    keys = MasterKeyring(SECRET, audience=BROKER, valid=generations.get,
                         principals=lambda: list(generations))

    def public(principal: str, generation: int) -> bytes:
        return curve_public(audience_key(principal_key(SECRET, principal, generation),
                                         BROKER))

    async def whose(key: bytes) -> str | None:
        return await keys.principal_of_curve(key)

    old = public("user:alice", 0)
    assert asyncio.run(whose(old)) == "user:alice"
    assert asyncio.run(whose(public("admin", 0))) == "admin"
    assert asyncio.run(whose(public("user:bob", 0))) is None  # not a principal here
    generations["user:alice"] = 1  # rotated: the old key stops, the new one works
    assert asyncio.run(whose(old)) is None
    assert asyncio.run(whose(public("user:alice", 1))) == "user:alice"
    del generations["user:alice"]  # removed
    assert asyncio.run(whose(public("user:alice", 1))) is None


def test_keypairs_are_one_way_and_apart() -> None:
    key = audience_key(SECRET, BROKER)
    public, secret = client_keypair(key)
    assert len(public) == len(secret) == 40 and public == curve_public(key)
    assert key.hex().encode() not in secret and client_keypair(SECRET) != (public, secret)
    assert server_keypair(SECRET, BROKER) != server_keypair(SECRET, "coordinator")
    assert server_keypair(SECRET, BROKER)[1] != client_keypair(SECRET)[1]
