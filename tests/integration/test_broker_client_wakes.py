"""The blocking Producer crosses to its loop thread once per idle spell, not once per batch,
and the blocking Subscriber only when credit is due, not once per chunk (issue 17: a wake is a
write to the loop's self-pipe and a thread switch, a large part of a busy client's CPU): a
broker on loopback in a thread of this process, real sockets and files."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from querylib.broker import AsyncProducer, Producer, Subscriber
from querylib.broker._stream import encode_records
from querylib.broker.messages import Produced
from querylib.log import LogConfig
from tests.conftest import wait_for

from ._broker_helpers import broker_on_thread

SECRET = os.urandom(32)


def batch(value: bytes) -> bytes:
    return encode_records([(None, value, (), 0, None)])


def read_values(endpoint: str, topic: str, count: int) -> list[bytes]:
    """The values of the first `count` records of `topic`'s partition 0, read from the start."""
    with Subscriber(endpoint, topic, 0, secret=SECRET) as sub:
        values: list[bytes] = []
        while len(values) < count:
            event = sub.next_event(timeout=30)
            assert event is not None
            values += [r.value or b"" for r in getattr(event, "records", [])]
    return values


@contextmanager
def counted_wakes(client: Any) -> Iterator[list[int]]:
    """While inside: the client's loop thread is held busy and its wakes are counted."""
    loop = client._thread.loop
    real = loop.call_soon_threadsafe
    wakes = [0]

    def counting(*args: Any, **options: Any) -> Any:
        wakes[0] += 1
        return real(*args, **options)

    gate = threading.Event()
    client._thread.soon(gate.wait, 30)
    loop.call_soon_threadsafe = counting
    try:
        yield wakes
    finally:
        gate.set()
        loop.call_soon_threadsafe = real


def test_a_producer_wakes_its_loop_once_for_batches_added_while_it_sends(tmp_path) -> None:
    """While its sender is scheduled or running, batches added to the outbox are taken by it
    without another wake; an idle sender is woken by the next batch (none is left behind)."""
    with broker_on_thread(str(tmp_path), SECRET, LogConfig(flush="never")) as (endpoint, _):
        with Producer(endpoint, "wake", secret=SECRET, linger=0.0005) as producer:
            with counted_wakes(producer) as wakes:
                for i in range(50):
                    producer.send_batch(batch(b"%04d" % i))
                assert wakes[0] == 1
            producer.flush()
            assert producer.core.acked_batches == 50
            producer.send_batch(batch(b"last"))  # the sender went idle: this one wakes it
            producer.flush()
            assert producer.core.acked_batches == 51
        assert read_values(endpoint, "wake", 51) == [b"%04d" % i for i in range(50)] + [b"last"]


def test_an_idle_producers_batch_leaves_in_the_callback_that_woke_its_loop(tmp_path) -> None:
    """A batch that finds the sender idle, the window open and a slot free is sent by the
    loop callback the caller's wake runs: no sender task (its creation, and a turn of the
    loop to start it, per batch of a producer sending one at a time); every batch is
    acknowledged, in order. A sender that must wait for room is still a task (the burst)."""
    with broker_on_thread(str(tmp_path), SECRET, LogConfig(flush="never")) as (endpoint, _):
        with Producer(endpoint, "idle", secret=SECRET, linger=0.0) as producer:
            loop = producer._thread.loop
            real, senders = loop.create_task, [0]

            def counting(coro: Any, **options: Any) -> Any:
                senders[0] += getattr(coro, "__name__", "") == "_send_outbox"
                return real(coro, **options)

            loop.create_task = counting  # type: ignore[method-assign]
            try:
                for i in range(30):  # each once the last was acknowledged: the sender idle
                    producer.send_batch(batch(b"%03d" % i))
                    wait_for(lambda i=i: producer.core.acked_batches == i + 1,
                             what=f"batch {i} acknowledged")
            finally:
                loop.create_task = real  # type: ignore[method-assign]
            assert senders[0] == 0
            producer.core.max_in_flight = 1  # now every batch after the first waits for room
            for i in range(30, 60):
                producer.send_batch(batch(b"%03d" % i))
            producer.flush()
            assert producer.core.acked_batches == 60
        assert read_values(endpoint, "idle", 60) == [b"%03d" % i for i in range(60)]


