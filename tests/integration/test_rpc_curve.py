"""Links between hosts are encrypted and authenticated with CurveZMQ (DESIGN §2 "Handshake",
§12): a server bound where other hosts reach it, or forced, is a CURVE server; a client given
its public key connects with the CURVE keypair derived from its own key, which the server's
keyring maps to a principal. A relay between them sees neither the principal nor a message's
content (it sees both over PLAIN); a client with a wrong server key, or a key no principal
holds, never gets to send a frame."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from querylib.rpc import (
    BROKER,
    Codec,
    Credential,
    DeadlineExceededError,
    MasterKeyring,
    Ping,
    Pong,
    RemoteKeyring,
    RpcClient,
    RpcServer,
    SecretRejectedError,
    audience_key,
    client_keypair,
    coordinator_public_key,
    leaves_host,
    principal_key,
    server_keypair,
)
from tests.conftest import wait_for
from tests.querylib.rpc._support import SECRET

OTHER = b"not the cluster secret at all!!!"
ALICE = Credential("user:alice", principal_key(SECRET, "user:alice"))
VALUE = b"the-record-value-7f3a9c"


class Relay:
    """A TCP relay on loopback that records every byte each way."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.seen = bytearray()
        self.port = 0
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return f"tcp://127.0.0.1:{self.port}"

    async def _accept(self, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(source, sink))
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while data := await source.read(65536):
                self.seen += data
                sink.write(data)
                await sink.drain()
        except ConnectionError:
            pass
        finally:
            sink.close()

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._pipes):
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)
        await self._server.wait_closed()


@contextlib.asynccontextmanager
async def server_behind_relay(curve: bool) -> AsyncIterator[tuple[RpcServer, str]]:
    keyring = MasterKeyring(SECRET, principals=lambda: ("admin", ALICE.principal))
    server = RpcServer(keyring, curve=curve)
    endpoint = await server.start("tcp://127.0.0.1:0")
    relay = Relay(int(endpoint.rsplit(":", 1)[1]))
    try:
        yield server, await relay.start()
    finally:
        await relay.close()
        await server.close()
        server.relay_seen = bytes(relay.seen)  # type: ignore[attr-defined]


def test_a_curve_link_hides_the_principal_and_the_content_plain_does_not() -> None:
    async def exchange(curve: bool) -> bytes:
        async with server_behind_relay(curve) as (server, address):
            assert bool(server.public_key) == curve
            async with RpcClient(address, ALICE, server_key=server.public_key or None) as c:
                assert await c.request(Ping(VALUE), timeout=20) == Pong(VALUE)
        return server.relay_seen  # type: ignore[attr-defined,no-any-return]

    async def test() -> None:
        plain, curve = await exchange(False), await exchange(True)
        assert VALUE in plain and ALICE.principal.encode() in plain
        assert len(curve) > len(VALUE)
        assert VALUE not in curve and ALICE.principal.encode() not in curve
        assert b"CURVE" in curve  # the greeting says which mechanism
    asyncio.run(test())


def monitored(sock: zmq.Socket[zmq.Socket[object]]) -> zmq.Socket[zmq.Socket[object]]:
    return sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED
                                   | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                                   | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                                   | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)


def test_a_stranger_key_or_a_wrong_server_key_never_reaches_the_server() -> None:
    """A raw CURVE client with a key no principal holds is refused (400); one that names
    another server's key fails its handshake; neither gets a frame to the codec, even one
    signed with the cluster secret."""
    async def test() -> None:
        server = RpcServer(SECRET, curve=True)
        endpoint = await server.start("tcp://127.0.0.1:0")
        try:
            insider = Codec(SECRET, role="client")
            admin_key = audience_key(SECRET, "coordinator")
            for client_key, server_key, refused in (
                    (client_keypair(OTHER), server.public_key.encode(), True),
                    (client_keypair(admin_key), server_keypair(OTHER, "coordinator")[0],
                     False)):
                sock = zmq.Context.instance().socket(zmq.DEALER)
                sock.setsockopt(zmq.LINGER, 0)
                sock.setsockopt(zmq.CURVE_SERVERKEY, server_key)
                sock.setsockopt(zmq.CURVE_PUBLICKEY, client_key[0])
                sock.setsockopt(zmq.CURVE_SECRETKEY, client_key[1])
                monitor = monitored(sock)
                sock.connect(endpoint)
                try:
                    for frames in (insider.request(1, Ping(b"in"), ttl=5.0, now=time.time()),
                                   [b"garbage"] * 3):
                        with contextlib.suppress(zmq.Again):
                            sock.send_multipart(frames, flags=zmq.NOBLOCK)
                    assert await asyncio.to_thread(monitor.poll, 10_000)
                    event = recv_monitor_message(monitor)
                    if refused:
                        assert (event["event"], event["value"]) == (
                            zmq.EVENT_HANDSHAKE_FAILED_AUTH, 400)
                    else:
                        assert event["event"] != zmq.EVENT_HANDSHAKE_SUCCEEDED
                    assert not await asyncio.to_thread(sock.poll, 200)
                finally:
                    sock.disable_monitor()
                    monitor.close(0)
                    sock.close(0)
            assert server.counters == {"handshake_refused": 1}
            async with RpcClient(endpoint, SECRET, server_key=server.public_key) as admin:
                assert await admin.request(Ping(b"ok"), timeout=20) == Pong(b"ok")
            assert server.counters == {"handshake_refused": 1}
        finally:
            await server.close()
    asyncio.run(test())


