"""FramePump over real zmq sockets on 127.0.0.1: replies held for a burst keep their order."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import zmq

from querylib.rpc import Limits
from querylib.rpc._shell import (
    FAIR_QUEUE_BYTES,
    FAIR_SMALL,
    RECV_BURST,
    RECV_BURST_BYTES,
    FramePump,
    new_socket,
)
from tests.conftest import wait_for_async


def test_send_soon_holds_replies_for_the_burst_and_keeps_their_order() -> None:
    """Inside `on_message`, `send_soon` holds a message until the burst ends; a plain `send`
    meanwhile first sends what is held, so the peer sees every message in the order it was
    sent. Outside a burst, `send_soon` sends at once; its failures go to `on_send_error`."""
    async def test() -> None:
        loop = asyncio.get_running_loop()
        context: zmq.Context[Any] = zmq.Context()
        router = new_socket(zmq.ROUTER, Limits(), context)
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        port = router.bind_to_random_port("tcp://127.0.0.1")
        dealer = new_socket(zmq.DEALER, Limits(), context)
        dealer.connect(f"tcp://127.0.0.1:{port}")
        failures: list[zmq.ZMQError] = []
        held_during_burst: list[bool] = []
        pump: FramePump | None = None

        def on_message(parts: list[Any]) -> None:
            assert pump is not None
            peer = parts[0]
            pump.send_soon([peer, b"first"])
            held_during_burst.append(pump._held == [[peer, b"first"]])
            pump.send([peer, b"second"])  # sends "first" before itself
            pump.send_soon([peer, b"third"])
            pump.send_soon([b"nobody", b"unroutable"])

        pump = FramePump(router, loop, small_frames=2, limits=Limits(),
                         on_message=on_message, on_drop=lambda reason: None,
                         on_send_error=failures.append)
        try:
            dealer.send(b"go")
            received: list[bytes] = []

            def arrived() -> bool:
                while True:
                    try:
                        received.append(dealer.recv(zmq.DONTWAIT))
                    except zmq.Again:
                        return len(received) >= 3
            await wait_for_async(arrived, what="the three replies")
            assert received == [b"first", b"second", b"third"]
            assert held_during_burst == [True]
            assert len(failures) == 1 and failures[0].errno == zmq.EHOSTUNREACH
            pump.send_soon([b"nobody either", b"x"])  # outside a burst: at once
            assert len(failures) == 2
        finally:
            pump.close()
            router.close(0)
            dealer.close(0)
            context.term()
    asyncio.run(asyncio.wait_for(test(), 30))


class _Fair:
    """A ROUTER and two DEALERs ("bulk", "probe") over inproc, and the pump a test makes over
    the ROUTER (closed with them). Over inproc a send is in the ROUTER's queue, and zmq's note
    that the peer is readable in its mailbox, when `send` returns."""

    def __init__(self, loop: asyncio.AbstractEventLoop, context: zmq.Context[Any],
                 name: str) -> None:
        self.loop = loop
        limits = Limits()
        self.router = new_socket(zmq.ROUTER, limits, context)
        self.router.bind(f"inproc://{name}")
        self.bulk, self.probe = (self._dealer(context, name, identity)
                                 for identity in (b"bulk", b"probe"))
        self.pump: FramePump | None = None

    @staticmethod
    def _dealer(context: zmq.Context[Any], name: str, identity: bytes) -> zmq.Socket[Any]:
        dealer = new_socket(zmq.DEALER, Limits(), context)
        dealer.setsockopt(zmq.IDENTITY, identity)
        dealer.connect(f"inproc://{name}")
        return dealer

    def start_pump(self, on_message: Callable[[list[Any]], None], *,
                   fair: bool = True) -> FramePump:
        self.pump = FramePump(self.router, self.loop, small_frames=2, limits=Limits(),
                              fair=fair, on_message=on_message, on_drop=lambda reason: None)
        return self.pump

    def close(self) -> None:
        if self.pump is not None:
            self.pump.close()
        for sock in (self.router, self.bulk, self.probe):
            sock.close(0)


def _run_fair(name: str, test: Callable[[_Fair], Awaitable[None]]) -> None:
    """Run `test` on a loop of its own with a fresh `_Fair` (inproc name `name`), then close
    everything it opened; 30 s at most."""
    async def main() -> None:
        context: zmq.Context[Any] = zmq.Context()
        sockets = _Fair(asyncio.get_running_loop(), context, name)
        try:
            await test(sockets)
        finally:
            sockets.close()
            context.term()
    asyncio.run(asyncio.wait_for(main(), 30))


@pytest.mark.parametrize("fair", [False, True])
def test_a_peer_arriving_behind_a_backlog_is_served_within_a_turn(fair: bool) -> None:
    """A peer whose message arrives while another peer's backlog of large messages is being
    received is served next (within one message of the backlog), not after the backlog:
    zmq adds a newly readable peer to its fair queue only when the socket processes its
    commands, which it does by itself only every 100 frames while messages keep coming."""
    async def test(f: _Fair) -> None:
        order: list[bytes] = []
        big = bytes(200 * 1024)

        def on_message(parts: list[Any]) -> None:
            body = bytes(parts[1]) if len(parts[1]) < 100 else b"bulk"
            order.append(body)
            if body == b"bulk" and order.count(b"bulk") % 10 == 1:
                f.probe.send(b"probe")  # one probe every 10 bulk messages, each after the last

        f.start_pump(on_message, fair=fair)
        f.probe.send(b"hello")  # read, then found empty: zmq takes it out of its queue
        await wait_for_async(lambda: order == [b"hello"], what="the probe's hello")
        for _ in range(60):
            f.bulk.send(big)
        await wait_for_async(lambda: len(order) == 67, what="every message")
        # Each probe is sent while a bulk message is handled; at most one more bulk message
        # is served before it (zmq's fair queue takes peers in turn), or two with `fair`
        # (received ahead up to FAIR_HOLD_BYTES: a message arriving while that much waits is
        # received once one more bulk message is served).
        sent_at = [i for i, b in enumerate(order) if b == b"bulk"][::10]
        served_at = [i for i, b in enumerate(order) if b == b"probe"]
        assert len(sent_at) == len(served_at) == 6
        waits = [s - t - 1 for t, s in zip(sent_at, served_at, strict=True)]
        assert max(waits) <= (2 if fair else 1), waits
    _run_fair("fair-turns", test)


def test_a_fair_pump_sends_a_push_to_one_peer_before_replies_held_for_another() -> None:
    """With `fair` (a ROUTER: a message's first part is its peer), a `send` during a burst
    first sends what is held for the same peer only: a push to one peer (a probe's delivery)
    does not wait for the replies held for another (a bulk producer's acknowledgements), which
    go when the burst ends; each peer still sees its messages in the order they were sent."""
    async def test(f: _Fair) -> None:
        held_after_push: list[list[Any]] = []

        def on_message(parts: list[Any]) -> None:
            assert parts[0] == b"bulk"
            pump.send_soon([b"bulk", b"ack 1"])
            pump.send_soon([b"probe", b"reply"])
            pump.send_soon([b"bulk", b"ack 2"])
            pump.send([b"probe", b"push"])  # sends the probe's reply first, not the acks
            held_after_push.append(list(pump._held or []))
            pump.send([b"bulk", b"push"])  # after its own acks

        pump = f.start_pump(on_message)
        f.bulk.send(b"go")
        received: dict[bytes, list[bytes]] = {b"bulk": [], b"probe": []}

        def arrived() -> bool:
            for name, sock in ((b"bulk", f.bulk), (b"probe", f.probe)):
                while True:
                    try:
                        received[name].append(sock.recv(zmq.DONTWAIT))
                    except zmq.Again:
                        break
            return len(received[b"bulk"]) == 3 and len(received[b"probe"]) == 2
        await wait_for_async(arrived, what="every message")
        assert held_after_push == [[[b"bulk", b"ack 1"], [b"bulk", b"ack 2"]]]
        assert received == {b"bulk": [b"ack 1", b"ack 2", b"push"],
                            b"probe": [b"reply", b"push"]}
    _run_fair("fair-push", test)


def test_a_fair_pump_serves_a_newcomer_after_the_large_message_in_hand() -> None:
    """With `fair`, a peer whose small message arrives while a large message of another
    peer is handled is served next, before the next large message: the pump asks zmq for
    newly readable peers after every message over FAIR_SMALL it serves, not only every
    FAIR_QUEUE_BYTES (a bulk producer's 100 KB batches: one batch more of waiting each time,
    a third of a millisecond of broker CPU, issue 17)."""
    async def test(f: _Fair) -> None:
        order: list[bytes] = []
        size = FAIR_QUEUE_BYTES * 3 // 4  # under FAIR_QUEUE_BYTES, over FAIR_SMALL
        assert size > FAIR_SMALL

        def on_message(parts: list[Any]) -> None:
            body = bytes(parts[1]) if len(parts[1]) < 100 else b"bulk"
            order.append(body)
            if body == b"bulk" and order.count(b"bulk") % 4 == 1:
                f.probe.send(b"probe")  # while this bulk message is handled

        f.start_pump(on_message)
        f.probe.send(b"hello")  # read, then found empty: zmq takes it out of its queue
        await wait_for_async(lambda: order == [b"hello"], what="the probe's hello")
        for _ in range(20):  # under FAIR_HOLD_BYTES: all received ahead at once
            f.bulk.send(bytes(size))
        await wait_for_async(lambda: len(order) == 26, what="every message")
        sent_at = [i for i, b in enumerate(order) if b == b"bulk"][::4]
        served_at = [i for i, b in enumerate(order) if b == b"probe"]
        assert len(sent_at) == len(served_at) == 5
        assert [s - t for t, s in zip(sent_at, served_at, strict=True)] == [1] * 5, order
    _run_fair("fair-newcomer", test)


@pytest.mark.parametrize("fair", [False, True])
def test_a_receive_burst_is_bounded_in_bytes(fair: bool) -> None:
    """One loop callback receives at most RECV_BURST_BYTES (and whole messages): with a
    backlog of large messages queued, a callback scheduled while the first is handled runs
    once that many bytes are in, not after the whole burst of RECV_BURST messages, so timers,
    other sockets and disk reads get their turn beside a bulk stream."""
    async def test(f: _Fair) -> None:
        order: list[str] = []
        size = 256 * 1024

        def on_message(parts: list[Any]) -> None:
            order.append("message")
            if len(order) == 1:
                f.loop.call_soon(order.append, "other work")

        f.start_pump(on_message, fair=fair)
        assert RECV_BURST * size > 4 * RECV_BURST_BYTES  # the bytes bound comes first
        for _ in range(RECV_BURST):
            f.bulk.send(bytes(size))
        await wait_for_async(lambda: len(order) == RECV_BURST + 1, what="every message")
        per_burst = -(-RECV_BURST_BYTES // size)  # whole messages: the last one crosses
        assert order.index("other work") == per_burst
    _run_fair("fair-bytes", test)


def test_peers_are_served_by_bytes_not_by_messages() -> None:
    """With `fair`, a ROUTER's peers take turns by bytes (deficit round robin), each peer's
    messages in the order it sent them: a backlog of small messages queued beside a bulk
    peer's backlog of large ones is served before the second large one, where zmq's own
    fair queue (one message per peer in turn) would serve one small message per large one."""
    async def test(f: _Fair) -> None:
        order: list[bytes] = []
        for i in range(30):
            f.bulk.send(b"bulk %02d" % i + bytes(200 * 1024))
            f.probe.send(b"probe %02d" % i)
        pump = f.start_pump(lambda parts: order.append(bytes(parts[1][:8]).rstrip(b"\0")))
        await wait_for_async(lambda: len(order) == 60, what="every message")
        assert [m for m in order if m.startswith(b"bulk")] == [
            b"bulk %02d" % i for i in range(30)]
        assert [m for m in order if m.startswith(b"probe")] == [
            b"probe %02d" % i for i in range(30)]
        second_bulk = order.index(b"bulk 01")
        assert order.index(b"probe 29") < second_bulk, order
        assert pump.waiting_bytes == 0
    _run_fair("fair-bytes-turns", test)


def test_a_fair_pump_closed_by_its_handler_stops_cleanly() -> None:
    """A handler may close a fair pump while a peer's messages are served: the drain stops
    serving, forgets what waits and raises nothing into the loop."""
    async def test(f: _Fair) -> None:
        errors: list[dict[str, Any]] = []
        f.loop.set_exception_handler(lambda _loop, context: errors.append(context))
        served: list[int] = []

        def on_message(parts: list[Any]) -> None:
            served.append(len(parts[1]))
            pump.close()

        for _ in range(3):  # over FAIR_SMALL, under FAIR_QUANTUM together: one turn
            f.bulk.send(bytes(20 * 1024))
        pump = f.start_pump(on_message)
        await wait_for_async(lambda: served, what="the first message")
        for _ in range(5):
            await asyncio.sleep(0)  # any drain scheduled runs
        assert served == [20 * 1024]
        assert errors == [] and pump.waiting_bytes == 0
    _run_fair("fair-close", test)


def test_every_rpc_socket_drops_connections_to_a_vanished_peer_within_about_a_minute() -> None:
    """The defaults tests/integration/test_silent_peer_netns.py stands for (there shortened):
    keepalive probes after 30 s of silence, every 10 s, 3 unanswered drop the connection;
    what was sent is left to the kernel's retransmission bound unless told otherwise."""
    context = zmq.Context()
    try:
        for kind in (zmq.ROUTER, zmq.DEALER):
            sock = new_socket(kind, Limits(), context)
            try:
                assert sock.getsockopt(zmq.TCP_KEEPALIVE) == 1
                assert sock.getsockopt(zmq.TCP_KEEPALIVE_IDLE) == 30
                assert sock.getsockopt(zmq.TCP_KEEPALIVE_INTVL) == 10
                assert sock.getsockopt(zmq.TCP_KEEPALIVE_CNT) == 3
                assert sock.getsockopt(zmq.TCP_MAXRT) == 0
            finally:
                sock.close(0)
        bounded = new_socket(zmq.DEALER, Limits(unacked_timeout=2.5), context)
        assert bounded.getsockopt(zmq.TCP_MAXRT) == 2500
        bounded.close(0)
    finally:
        context.term()