def test_a_caller_blocked_on_a_full_outbox_is_woken_once_it_is_half_empty(tmp_path) -> None:
    """Backpressure without a thread switch per batch: a caller that filled the outbox with
    big batches sleeps until the loop has taken half of it, not until it took one; every
    batch is still stored, in order."""
    big = [encode_records([(None, b"%04d" % i + bytes(100_000), (), 0, None)])
           for i in range(60)]
    with broker_on_thread(str(tmp_path), SECRET, LogConfig(flush="never")) as (endpoint, _):
        with Producer(endpoint, "half", secret=SECRET, linger=0.0005) as producer:
            wakes = [0]
            real = producer._lock.notify_all

            def counting() -> None:
                wakes[0] += 1
                real()

            producer._lock.notify_all = counting  # type: ignore[method-assign]
            for one in big:
                producer.send_batch(one)
            producer.flush()
            assert producer.core.acked_batches == 60
            # Woken at most once per half outbox (about five of these batches); it was once
            # per batch taken.
            assert wakes[0] <= 60 // 4, wakes[0]
        assert [v[:4] for v in read_values(endpoint, "half", 60)] == [b"%04d" % i
                                                                     for i in range(60)]


def test_a_subscriber_returns_a_chunks_credit_without_being_asked_again(tmp_path) -> None:
    """The broker counts a subscriber's lag from the credit it returns (the console, tq topic
    describe): a reader that took the last record shows no lag even if it never asks for
    another event (deferring the credit to the next call left the console's lag above 0)."""
    with broker_on_thread(str(tmp_path), SECRET, LogConfig(flush="never")) as (endpoint, _):
        with Subscriber(endpoint, "credit", 0, secret=SECRET, create=True,
                        credit=256) as sub, \
                Producer(endpoint, "credit", secret=SECRET, linger=0.0) as producer:
            producer.send_batch(batch(b"first"))
            producer.flush()
            event = sub.next_event(timeout=30)
            assert [r.value for r in getattr(event, "records", [])] == [b"first"]
            wait_for(lambda: sub.core.unconsumed(0) == 0, what="the credit returned")
            for i in range(200):  # ~70 bytes each: many times the window
                producer.send_batch(batch(b"%04d" % i))
            values: list[bytes] = []
            while len(values) < 200:
                event = sub.next_event(timeout=30)
                assert event is not None
                values += [r.value or b"" for r in getattr(event, "records", [])]
            assert values == [b"%04d" % i for i in range(200)]


def test_a_subscriber_wakes_its_loop_for_consumed_chunks_only_when_credit_is_due(
        tmp_path) -> None:
    """A blocking Subscriber counts what its caller consumed on the caller's thread and wakes
    its loop thread only when that makes a grant due (half the credit free): it woke the loop
    at every chunk, a self-pipe write and a thread switch per delivery, only for the loop to
    lower a counter. Grants still go when due: a 256-byte credit read through many times."""
    with broker_on_thread(str(tmp_path), SECRET, LogConfig(flush="never")) as (endpoint, _):
        with Subscriber(endpoint, "consumed", 0, secret=SECRET, create=True) as sub, \
                Producer(endpoint, "consumed", secret=SECRET, linger=0.0) as producer:
            loop = sub._thread.loop
            real, wakes = loop.call_soon_threadsafe, [0]

            def counting(*args: Any, **options: Any) -> Any:
                wakes[0] += 1
                return real(*args, **options)

            loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
            try:
                for i in range(40):  # one chunk each: sent once the last was read
                    producer.send_batch(batch(b"%03d" % i))
                    event = sub.next_event(timeout=30)
                    assert [r.value for r in getattr(event, "records", [])] == [b"%03d" % i]
            finally:
                loop.call_soon_threadsafe = real  # type: ignore[method-assign]
            assert wakes[0] == 0, wakes[0]  # 40 small chunks of a 1 MiB credit: none due
            assert sub.core.unconsumed(0) == 0
        with Subscriber(endpoint, "consumed", 0, secret=SECRET, credit=256) as small:
            values: list[bytes] = []
            while len(values) < 40:
                chunk = small.next_chunk(timeout=30)
                assert chunk is not None
                values += [r.value or b"" for r in decode_chunk_records(chunk)]
                small.consumed(chunk)
            assert values == [b"%03d" % i for i in range(40)]