def test_rpc_clients_refused_over_curve_fail_their_calls() -> None:
    """An RpcClient whose key the server's keyring does not know fails at once
    (SecretRejectedError); one with the wrong server key never gets in: the server cannot
    read its hello and drops the connection, which the client cannot tell from a server
    away, so its call runs out (DeadlineExceededError)."""
    async def test() -> None:
        server = RpcServer(SECRET, curve=True)
        endpoint = await server.start("tcp://127.0.0.1:0")
        try:
            async with RpcClient(endpoint, OTHER, server_key=server.public_key) as stranger:
                with pytest.raises(SecretRejectedError):
                    await stranger.request(Ping(b"x"), timeout=20)
            wrong = coordinator_public_key(OTHER)
            async with RpcClient(endpoint, SECRET, server_key=wrong) as lost:
                with pytest.raises(DeadlineExceededError):
                    await lost.request(Ping(b"x"), timeout=2)
            assert server.counters == {"handshake_refused": 1}
            assert coordinator_public_key(SECRET) == server.public_key
        finally:
            await server.close()
    asyncio.run(test())


def test_a_remote_keyring_learns_whose_curve_key_it_is() -> None:
    """An executor's broker (RemoteKeyring) asks who holds a CURVE key (`fetch_curve`, the
    coordinator answers); its own principal it knows."""
    asked: list[bytes] = []
    alice_key = audience_key(ALICE.key, BROKER)

    async def fetch(principal: str) -> bytes | None:
        return alice_key if principal == ALICE.principal else None

    async def fetch_curve(public: bytes) -> tuple[str, bytes] | None:
        asked.append(public)
        return (ALICE.principal, alice_key) if public == client_keypair(alice_key)[0] else None

    async def test() -> None:
        executor = Credential("executor:h1", principal_key(SECRET, "executor:h1"))
        keys = RemoteKeyring(fetch, fetch_curve=fetch_curve)
        keys.pin(executor.principal, executor.for_audience(BROKER).key)
        server = RpcServer(keys, curve=True, server_key=executor.key)
        endpoint = await server.start("tcp://127.0.0.1:0")
        try:
            for credential in (executor, ALICE):
                async with RpcClient(endpoint, credential, audience=BROKER,
                                     server_key=server.public_key) as client:
                    assert await client.request(Ping(b"x"), timeout=20) == Pong(b"x")
            assert asked == [client_keypair(alice_key)[0]]
            async with RpcClient(endpoint, OTHER, audience=BROKER,
                                 server_key=server.public_key) as stranger:
                with pytest.raises(SecretRejectedError):
                    await stranger.request(Ping(b"x"), timeout=20)
            wait_for(lambda: len(asked) == 2, what="the stranger's key asked about")
        finally:
            await server.close()
    asyncio.run(test())


@pytest.mark.parametrize(("endpoint", "leaves"), [
    ("tcp://127.0.0.1:5", False), ("tcp://[::1]:5", False), ("tcp://localhost:5", False),
    ("tcp://0.0.0.0:5", True), ("tcp://*:5", True), ("tcp://10.1.2.3:5", True),
    ("tcp://example.org:5", True), ("inproc://x", False), ("ipc:///tmp/x", False)])
def test_which_servers_are_curve_servers(endpoint: str, leaves: bool) -> None:
    assert leaves_host(endpoint) is leaves


def test_a_server_bound_beyond_loopback_is_a_curve_server() -> None:
    async def test() -> None:
        server = RpcServer(SECRET)
        endpoint = await server.start("tcp://0.0.0.0:0")
        try:
            assert server.public_key == coordinator_public_key(SECRET)
            port = endpoint.rsplit(":", 1)[1]
            async with RpcClient(f"tcp://127.0.0.1:{port}", SECRET,
                                 server_key=server.public_key) as admin:
                assert await admin.request(Ping(b"ok"), timeout=20) == Pong(b"ok")
        finally:
            await server.close()
    asyncio.run(test())
