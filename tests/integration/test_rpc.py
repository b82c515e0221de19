"""RPC over real ZeroMQ sockets on 127.0.0.1: the asyncio server and client together."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq

from catalog.errors import UserError
from querylib.rpc import (
    AddressError,
    ClientClosedError,
    Codec,
    ConnectionLostError,
    DeadlineExceededError,
    Entry,
    InternalServerError,
    Kind,
    Limits,
    PeerBusyError,
    PeerUnreachableError,
    Ping,
    Pong,
    RemoteError,
    RpcClient,
    RpcServer,
    SecretRejectedError,
    ServerBusyError,
    Signer,
    UnsupportedRequestError,
    payload_digest,
)
from querylib.rpc._codec import envelope, open_envelope
from tests.conftest import wait_for_async
from tests.querylib.rpc._support import (
    SECRET,
    Credit,
    Delivery,
    Fetch,
    FetchReply,
    Handlers,
    ShelfEmptyError,
    ShelfLockedError,
    Subscribe,
    Unserved,
    authenticate,
)

TEST_TIMEOUT = 30.0


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), TEST_TIMEOUT))


@asynccontextmanager
async def served(limits: Limits | None = None,
                 ) -> AsyncIterator[tuple[RpcServer, RpcClient, Handlers]]:
    handlers = Handlers()
    server = RpcServer(SECRET, limits=limits)
    handlers.install(server)
    await server.start("tcp://127.0.0.1:0")
    assert server.endpoint is not None
    client = RpcClient(server.endpoint, SECRET, limits=limits, timeout=10.0)
    await client.connect()
    try:
        yield server, client, handlers
    finally:
        await client.close()
        await server.close()


def test_ping_and_the_bound_endpoint() -> None:
    async def test() -> None:
        async with served() as (server, client, _):
            assert server.endpoint.startswith("tcp://127.0.0.1:")
            assert not server.endpoint.endswith(":0")
            assert await client.request(Ping(b"hello")) == Pong(b"hello")
            assert server.counters == {} and client.counters == {}
    run(test)


def test_many_requests_in_flight_answered_out_of_order() -> None:
    async def test() -> None:
        async with served() as (_, client, handlers):
            count = 60
            for token in range(count):
                handlers.gate(token)
            completed: list[int] = []

            async def call(token: int) -> None:
                reply = await client.request(Fetch(token))
                assert reply == FetchReply(token)
                completed.append(token)

            calls = [asyncio.create_task(call(token)) for token in range(count)]
            await wait_for_async(lambda: len(handlers.started) == count,
                                 what="all requests in flight")
            # Release in reverse order, one at a time: each reply must reach its own caller.
            for token in reversed(range(count)):
                handlers.gates[token].set()
                await wait_for_async(lambda t=token: t in completed, what=f"reply {token}")
            await asyncio.gather(*calls)
            assert completed == list(reversed(range(count)))
    run(test)


def test_deadline_expires_and_server_cancels_the_handler() -> None:
    async def test() -> None:
        async with served() as (server, client, handlers):
            handlers.gate(1)  # never opened
            with pytest.raises(DeadlineExceededError, match="test.fetch") as info:
                await client.request(Fetch(1), timeout=0.2)
            assert info.value.retriable
            await wait_for_async(lambda: server.counters.get("handler_deadline") == 1,
                                 what="the server cancelled the handler at the deadline")
            # Other calls, with and without deadlines, are unaffected.
            assert await client.request(Fetch(2)) == FetchReply(2)
    run(test)


def test_deadlines_expire_independently_earliest_first() -> None:
    async def test() -> None:
        async with served() as (_, client, handlers):
            for token in range(5):
                handlers.gate(token)
            order: list[int] = []

            async def call(token: int, timeout: float) -> None:
                with pytest.raises(DeadlineExceededError):
                    await client.request(Fetch(token), timeout=timeout)
                order.append(token)

            await asyncio.gather(*(call(t, 0.1 + 0.1 * (4 - t)) for t in range(5)))
            assert order == [4, 3, 2, 1, 0]
            assert client.in_flight == 0
    run(test)


def test_typed_remote_errors() -> None:
    async def test() -> None:
        async with served() as (_, client, _handlers):
            with pytest.raises(ShelfEmptyError, match="shelf 1 is empty") as empty:
                await client.request(Fetch(1, fail="empty"))
            assert empty.value.retriable and empty.value.kafka_error_code == 3
            with pytest.raises(ShelfLockedError, match="locked by alice"):
                await client.request(Fetch(2, fail="locked"))
            # A TqError outside Fetch's declared ShelfError: a RemoteError naming it.
            with pytest.raises(RemoteError) as user:
                await client.request(Fetch(3, fail="user"))
            assert user.value.remote_type == "catalog.errors.UserError"
            assert user.value.kafka_error_code == UserError.kafka_error_code
            with pytest.raises(RemoteError) as far:
                await client.request(Fetch(4, fail="remote"))
            assert far.value.remote_type == "elsewhere.FarError"
            assert far.value.retriable and far.value.kafka_error_code == 77
            with pytest.raises(InternalServerError, match="ZeroDivisionError"):
                await client.request(Fetch(5, fail="bug"))
            with pytest.raises(InternalServerError, match="WrongReply"):
                await client.request(Fetch(6, fail="wrong_reply"))
            with pytest.raises(UnsupportedRequestError):
                await client.request(Unserved())
            assert await client.request(Fetch(7)) == FetchReply(7)
    run(test)


def test_payload_frames_round_trip_unchanged() -> None:
    async def test() -> None:
        async with served() as (_, client, _handlers):
            big = bytes(range(256)) * 4096  # 1 MiB, sent without a copy
            payload = [b"", b"\x00", bytearray(b"mutable"), memoryview(big)[10:100_010], big]
            reply, back = await client.exchange(Ping(b"p"), payload=payload)
            assert reply == Pong(b"p")
            assert [bytes(frame) for frame in back] == [bytes(frame) for frame in payload]
            reply, back = await client.exchange(Fetch(1), payload=[b"batch"] * 10)
            assert reply == FetchReply(1) and [bytes(f) for f in back] == [b"batch"] * 10
    run(test)


def test_server_pushes_notifies_to_the_client() -> None:
    async def test() -> None:
        async with served() as (_, client, _handlers):
            assert await client.request(Subscribe(5)) == Subscribe.reply_type(5)
            notes = [await client.notifications.get() for _ in range(5)]
            assert [n.message for n in notes] == [Delivery(seq) for seq in range(5)]
            assert [bytes(n.payload[0]) for n in notes] == [
                seq.to_bytes(4, "big") * 100 for seq in range(5)]
            # With a callback, notifies of that type go to it instead of the queue.
            seen: list[int] = []
            client.on_notify(Delivery, lambda note: seen.append(note.message.seq))
            await client.request(Subscribe(3))
            await wait_for_async(lambda: seen == [0, 1, 2], what="callback deliveries")
            assert client.notifications.empty()
    run(test)


def test_client_notifies_reach_the_server_in_order() -> None:
    async def test() -> None:
        async with served() as (_, client, handlers):
            for amount in range(20):
                await client.notify(Credit(amount))
            await wait_for_async(lambda: len(handlers.credits) == 20, what="all credits")
            assert handlers.credits == [(amount, client.session) for amount in range(20)]
    run(test)


def test_a_push_sends_the_replies_held_for_its_own_client_only() -> None:
    """A push first sends the replies held (until the loop turn ends) for the client it goes
    to, so that client sees them in order; replies held for other clients stay held, and go
    with the turn's others: a probe's delivery waits for no bulk producer's replies."""
    async def test() -> None:
        async with served() as (server, first, _handlers):
            assert server.endpoint is not None
            second = RpcClient(server.endpoint, SECRET, timeout=10.0)
            await second.connect()
            try:
                for client in (first, second):
                    assert await client.request(Ping(b"1")) == Pong(b"1")
                peer_of = {session: peer for peer, session in server._peers.items()}
                one, two = peer_of[first.session], peer_of[second.session]
                codec = server._codec
                server._queue_reply(one, first.session, codec.reply_entry(10**9, Pong(b"7")))
                server._queue_reply(two, second.session, codec.reply_entry(10**9, Pong(b"8")))
                server.notify(two, Delivery(1))
                assert {peer: list(held) for peer, held in server._replies.items()} == {
                    one: [first.session]}
                note = await second.notifications.get()
                assert note.message == Delivery(1)
                await wait_for_async(lambda: not server._replies, what="the turn's replies")
            finally:
                await second.close()
    run(test)