def decode_chunk_records(chunk: Any) -> list[Any]:
    from querylib.broker import Data
    from querylib.broker._subscriber import decode_chunk

    return [r for event in decode_chunk(chunk) if isinstance(event, Data)
            for r in event.records]


def test_a_batch_goes_out_and_is_answered_without_a_task_of_its_own(tmp_path) -> None:
    """A producer's request leaves as it is issued and its answer comes back to it from the
    receive loop: no task per batch (a task's creation and steps were a large part of a
    busy producer's loop), and every batch is still acknowledged, in order."""
    with broker_on_thread(str(tmp_path), SECRET, LogConfig(flush="never")) as (endpoint, _):
        async def main() -> tuple[int, list[Any]]:
            async with AsyncProducer(endpoint, "tasks", secret=SECRET) as producer:
                loop = asyncio.get_running_loop()
                real, made = loop.create_task, [0]

                def counting(*args: Any, **options: Any) -> Any:
                    made[0] += 1
                    return real(*args, **options)

                loop.create_task = counting  # type: ignore[method-assign]
                try:
                    acks = [await producer.core.send_batch(batch(b"%03d" % i))
                            for i in range(100)]
                    answers = await asyncio.gather(*acks)
                finally:
                    loop.create_task = real  # type: ignore[method-assign]
                return made[0], answers

        made, answers = asyncio.run(main())
        assert answers == [Produced(base_offset=i, next_offset=i + 1) for i in range(100)]
        assert made == 0


def test_a_saturated_producer_wakes_its_sender_once_per_quarter_of_its_in_flight_limit(
        tmp_path) -> None:
    """A sender waiting for room (its in-flight limit reached) is woken once a quarter of the
    limit is free, not at every acknowledgement: it sends in bursts, a wake per burst."""
    in_flight, batches = 16, 300
    with broker_on_thread(str(tmp_path), SECRET, LogConfig(flush="never")) as (endpoint, _):
        async def main() -> tuple[list[int], list[Any]]:
            async with AsyncProducer(endpoint, "burst", secret=SECRET) as producer:
                core = producer.core
                core.max_in_flight = in_flight
                real, woken = core._room.wait, []

                async def counting() -> bool:
                    await real()
                    woken.append(len(core._outstanding))  # in flight as it goes on
                    return True

                core._room.wait = counting  # type: ignore[method-assign]
                acks = [await core.send_batch(batch(b"%03d" % i)) for i in range(batches)]
                return woken, await asyncio.gather(*acks)

        woken, answers = asyncio.run(main())
        assert answers == [Produced(base_offset=i, next_offset=i + 1) for i in range(batches)]
        assert woken, "the sender reached its in-flight limit"
        assert max(woken) <= in_flight - in_flight // 4, woken
        assert len(woken) <= batches // (in_flight // 4) + 1, woken


def test_a_producers_payload_is_copied_into_zmq_not_lent_through_pyzmqs_collector(
        tmp_path, monkeypatch) -> None:
    """Batches below COPY_BELOW are copied into zmq: lending one (zero-copy) registers it
    with pyzmq's garbage-collector thread and has zmq's I/O thread message that thread to
    release it, which costs more than the copy (and a thread wake per batch)."""
    from zmq.utils.garbage import gc

    lent = [0]
    real = gc.store

    def counting(*args: Any, **options: Any) -> int:
        lent[0] += 1
        return real(*args, **options)

    big = [encode_records([(None, b"%03d" % i + bytes(100_000), (), 0, None)])
           for i in range(20)]
    with broker_on_thread(str(tmp_path), SECRET, LogConfig(flush="never")) as (endpoint, _):
        with Producer(endpoint, "copied", secret=SECRET, linger=0.0005) as producer:
            monkeypatch.setattr(gc, "store", counting)
            for one in big:
                producer.send_batch(one)
            producer.flush()
            monkeypatch.setattr(gc, "store", real)
            assert producer.core.acked_batches == 20
    assert lent[0] == 0
