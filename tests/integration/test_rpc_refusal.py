"""A server built with `refuse_bad_signatures` (the coordinator's) answers a message signed
with another secret with the refusal frame, and the client fails at once with
SecretRejectedError; a default server stays silent (the client waits out its deadline)."""

from __future__ import annotations

import asyncio

import pytest

from querylib.rpc import (
    DeadlineExceededError,
    Ping,
    Pong,
    RpcClient,
    RpcServer,
    SecretRejectedError,
)

SECRET = b"the cluster secret, 32 bytes ok!"
OTHER = b"not the cluster secret at all!!!"


async def _serve(refuse: bool) -> RpcServer:
    server = RpcServer(SECRET, refuse_bad_signatures=refuse)
    await server.start("tcp://127.0.0.1:0")
    return server


def test_refusing_server_fails_a_wrong_secret_at_once() -> None:
    async def test() -> None:
        server = await _serve(refuse=True)
        try:
            async with RpcClient(server.endpoint, OTHER) as stranger:
                calls = [stranger.request(Ping(b"%d" % n), timeout=60) for n in range(3)]
                for outcome in await asyncio.gather(*calls, return_exceptions=True):
                    assert isinstance(outcome, SecretRejectedError), outcome
                assert stranger.in_flight == 0 and stranger.counters["refused"] >= 1
            async with RpcClient(server.endpoint, SECRET) as member:
                assert await member.request(Ping(b"ok"), timeout=10) == Pong(b"ok")
            assert server.counters == {"bad_signature": 3}
        finally:
            await server.close()
    asyncio.run(test())


def test_default_server_stays_silent_to_a_wrong_secret() -> None:
    async def test() -> None:
        server = await _serve(refuse=False)
        try:
            async with RpcClient(server.endpoint, OTHER) as stranger:
                with pytest.raises(DeadlineExceededError):
                    await stranger.request(Ping(), timeout=0.3)
                assert "refused" not in stranger.counters
        finally:
            await server.close()
    asyncio.run(test())