def test_notify_queue_overflow_is_counted() -> None:
    async def test() -> None:
        async with served(Limits(notify_queue=3)) as (_, client, _handlers):
            await client.request(Subscribe(5))
            await wait_for_async(lambda: client.counters.get("notify_overflow") == 2,
                                 what="2 dropped")
            assert client.notifications.qsize() == 3
    run(test)


def test_notify_to_an_unknown_peer_fails() -> None:
    async def test() -> None:
        async with served() as (server, _client, _handlers):
            with pytest.raises(PeerUnreachableError):
                server.notify(b"\x00nobody", Delivery(1))
    run(test)


def test_server_busy_beyond_its_handler_limit() -> None:
    async def test() -> None:
        async with served(Limits(max_handlers=2)) as (server, client, handlers):
            handlers.gate(1)
            handlers.gate(2)
            held = [asyncio.create_task(client.request(Fetch(t))) for t in (1, 2)]
            await wait_for_async(lambda: handlers.started == {1, 2}, what="two handlers running")
            with pytest.raises(ServerBusyError) as info:
                await client.request(Fetch(3))
            assert info.value.retriable and server.counters["busy"] == 1
            handlers.gates[1].set()
            handlers.gates[2].set()
            await asyncio.gather(*held)
            assert await client.request(Fetch(3)) == FetchReply(3)
    run(test)


def test_closing_the_client_fails_calls_in_flight() -> None:
    async def test() -> None:
        async with served() as (_, client, handlers):
            handlers.gate(1)
            call = asyncio.create_task(client.request(Fetch(1)))
            await wait_for_async(lambda: 1 in handlers.started, what="request in flight")
            await client.close()
            with pytest.raises(ClientClosedError):
                await call
            with pytest.raises(ClientClosedError):
                await client.request(Ping())
    run(test)


def test_client_in_flight_limit_queues_callers() -> None:
    async def test() -> None:
        async with served(Limits(max_in_flight=2)) as (_, client, handlers):
            for token in range(6):
                handlers.gate(token)
            calls = [asyncio.create_task(client.request(Fetch(t))) for t in range(6)]
            await wait_for_async(lambda: len(handlers.started) == 2, what="two requests sent")
            for token in range(6):
                handlers.gate(token).set()
            assert [r.token for r in await asyncio.gather(*calls)] == list(range(6))
    run(test)


