"""A broker that goes away and does not come back: its subscriber and its producer keep trying
for their reconnect timeout, then say so (BrokerUnavailableError) instead of waiting forever
(DESIGN §5 "Restarts")."""

from __future__ import annotations

import os
import signal
import time

import pytest

from querylib.broker import BrokerUnavailableError, Data, Producer, Subscriber
from tests.conftest import free_port, wait_for

from ._broker_helpers import secret_file, start_broker

RECONNECT = 2.0


def test_subscriber_and_producer_give_up_on_a_broker_that_stays_away(processes,
                                                                     tmp_path) -> None:
    path, secret = secret_file(tmp_path)
    port = free_port()
    broker = start_broker(processes, tmp_path / "data", port, path, secret)
    address = f"tcp://127.0.0.1:{port}"
    located: list[float] = []

    def locate() -> str:
        located.append(time.monotonic())
        return address  # the catalog knows no other address

    producer = Producer(address, "t", secret=secret, lease=1.0, locate=locate,
                        reconnect_timeout=RECONNECT)
    sub = Subscriber(address, "t", 0, secret=secret, create=True, lease=1.0, locate=locate,
                     reconnect_timeout=RECONNECT)
    try:
        producer.send(b"before", time=0)
        producer.flush()
        event = sub.next_event(timeout=30)
        assert isinstance(event, Data) and event.records[0].value == b"before"

        gone = time.monotonic()  # its clients may hear of it before the wait below returns
        os.killpg(broker.pid, signal.SIGKILL)
        broker.wait(timeout=10)
        with pytest.raises(BrokerUnavailableError, match="did not answer"):
            while sub.next_event(timeout=1.0) is None:
                assert time.monotonic() - gone < 60, "the subscriber kept waiting silently"
        producer.send(b"after", time=1)
        with pytest.raises(BrokerUnavailableError):
            producer.flush()
        assert time.monotonic() - gone >= RECONNECT  # it did keep trying that long
        wait_for(lambda: located, timeout=1, what="the broker to be looked up again")
    finally:
        sub.close()
        producer.close(end=False)
