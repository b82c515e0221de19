"""FramePump over real zmq sockets on 127.0.0.1: replies held for a burst keep their order."""

from __future__ import annotations

import asyncio
from typing import Any

import zmq

from querylib.rpc import Limits
from querylib.rpc._shell import FramePump, new_socket
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