def test_wrong_secret_is_refused_at_the_handshake_and_counted() -> None:
    async def test() -> None:
        async with served() as (server, _client, _handlers):
            async with RpcClient(server.endpoint, b"not the cluster secret at all!!") as bad:
                with pytest.raises(SecretRejectedError):
                    await bad.request(Ping(), timeout=20)
            assert set(server.counters) == {"handshake_refused"}
    run(test)


def test_client_reconnects_to_a_restarted_server() -> None:
    async def test() -> None:
        # A port below the ephemeral range: the client's reconnect attempts to a port inside
        # it can be given that very port as their own source port (a TCP self-connect), which
        # then holds the address the restarted server needs.
        first = RpcServer(SECRET)
        endpoint = await first.start(f"tcp://127.0.0.1:{_port_below_ephemeral()}")
        async with RpcClient(endpoint, SECRET, timeout=10.0) as client:
            assert await client.request(Ping(b"1")) == Pong(b"1") and client.connected
            await first.close()
            # A request sent before the client hears of the drop may be lost with the
            # connection (ConnectionLostError); one sent after waits for the next server.
            await wait_for_async(lambda: not client.connected, what="the drop heard")
            second = await _start_again(endpoint)
            try:
                assert await client.request(Ping(b"2")) == Pong(b"2")
            finally:
                await second.close()
    run(test)


async def _start_again(endpoint: str, handlers: Handlers | None = None) -> RpcServer:
    """A new server on the endpoint a closed one held (with `handlers` installed)."""
    server = RpcServer(SECRET)
    if handlers is not None:
        handlers.install(server)
    deadline = time.monotonic() + 10
    while True:  # the old socket's close completes on zmq's I/O thread
        try:
            await server.start(endpoint)
            return server
        except AddressError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


def test_calls_in_flight_when_the_connection_drops_fail_at_once_as_lost() -> None:
    """A server gone (its process died, its socket closed) answers nothing: the calls it held
    fail when the connection drops, not at their deadlines, with ConnectionLostError (a
    passed deadline to callers: retriable, outcome unknown). Calls made afterwards wait for
    the next server and are answered by it."""
    async def test() -> None:
        handlers = Handlers()
        first = RpcServer(SECRET)
        handlers.install(first)
        endpoint = await first.start(f"tcp://127.0.0.1:{_port_below_ephemeral()}")
        async with RpcClient(endpoint, SECRET, timeout=10.0) as client:
            handlers.gate(1)
            handlers.gate(2)
            answers, on_answer = _answers()
            call = asyncio.create_task(client.request(Fetch(1), timeout=25))
            client.send_request(Fetch(2), on_answer, timeout=25)
            await wait_for_async(lambda: handlers.started == {1, 2}, what="both calls held")
            await first.close()
            with pytest.raises(ConnectionLostError, match="outcome is unknown") as info:
                await call
            assert isinstance(info.value, DeadlineExceededError) and info.value.retriable
            await wait_for_async(lambda: answers, what="the callback's answer")
            assert isinstance(answers[0][1], ConnectionLostError)
            assert client.in_flight == 0
            later = asyncio.create_task(client.request(Fetch(3), timeout=25))
            second = await _start_again(endpoint, handlers)
            try:
                assert await later == FetchReply(3)
            finally:
                await second.close()
    run(test)


def test_requests_queued_for_a_dropped_connection_never_reach_the_next_server() -> None:
    """What zmq still held for a connection that dropped (not yet written to it), and what
    the client held back for want of room, is discarded with it: those calls failed as lost,
    and must not be carried out by the next server as well (their callers send again)."""
    endpoint = f"tcp://127.0.0.1:{_port_below_ephemeral()}"

    async def test(server: subprocess.Popen[bytes]) -> None:
        async with RpcClient(endpoint, SECRET, timeout=10.0) as client:
            assert await client.request(Ping(b"up"), timeout=25) == Pong(b"up")
            # Stopped, it reads nothing: the requests fill the kernel's buffers, then zmq's
            # queue for the connection, then the client's backlog. Then it dies.
            server.send_signal(signal.SIGSTOP)
            answers, on_answer = _answers()
            for token in range(300):
                client.send_request(Fetch(token), on_answer, payload=[bytes(100_000)],
                                    timeout=25)
            server.kill()
            server.wait(10)
            await wait_for_async(lambda: len(answers) == 300, what="every call answered")
            assert {type(error) for _, error in answers} == {ConnectionLostError}
            handlers = Handlers()
            second = await _start_again(endpoint, handlers)
            try:
                assert await client.request(Fetch(1000), timeout=25) == FetchReply(1000)
                assert await client.request(Ping(b"x")) == Pong(b"x")
            finally:
                await second.close()
            assert handlers.arrived == [1000]

    with _server_process(endpoint) as server:
        run(lambda: test(server))


@contextmanager
def _server_process(*args: str) -> Iterator[subprocess.Popen[bytes]]:
    """An RpcServer with the test handlers in a process of its own (`_SERVER_PROCESS` with
    `args`), serving once this yields; killed after."""
    server = subprocess.Popen([sys.executable, "-c", _SERVER_PROCESS, *args],
                              cwd=Path(__file__).parents[2], stdout=subprocess.PIPE)
    try:
        assert server.stdout is not None and server.stdout.readline() == b"up\n"
        yield server
    finally:
        server.kill()
        server.wait(10)


