"""Peers are authenticated when they connect (DESIGN §2 "Handshake", §12): a server takes only
peers whose PLAIN credential (principal, token derived from the key they sign with) its
keyring checks, through the one ZAP handler of its zmq context. A peer without one never gets
to send a frame; a key a RemoteKeyring must fetch is fetched during the handshake, so the
first connection gets in; servers of one process each check their own keyring."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from querylib.rpc import (
    BROKER,
    BlockingClient,
    Codec,
    Credential,
    DeadlineExceededError,
    MasterKeyring,
    PeerUnreachableError,
    Ping,
    Pong,
    RemoteKeyring,
    RpcClient,
    RpcServer,
    SecretRejectedError,
    audience_key,
    handshake_token,
    principal_key,
)
from tests.conftest import wait_for
from tests.querylib.rpc._support import SECRET, ServerThread

OTHER = b"not the cluster secret at all!!!"
ZAP_ENDPOINT = "inproc://zeromq.zap.01"
HANDSHAKE_EVENTS = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)


@contextmanager
def raw_dealer(endpoint: str, principal: str | None = None,
               token: bytes = b"") -> Iterator[tuple[zmq.Socket[Any], zmq.Socket[Any]]]:
    """A bare DEALER (PLAIN with `principal` and `token`, else ZeroMQ's NULL mechanism) and
    the monitor of its handshakes, connected to `endpoint`."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if principal is not None:
        sock.setsockopt(zmq.PLAIN_USERNAME, principal.encode())
        sock.setsockopt(zmq.PLAIN_PASSWORD, token)
    monitor = sock.get_monitor_socket(HANDSHAKE_EVENTS)
    sock.connect(endpoint)
    try:
        yield sock, monitor
    finally:
        sock.disable_monitor()
        monitor.close(0)
        sock.close(0)


def offer(sock: zmq.Socket[Any], frames: list[bytes]) -> None:
    """Send if the socket has somewhere to send now: after a refused handshake it may have no
    connection left, and a blocking send would wait for one forever (nothing would reach the
    server either way)."""
    try:
        sock.send_multipart(frames, flags=zmq.NOBLOCK)
    except zmq.Again:
        pass


def first_handshake(monitor: zmq.Socket[Any]) -> tuple[int, int]:
    """(event, value) of the connection's first handshake outcome."""
    assert monitor.poll(10_000), "no handshake outcome within 10 s"
    event = recv_monitor_message(monitor)
    return event["event"], event["value"]


def test_a_peer_without_a_credential_never_reaches_the_server() -> None:
    """NULL mechanism, a made-up token for a real principal, an unknown principal: each is
    stopped at the handshake, so even a message signed with the cluster secret (an insider's,
    replayed by a stranger) and garbage never reach the codec."""
    insider = Codec(SECRET, role="client")
    with ServerThread() as server, BlockingClient(server.endpoint, SECRET) as member:
        for principal, token, expected in (
                (None, b"", (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, None)),
                ("admin", b"0" * 64, (zmq.EVENT_HANDSHAKE_FAILED_AUTH, 400)),
                ("user:nobody", handshake_token(audience_key(OTHER, "coordinator")),
                 (zmq.EVENT_HANDSHAKE_FAILED_AUTH, 400))):
            with raw_dealer(server.endpoint, principal, token) as (sock, monitor):
                offer(sock, insider.request(1, Ping(b"in"), ttl=5.0, now=time.time()))
                offer(sock, [b"garbage"] * 3)
                event, value = first_handshake(monitor)
                assert event == expected[0], (principal, event, value)
                assert expected[1] is None or value == expected[1]
                assert not sock.poll(200)  # nothing answered
        assert member.request(Ping(b"ok"), timeout=10) == Pong(b"ok")
        assert server.counters() == {"handshake_refused": 2}


def test_a_peer_with_its_credential_gets_in_and_its_garbage_reaches_the_codec() -> None:
    """The handshake admits; the codec still judges every message (MACs stay)."""
    with ServerThread() as server, \
            raw_dealer(server.endpoint, "admin",
                       handshake_token(audience_key(SECRET, "coordinator"))) as (sock, monitor):
        assert first_handshake(monitor) == (zmq.EVENT_HANDSHAKE_SUCCEEDED, 0)
        sock.send_multipart([b"garbage"] * 3)
        outsider = Codec(OTHER, role="client")  # signed with another key, admitted peer
        sock.send_multipart(outsider.request(1, Ping(b"x"), ttl=5.0, now=time.time()))
        wait_for(lambda: sum(server.counters().values()) == 2, what="both counted")
        assert server.counters() == {"unsigned": 1, "bad_signature": 1}
        insider = Codec(SECRET, role="client")
        sock.send_multipart(insider.request(1, Ping(b"in"), ttl=5.0, now=time.time()))
        assert sock.poll(10_000)
        assert insider.decode(sock.recv_multipart(), time.time()).body == Pong(b"in")


def test_a_client_refused_at_the_handshake_fails_at_once() -> None:
    """Any server refuses a credential its keyring does not check (the coordinator's did so
    with an unsigned frame before; brokers stayed silent): every call in flight, and every
    call while refused, fails with SecretRejectedError, and nothing reached the codec."""
    async def test() -> None:
        server = RpcServer(SECRET)
        await server.start("tcp://127.0.0.1:0")
        try:
            async with RpcClient(server.endpoint, OTHER) as stranger:
                calls = [stranger.request(Ping(b"%d" % n), timeout=20) for n in range(3)]
                for outcome in await asyncio.gather(*calls, return_exceptions=True):
                    assert isinstance(outcome, SecretRejectedError), outcome
                    assert "admin" in str(outcome)
                assert stranger.in_flight == 0 and stranger.counters["refused"] >= 1
                with pytest.raises(SecretRejectedError):
                    await stranger.request(Ping(b"again"), timeout=20)
            async with RpcClient(server.endpoint, SECRET) as member:
                assert await member.request(Ping(b"ok"), timeout=10) == Pong(b"ok")
            assert set(server.counters) == {"handshake_refused"}
        finally:
            await server.close()
    asyncio.run(test())


def test_a_refused_client_gets_in_once_its_credential_is_valid() -> None:
    """A refusal is the server's word now; the client tries again (backing off) and gets in
    once the server knows its principal."""
    generations: dict[str, int] = {}
    keyring = MasterKeyring(SECRET, valid=generations.get)
    bob = Credential("user:bob", principal_key(SECRET, "user:bob"))
    with ServerThread(keyring) as server, BlockingClient(server.endpoint, bob) as client:
        with pytest.raises(SecretRejectedError, match="user:bob"):
            client.request(Ping(b"1"), timeout=20)
        generations["user:bob"] = 0

        def answered() -> bool:
            try:
                return client.request(Ping(b"2"), timeout=20) == Pong(b"2")
            except SecretRejectedError:
                return False
        wait_for(answered, timeout=30, what="bob admitted")
        assert server.counters()["handshake_refused"] >= 1


class Keys:
    """What a coordinator would answer a RemoteKeyring: broker keys by principal."""

    def __init__(self, **generations: int) -> None:
        self.generations = dict(generations)
        self.asked: list[str] = []

        self.away = False  # the coordinator cannot be asked

    def credential(self, principal: str) -> Credential:
        return Credential(principal, principal_key(SECRET, principal,
                                                   self.generations[principal]))

    async def fetch(self, principal: str) -> bytes | None:
        self.asked.append(principal)
        await asyncio.sleep(0.05)  # a round trip to the coordinator
        if self.away:
            raise PeerUnreachableError("no coordinator session to ask")
        generation = self.generations.get(principal)
        return None if generation is None else audience_key(
            principal_key(SECRET, principal, generation), BROKER)


def test_a_remote_keyring_fetches_a_key_during_the_handshake() -> None:
    """The first connection of a principal the broker does not know yet waits in the
    handshake for the key, and gets in: no refusal, no reconnect. A principal the coordinator
    says does not exist is refused at once (a removed user's client learns so, rather than
    retrying for ever); only while the coordinator cannot be asked is a principal neither
    admitted nor refused: its client waits."""
    keys = Keys(**{"user:alice": 0})
    with ServerThread(RemoteKeyring(keys.fetch, audience=BROKER)) as server:
        with BlockingClient(server.endpoint, keys.credential("user:alice"),
                            audience=BROKER) as alice:
            assert alice.request(Ping(b"a"), timeout=20) == Pong(b"a")
            assert alice.counters == {}
        assert keys.asked == ["user:alice"] and server.counters() == {}
        mallory = Credential("user:mallory", principal_key(SECRET, "user:mallory"))
        with BlockingClient(server.endpoint, mallory, audience=BROKER) as stranger:
            with pytest.raises(SecretRejectedError):
                stranger.request(Ping(b"m"), timeout=20)
        assert server.counters() == {"handshake_refused": 1}
        keys.away = True
        bob = Credential("user:bob", principal_key(SECRET, "user:bob"))
        with BlockingClient(server.endpoint, bob, audience=BROKER) as unknown:
            with pytest.raises(DeadlineExceededError):
                unknown.request(Ping(b"b"), timeout=1)
        assert server.counters() == {"handshake_refused": 1, "handshake_deferred": 1}


def test_a_rotated_key_replaces_the_one_a_remote_keyring_cached() -> None:
    """A token that does not match a cached key makes the keyring ask again (at most once
    per interval), so a rotated credential works at once; a wrong one is refused."""
    keys = Keys(**{"user:alice": 0})
    now = [1000.0]
    keyring = RemoteKeyring(keys.fetch, audience=BROKER, clock=lambda: now[0])
    with ServerThread(keyring) as server:
        with BlockingClient(server.endpoint, keys.credential("user:alice"),
                            audience=BROKER) as alice:
            assert alice.request(Ping(b"0"), timeout=20) == Pong(b"0")
        keys.generations["user:alice"] = 1
        now[0] += 10  # the cached key is older than the interval
        with BlockingClient(server.endpoint, keys.credential("user:alice"),
                            audience=BROKER) as rotated:
            assert rotated.request(Ping(b"1"), timeout=20) == Pong(b"1")
        assert keys.asked == ["user:alice", "user:alice"]
        forged = Credential("user:alice", principal_key(SECRET, "user:alice", 7))
        with BlockingClient(server.endpoint, forged, audience=BROKER) as liar, \
                pytest.raises(SecretRejectedError):
            liar.request(Ping(b"2"), timeout=20)
        assert len(keys.asked) == 2  # the key was fresh: not asked for again


def test_servers_of_one_process_each_check_their_own_keyring() -> None:
    """Two servers of two clusters, on two event loops of one process, share the context's
    one ZAP handler; each admits its own cluster's clients and refuses the other's."""
    with ServerThread(SECRET) as ours, ServerThread(OTHER) as theirs:
        for server, member, stranger in ((ours, SECRET, OTHER), (theirs, OTHER, SECRET)):
            with BlockingClient(server.endpoint, member) as client:
                assert client.request(Ping(b"m"), timeout=20) == Pong(b"m")
            with BlockingClient(server.endpoint, stranger) as client, \
                    pytest.raises(SecretRejectedError):
                client.request(Ping(b"s"), timeout=20)


def test_the_handshake_handler_lives_as_long_as_a_server_of_its_context() -> None:
    """The ZAP handler of a context is bound while a server of that context serves and gone
    with the last one, so the context terminates (an open socket would hold it forever)."""
    context: zmq.Context[Any] = zmq.Context()

    def zap_bound() -> bool:
        probe = context.socket(zmq.ROUTER)
        try:
            probe.bind(ZAP_ENDPOINT)
        except zmq.ZMQError:
            return True
        else:
            # Released at once (a closed socket's endpoint is released later, by zmq's
            # reaper: the next server's handler could not bind it yet).
            probe.unbind(ZAP_ENDPOINT)
        finally:
            probe.close(0)
        return False

    async def serve() -> None:
        first = RpcServer(SECRET, context=context)
        second = RpcServer(SECRET, context=context)
        await first.start("tcp://127.0.0.1:0")
        await second.start("tcp://127.0.0.1:0")
        try:
            assert zap_bound()
            async with RpcClient(second.endpoint, SECRET, context=context) as client:
                assert await client.request(Ping(b"x"), timeout=20) == Pong(b"x")
            await first.close()
            assert zap_bound()
            async with RpcClient(second.endpoint, SECRET, context=context) as client:
                assert await client.request(Ping(b"y"), timeout=20) == Pong(b"y")
        finally:
            await first.close()
            await second.close()
        assert not zap_bound()

    try:
        for _ in range(2):  # and a later server of the context gets a handler again
            asyncio.run(serve())
    finally:
        terminated = threading.Thread(target=context.term, daemon=True)
        terminated.start()
        terminated.join(30)
    assert not terminated.is_alive(), "a socket of the context was left open"