_SERVER_PROCESS = """
import asyncio, os, sys
from querylib.rpc import RpcServer
from tests.querylib.rpc._support import SECRET, Fetch, Handlers

async def main():
    server = RpcServer(SECRET)
    handlers = Handlers()
    handlers.install(server)
    if len(sys.argv) > 2:  # answer that many Fetches, then crash a little later
        fetch, last = handlers.fetch, int(sys.argv[2])
        async def fetch_then_die(request, ctx):
            if len(handlers.arrived) == last - 1:
                asyncio.get_running_loop().call_later(0.3, os._exit, 0)
            return await fetch(request, ctx)
        server.register(Fetch, fetch_then_die)
    await server.start(sys.argv[1])
    print("up", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def test_replies_that_came_before_the_connection_dropped_answer_their_calls() -> None:
    """The server answered, then died, while the client's loop was busy: zmq holds the
    replies it received, and the drop is heard at the same time. The replies answer their
    calls first; only what is still unanswered fails as lost (sent again, an answered call
    would be carried out twice)."""
    endpoint = f"tcp://127.0.0.1:{_port_below_ephemeral()}"

    async def test(server: subprocess.Popen[bytes]) -> None:
        async with RpcClient(endpoint, SECRET, timeout=10.0) as client:
            await wait_for_async(lambda: client.connected, what="the connection up")
            answers, on_answer = _answers()
            for token in range(20):
                client.send_request(Fetch(token), on_answer, timeout=25)
            await asyncio.sleep(0)  # the requests go out at the end of this turn
            # Busy (blocked) while the server answers all 20 and then dies: zmq's I/O
            # thread takes in both meanwhile.
            server.wait(30)
            time.sleep(0.5)
            await wait_for_async(lambda: len(answers) == 20, what="every call answered")
            tokens = sorted(getattr(reply, "token", -1) for reply, _ in answers)
            assert tokens == list(range(20)), answers

    with _server_process(endpoint, "20") as server:
        run(lambda: test(server))


def _port_below_ephemeral() -> int:
    import random
    import socket

    for _ in range(200):
        port = random.randrange(20000, 32000)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free port below the ephemeral range")


def test_bad_addresses_are_user_errors() -> None:
    async def test() -> None:
        with pytest.raises(AddressError):
            await RpcServer(SECRET).start("tcp://not an address")
        async with RpcServer(SECRET) as server:
            with pytest.raises(AddressError):
                await RpcServer(SECRET).start(server.endpoint)  # in use
        with pytest.raises(AddressError):
            await RpcClient("nonsense://x", SECRET).connect()
    run(test)


def test_several_clients_interleave_requests_and_notifies() -> None:
    async def test() -> None:
        async with served() as (server, first, handlers):
            others = [RpcClient(server.endpoint, SECRET, timeout=20.0) for _ in range(3)]
            for client in others:
                await client.connect()
            clients = [first, *others]
            try:
                async def load(index: int, client: RpcClient) -> None:
                    for n in range(100):
                        token = index * 1000 + n
                        reply, payload = await client.exchange(Fetch(token),
                                                               payload=[b"%d" % token])
                        assert reply.token == token and bytes(payload[0]) == b"%d" % token
                        if n % 10 == 0:
                            await client.notify(Credit(token))
                            await client.request(Subscribe(2))

                await asyncio.gather(*(load(i, c) for i, c in enumerate(clients)
                                       for _ in range(5)))
                await wait_for_async(lambda: len(handlers.credits) == 4 * 5 * 10,
                                     what="every credit")
                for client in clients:
                    assert client.notifications.qsize() == 5 * 10 * 2
                    assert client.counters == {}
                assert server.counters == {}
            finally:
                for client in others:
                    await client.close()
    run(test)


def test_push_to_a_client_that_stops_reading_fails_fast() -> None:
    """A subscriber that stops reading costs the server a PeerBusyError, never a blocked loop."""
    async def test() -> None:
        async with served(Limits(hwm=4)) as (server, client, handlers):
            codec = Codec(SECRET, role="client")
            sleeper = authenticate(zmq.Context.instance().socket(zmq.DEALER), SECRET)
            sleeper.setsockopt(zmq.LINGER, 0)
            sleeper.setsockopt(zmq.RCVHWM, 4)
            sleeper.setsockopt(zmq.RCVBUF, 65536)
            sleeper.connect(server.endpoint)
            try:
                sleeper.send_multipart(codec.notify(Credit(1), now=time.time()))
                await wait_for_async(lambda: handlers.credits, what="the sleeper's notify arrived")
                assert handlers.credits == [(1, codec.session)]
                peer = handlers.peers[0]
                batch = b"b" * 100_000
                with pytest.raises(PeerBusyError) as info:
                    for _ in range(2000):  # bounded: zmq and TCP buffers fill long before
                        server.notify(peer, Delivery(0), payload=[batch])
                        await asyncio.sleep(0)
                assert info.value.retriable
                # Everyone else is still served.
                assert await client.request(Ping(b"still here")) == Pong(b"still here")
            finally:
                sleeper.close(0)
            # Once zmq has torn down the closed peer's (full) pipe, it is unreachable; until
            # then, on a loaded machine, it may still look busy.
            deadline = time.monotonic() + 30
            with pytest.raises(PeerUnreachableError):
                while time.monotonic() < deadline:
                    try:
                        server.notify(peer, Delivery(1))
                    except PeerBusyError:
                        pass
                    await asyncio.sleep(0.005)
    run(test)


def test_a_direct_handler_answers_as_a_task_would() -> None:
    """`register_direct`: the handler runs at once and returns a future of the reply; its
    errors (raised at once or through the future), a wrong reply type, its attached payload
    and its deadline are answered as a coroutine handler's are."""
    async def test() -> None:
        async with served() as (server, client, handlers):
            futures: list[asyncio.Future[Any]] = []

            def direct(request: Fetch, ctx: Any) -> asyncio.Future[Any]:
                if request.fail == "at_once":
                    raise ShelfEmptyError(f"shelf {request.token} is empty, said at once")
                if request.fail == "bug_at_once":
                    raise ZeroDivisionError("direct handler bug")
                future = asyncio.ensure_future(handlers.fetch(request, ctx))
                futures.append(future)
                return future

            server.register_direct(Fetch, direct)
            with pytest.raises(TypeError):
                server.register_direct(Fetch, handlers.fetch)  # a coroutine function
            reply, back = await client.exchange(Fetch(1), payload=[b"batch"])
            assert reply == FetchReply(1) and [bytes(f) for f in back] == [b"batch"]
            with pytest.raises(ShelfEmptyError, match="said at once"):
                await client.request(Fetch(2, fail="at_once"))
            with pytest.raises(ShelfEmptyError, match="shelf 3 is empty"):
                await client.request(Fetch(3, fail="empty"))
            with pytest.raises(InternalServerError, match="ZeroDivisionError"):
                await client.request(Fetch(4, fail="bug_at_once"))
            with pytest.raises(InternalServerError, match="ZeroDivisionError"):
                await client.request(Fetch(5, fail="bug"))
            with pytest.raises(InternalServerError, match="WrongReply"):
                await client.request(Fetch(6, fail="wrong_reply"))
            handlers.gate(7)  # never opened: the deadline cancels the handler's future
            with pytest.raises(DeadlineExceededError):
                await client.request(Fetch(7), timeout=0.2)
            await wait_for_async(lambda: server.counters.get("handler_deadline") == 1,
                                 what="the server cancelled the direct handler's future")
            assert futures[-1].cancelled()
            assert await client.request(Fetch(8)) == FetchReply(8)
            # Registering a coroutine handler again replaces the direct one.
            server.register(Fetch, handlers.fetch)
            assert await client.request(Fetch(9)) == FetchReply(9)
            assert len(futures) == 6  # 1, 3, 5, 6, 7, 8: the coroutine handler served 9
    run(test)


def test_a_direct_handler_answered_at_once_replies_in_order_and_is_counted() -> None:
    """A direct handler's future resolved when it returns is answered without a deadline to
    track or a task: its reply, its errors and a wrong reply type come back as a task's would,
    each counted in the server's stats; a notify the next request's handler pushes reaches
    the client after the reply sent before it (replies held for a burst keep their order)."""
    async def test() -> None:
        async with served() as (server, client, _handlers):
            loop = asyncio.get_running_loop()
            seen: list[tuple[int, int]] = []  # (delivery seq, requests in flight then)
            client.on_notify(Delivery, lambda note: seen.append(
                (note.message.seq, client.in_flight)))

            def direct(request: Fetch, ctx: Any) -> asyncio.Future[Any]:
                answered: asyncio.Future[Any] = loop.create_future()
                if request.fail == "empty":
                    answered.set_exception(ShelfEmptyError(f"shelf {request.token} is empty"))
                elif request.fail == "bug":
                    answered.set_exception(ZeroDivisionError("direct handler bug"))
                elif request.fail == "wrong_reply":
                    answered.set_result(Pong(b""))
                else:
                    if request.fail == "notify":
                        server.notify(ctx.peer, Delivery(request.token))
                    ctx.attach(*ctx.payload)
                    answered.set_result(FetchReply(request.token))
                return answered

            server.register_direct(Fetch, direct)
            reply, back = await client.exchange(Fetch(1), payload=[b"batch"])
            assert reply == FetchReply(1) and [bytes(f) for f in back] == [b"batch"]
            with pytest.raises(ShelfEmptyError, match="shelf 2 is empty"):
                await client.request(Fetch(2, fail="empty"))
            with pytest.raises(InternalServerError, match="ZeroDivisionError"):
                await client.request(Fetch(3, fail="bug"))
            with pytest.raises(InternalServerError, match="Pong"):
                await client.request(Fetch(4, fail="wrong_reply"))
            # Pipelined: 10's reply is sent before 11's handler pushes Delivery(11).
            replies = await asyncio.gather(client.request(Fetch(10)),
                                           client.request(Fetch(11, fail="notify")))
            assert replies == [FetchReply(10), FetchReply(11)]
            await wait_for_async(lambda: seen, what="the delivery")
            assert seen == [(11, 1)]  # 10 answered by then, 11 not yet
            stats = server.stats.types[Fetch.rpc_tag]
            assert stats.count == 6
            assert stats.errors == {"ShelfEmptyError": 1, "InternalServerError": 1}  # the bug
            assert not server._tasks  # nothing was left running
    run(test)


def test_a_request_answered_at_once_costs_the_server_one_loop_turn() -> None:
    """A request whose direct handler answers at once is answered within the loop turn that
    received it: its reply goes out as the receive burst ends, and the burst's sends are
    followed by one read of the socket's events then, not by a callback each in later turns
    (two more turns per request, each an epoll_wait and the loop's own work, about a tenth of
    a broker's CPU for a lone small batch). Every reply still arrives, in order."""
    from querylib.rpc import BlockingClient
    from tests.querylib.rpc._support import ServerThread

    with ServerThread() as thread:
        loop = thread._loop

        def direct(request: Fetch, ctx: Any) -> asyncio.Future[Any]:
            answered: asyncio.Future[Any] = loop.create_future()
            answered.set_result(FetchReply(request.token))
            return answered

        thread.run(lambda: thread.server.register_direct(Fetch, direct))
        with BlockingClient(thread.endpoint, SECRET) as client:
            assert client.request(Fetch(0)) == FetchReply(0)  # connected, handshake done
            turns = [0]
            real = loop._run_once  # type: ignore[attr-defined]

            def counting() -> None:
                turns[0] += 1
                real()

            loop._run_once = counting  # type: ignore[attr-defined]
            try:
                replies = [client.request(Fetch(i)) for i in range(1, 101)]
            finally:
                loop._run_once = real  # type: ignore[attr-defined]
        assert replies == [FetchReply(i) for i in range(1, 101)]
        # One turn a request, and a few for timers; three a request before.
        assert turns[0] <= 120, turns[0]


# -- several requests per message (BATCH, DESIGN §2) ----------------------------------------


def _count_messages(endpoint: RpcServer | RpcClient) -> list[int]:
    """Count the zmq messages `endpoint` receives from now on (its one receive callback,
    wrapped before the frame pump takes it): one entry per message, its frame count."""
    seen: list[int] = []
    receive = endpoint._on_message

    def counting(parts: list[Any]) -> None:
        seen.append(len(parts))
        receive(parts)

    endpoint._on_message = counting  # type: ignore[method-assign]
    return seen


def test_calls_issued_together_travel_in_one_message_each_way_answered_in_any_order() -> None:
    """64 requests issued in one loop turn reach the server as one message and their replies,
    ready together, come back as one; replies released one by one in reverse order reach
    their own callers; a request with payload keeps its place behind those issued before."""
    async def test() -> None:
        handlers = Handlers()
        server = RpcServer(SECRET)
        handlers.install(server)
        server.register_direct(Ping, lambda request, ctx: _answered(Pong(request.data)))
        received = _count_messages(server)
        await server.start("tcp://127.0.0.1:0")
        assert server.endpoint is not None
        client = RpcClient(server.endpoint, SECRET, timeout=10.0)
        replies = _count_messages(client)
        await client.connect()
        try:
            assert await client.request(Ping(b"first")) == Pong(b"first")  # connected
            received.clear()
            replies.clear()
            pongs = await asyncio.gather(*(client.request(Ping(bytes([i]))) for i in range(64)))
            assert pongs == [Pong(bytes([i])) for i in range(64)]
            assert len(received) == 1 and len(replies) == 1
            # Gated handlers answer in reverse order, each reply in a message of its own.
            for token in range(8):
                handlers.gate(token)
            calls = [asyncio.create_task(client.request(Fetch(t))) for t in range(8)]
            await wait_for_async(lambda: len(handlers.started) == 8, what="all in flight")
            for token in reversed(range(8)):
                handlers.gates[token].set()
                await wait_for_async(lambda t=token: calls[t].done(), what=f"reply {token}")
                assert [c.done() for c in calls] == [t >= token for t in range(8)]
            assert [c.result() for c in calls] == [FetchReply(t) for t in range(8)]
            # Order kept: the batch issued before a request with payload reaches the server
            # before it.
            order: list[int] = []
            server.register_direct(Fetch, lambda request, ctx: _answered(
                FetchReply(request.token), order.append(request.token)))
            got = await asyncio.gather(client.request(Fetch(1)), client.request(Fetch(2)),
                                       client.exchange(Fetch(3), payload=[b"p"]),
                                       client.request(Fetch(4)))
            assert order == [1, 2, 3, 4] and got[2][0] == FetchReply(3)
            assert server.counters == {} and client.counters == {}
        finally:
            await client.close()
            await server.close()
    run(test)


def _answered(reply: Any, *effects: object) -> asyncio.Future[Any]:
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    future.set_result(reply)
    return future


def test_a_slow_request_in_a_batch_does_not_delay_its_siblings() -> None:
    async def test() -> None:
        handlers = Handlers()
        server = RpcServer(SECRET)
        handlers.install(server)
        received = _count_messages(server)
        await server.start("tcp://127.0.0.1:0")
        assert server.endpoint is not None
        async with RpcClient(server.endpoint, SECRET, timeout=10.0) as client:
            assert await client.request(Ping()) == Pong()
            received.clear()
            slow = handlers.gate(0)
            calls = [asyncio.create_task(client.request(Fetch(t))) for t in range(6)]
            await asyncio.gather(*calls[1:])  # answered while 0 waits for its gate
            assert len(received) == 1  # all six came in one message
            assert not calls[0].done()
            slow.set()
            assert await calls[0] == FetchReply(0)
        await server.close()
    run(test)


def test_a_bad_oversized_or_replayed_batch_is_refused_and_the_server_keeps_serving() -> None:
    """A raw peer holding the secret sends batches: a bad entry gets its own error while its
    siblings are answered; a batch over the count bound gets each request refused; an
    undecodable batch is dropped and counted; a replayed one is refused whole. A well-behaved
    client is served throughout."""
    async def test() -> None:
        limits = Limits(max_batch=4)
        async with served(limits) as (server, client, _):
            codec = Codec(SECRET, role="client")  # its own, wider bounds
            raw = authenticate(zmq.Context.instance().socket(zmq.DEALER), SECRET)
            raw.setsockopt(zmq.LINGER, 0)
            raw.connect(server.endpoint)

            async def answers() -> list[Any]:
                await wait_for_async(lambda: raw.poll(0), what="the server's answer")
                return codec.decode_all(raw.recv_multipart(), time.time())

            try:
                bad = Entry(int(Kind.REQUEST), 2, Fetch.rpc_tag, 5.0,
                            msgspec.Raw(b"\x81\xa1x\x01"))
                frames = codec.batch([codec.request_entry(1, Ping(b"a"), ttl=5.0), bad,
                                      codec.request_entry(3, Ping(b"c"), ttl=5.0)],
                                     now=time.time())
                raw.send_multipart(frames)
                got = {m.header.id: m for m in await answers()}
                assert got[1].body == Pong(b"a") and got[3].body == Pong(b"c")
                assert got[2].header.kind == Kind.ERROR
                assert "undecodable 'test.fetch' body" in got[2].body.message
                # Replayed: refused whole, nothing answered, counted.
                raw.send_multipart(frames)
                await wait_for_async(lambda: server.counters.get("replayed") == 1,
                                     what="the replay refused")
                assert await client.request(Ping(b"still")) == Pong(b"still")
                assert not raw.poll(0)
                # Over the bound: every request refused with a clear error.
                raw.send_multipart(codec.batch([codec.request_entry(i, Ping(), ttl=5.0)
                                                for i in range(10, 15)], now=time.time()))
                refused = await answers()
                refused += await answers()  # the server's own batches hold 4 at most
                assert sorted(m.header.id for m in refused) == list(range(10, 15))
                assert all(m.header.kind == Kind.ERROR and "a batch of 5 messages; at most 4"
                           in m.body.message for m in refused)
                # Undecodable as a batch: dropped, counted, the server keeps serving.
                _, header, _ = open_envelope(codec.batch(
                    [codec.request_entry(20, Ping(), ttl=5.0)] * 2, now=time.time())[0])
                body = b"\x92\x01\x02"
                raw.send_multipart([envelope(Signer(SECRET).sign([header, body]), header,
                                             body)])
                await wait_for_async(lambda: server.counters.get("bad_batch") == 1,
                                     what="the bad batch counted")
                assert await client.request(Ping(b"on")) == Pong(b"on")
            finally:
                raw.close(0)
    run(test)


def test_a_reply_signed_with_given_payload_digests_verifies_and_a_wrong_one_is_refused() -> None:
    """A handler that has its payload frames' digests already (a frame sent to several peers
    is hashed once, DESIGN §2) attaches them with the frames: the reply verifies at the
    client as one the server hashed itself; frames attached without digests make the server
    hash them all; a digest of other bytes only makes a reply the client refuses (the MAC
    covers what the client hashes of what it got), and a count that does not match the
    frames is the handler's bug."""
    async def test() -> None:
        async with served() as (server, client, _handlers):
            big = bytes(range(256)) * 1024  # zero-copy sized

            async def handler(request: Fetch, ctx: Any) -> FetchReply:
                frames = [b"batch-1", big]
                if request.fail == "digests":
                    ctx.attach(*frames, digests=[payload_digest(f) for f in frames])
                elif request.fail == "mixed":
                    ctx.attach(frames[0], digests=[payload_digest(frames[0])])
                    ctx.attach(frames[1])
                elif request.fail == "wrong":
                    ctx.attach(*frames, digests=[payload_digest(b"other"),
                                                 payload_digest(big)])
                elif request.fail == "count":
                    ctx.attach(*frames, digests=[payload_digest(big)])
                return FetchReply(request.token)

            server.register(Fetch, handler)
            for mode in ("digests", "mixed"):
                reply, back = await client.exchange(Fetch(1, fail=mode))
                assert reply == FetchReply(1)
                assert [bytes(f) for f in back] == [b"batch-1", big]
            with pytest.raises(DeadlineExceededError):
                await client.request(Fetch(2, fail="wrong"), timeout=1.0)
            assert client.counters.get("bad_signature") == 1
            with pytest.raises(InternalServerError, match="2 frames"):
                await client.request(Fetch(3, fail="count"))
            assert await client.request(Fetch(4, fail="digests")) == FetchReply(4)
    run(test)


def _answers() -> tuple[list[tuple[Any, BaseException | None]],
                        Callable[[Any, BaseException | None], None]]:
    answers: list[tuple[Any, BaseException | None]] = []
    return answers, lambda reply, error: answers.append((reply, error))


def test_send_request_sends_at_once_and_answers_through_its_callback() -> None:
    """`send_request` hands the request to zmq before it returns (no task, no coroutine) and
    calls back once with the reply or the error `request` would raise; payload travels."""
    async def test() -> None:
        async with served() as (_, client, handlers):
            loop = asyncio.get_running_loop()
            real, made = loop.create_task, [0]

            def counting(coro: Any, **options: Any) -> Any:
                made[0] += coro.__qualname__.startswith("RpcClient.")  # the server's aside
                return real(coro, **options)

            loop.create_task = counting  # type: ignore[method-assign]
            answers, on_answer = _answers()
            client.send_request(Fetch(1), on_answer, payload=[b"batch", bytes(100_000)])
            client.send_request(Fetch(2, fail="empty"), on_answer)
            client.send_request(Fetch(3, fail="bug"), on_answer)
            await wait_for_async(lambda: len(answers) == 3, what="three answers")
            loop.create_task = real  # type: ignore[method-assign]
            assert made[0] == 0
            by_token = {getattr(reply, "token", None): reply for reply, _ in answers}
            assert by_token[1] == FetchReply(1)
            errors = [error for _, error in answers if error is not None]
            assert sorted(type(e).__name__ for e in errors) == ["InternalServerError",
                                                                 "ShelfEmptyError"]
            assert client.in_flight == 0
            assert await client.request(Ping()) == Pong()  # every slot came back
    run(test)


def test_send_request_waits_for_a_slot_in_order_and_fails_on_close() -> None:
    """With every slot taken, requests sent through `send_request` wait for one, first come
    first served with `request`'s callers; closing the client answers those in flight with
    ClientClosedError through the callback."""
    async def test() -> None:
        async with served(Limits(max_in_flight=2)) as (_, client, handlers):
            for token in range(5):
                handlers.gate(token)
            answers, on_answer = _answers()
            client.send_request(Fetch(0), on_answer)
            client.send_request(Fetch(1), on_answer)
            waiting = asyncio.create_task(client.request(Fetch(2)))
            await wait_for_async(lambda: len(handlers.started) == 2, what="two in flight")
            client.send_request(Fetch(3), on_answer)  # behind `waiting`
            handlers.gate(0).set()  # one slot frees: the older waiter takes it
            await wait_for_async(lambda: 2 in handlers.started, what="the waiter sent")
            assert 3 not in handlers.started
            for token in range(1, 4):
                handlers.gate(token).set()
            assert await waiting == FetchReply(2)
            await wait_for_async(lambda: len(answers) == 3, what="three answers")
            assert sorted(reply.token for reply, _ in answers) == [0, 1, 3]
            client.send_request(Fetch(4), on_answer)  # gated: in flight at close
            await wait_for_async(lambda: 4 in handlers.started, what="request in flight")
            await client.close()
            assert len(answers) == 4 and isinstance(answers[-1][1], ClientClosedError)
            client.send_request(Ping(), on_answer)  # closed: said to the callback, not raised
            assert len(answers) == 5 and isinstance(answers[-1][1], ClientClosedError)
    run(test)


def test_a_request_waiting_for_a_slot_keeps_its_place_against_later_calls() -> None:
    """A `send_request` call made while every slot is taken goes out before a later call,
    even when a slot frees before the earlier one's wait has begun: two replies arriving in
    one message free two slots in one loop turn, and calls made in their callbacks keep the
    order they were made in."""
    async def test() -> None:
        async with served(Limits(max_in_flight=2)) as (_, client, handlers):
            loop = asyncio.get_running_loop()
            answers, on_answer = _answers()
            turn_ended: list[bool] = []  # set by a callback of the turn after the first reply
            same_turn: list[bool] = []

            def first(reply: Any, error: BaseException | None) -> None:
                on_answer(reply, error)
                loop.call_soon(turn_ended.append, True)
                client.send_request(Fetch(10), on_answer)  # takes the slot just freed
                client.send_request(Fetch(11), on_answer)  # none left: waits for one

            def second(reply: Any, error: BaseException | None) -> None:
                on_answer(reply, error)
                same_turn.append(not turn_ended)
                client.send_request(Fetch(12), on_answer)  # made after Fetch(11)

            client.send_request(Fetch(0), first)  # both go in one message, both answered
            client.send_request(Fetch(1), second)  # at once, in one message back
            await wait_for_async(lambda: len(answers) == 5, what="five answers")
            assert all(error is None for _, error in answers), answers
            assert same_turn == [True], "the two replies came in different loop turns"
            assert handlers.arrived == [0, 1, 10, 11, 12]
    run(test)


def test_a_request_that_waits_for_a_slot_past_its_deadline_is_answered_expired() -> None:
    """Its deadline runs from the call: waiting for a slot past it answers the callback with
    DeadlineExceededError, sends nothing, and leaves the slots as they were."""
    async def test() -> None:
        async with served(Limits(max_in_flight=1)) as (_, client, handlers):
            handlers.gate(0)
            answers, on_answer = _answers()
            client.send_request(Fetch(0), on_answer)
            client.send_request(Fetch(1), on_answer, timeout=0.2)
            await wait_for_async(lambda: len(answers) == 1, what="the waiting call to expire")
            assert isinstance(answers[0][1], DeadlineExceededError)
            handlers.gate(0).set()
            await wait_for_async(lambda: len(answers) == 2, what="the first call's answer")
            assert answers[1] == (FetchReply(0), None)
            assert handlers.arrived == [0]
            assert await client.request(Ping()) == Pong() and client.in_flight == 0
    run(test)
