"""Producers across a broker crash (DESIGN §5 "Idempotent producers", "Restarts"): a batch the
broker appended but never acknowledged (it was SIGKILLed first) is sent again once the broker
is back, and stored once (the broker learnt the producer from its log's tail); the writers of
a cohort rejoin, and their stream ends once."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import pytest

from querylib.broker import Cohort, Data, EndOfStream, Producer, Subscriber, list_partitions
from querylib.broker._producer import ProducerCore
from querylib.broker._session import BrokerLink
from querylib.broker._stream import encode_records
from querylib.broker.messages import EndStreamRequest, Produced, ProduceRequest
from querylib.records import iter_batches
from tests.conftest import free_port, wait_for_async

from ._broker_helpers import secret_file, start_broker

RECORDS = 5


def _entries(batch: int) -> list[Any]:
    return [(None, f"{batch}:{i}".encode(), (), 0, batch) for i in range(RECORDS)]


def test_a_batch_appended_but_not_acknowledged_before_a_crash_is_stored_once(
        processes, tmp_path) -> None:
    path, secret = secret_file(tmp_path)
    port = free_port()
    data = tmp_path / "data"
    broker = start_broker(processes, data, port, path, secret)
    address = f"tcp://127.0.0.1:{port}"

    def log_end() -> int:
        (info,) = list_partitions(address, secret, topic="t", timeout=2.0)
        return info.log_end

    async def scenario() -> tuple[Produced, Produced, int]:
        nonlocal broker
        link = BrokerLink(address, secret, lease=1.0, timeout=5.0)
        await link.start()
        core = ProducerCore(link, "t", 0)
        await core.open()
        first = await core.send_batch(encode_records(_entries(0),
                                                     **core.stamping(RECORDS)))
        assert await first == Produced(base_offset=0, next_offset=RECORDS)

        # The next acknowledgement never reaches us: the broker dies right after appending.
        real, lost = link.send_request, asyncio.Event()

        def losing_one_reply(request: Any, on_answer: Any, **options: Any) -> None:
            if isinstance(request, ProduceRequest) and not lost.is_set():
                # The reply is lost (nobody hears it); a resend answers instead.
                real(request, lambda reply, error: lost.set(), **options)
                return
            real(request, on_answer, **options)

        link.send_request = losing_one_reply  # type: ignore[method-assign]
        second = await core.send_batch(encode_records(_entries(1), **core.stamping(RECORDS)))
        await wait_for_async(lost.is_set, timeout=30, what="the broker to append batch 1")
        assert await asyncio.to_thread(log_end) == 2 * RECORDS
        os.killpg(broker.pid, signal.SIGKILL)
        broker.wait(timeout=10)
        broker = await asyncio.to_thread(start_broker, processes, data, port, path, secret)

        # The producer reconnects by itself, rejoins and sends batch 1 again.
        resent = await asyncio.wait_for(second, timeout=60)
        third = await core.send_batch(encode_records(_entries(2), **core.stamping(RECORDS)))
        after = await third
        await core.end()
        resends = core.resent
        await link.close()
        return resent, after, resends

    resent, after, resends = asyncio.run(scenario())
    # Answered with the offsets it got the first time, and the next batch follows it.
    assert resent == Produced(base_offset=RECORDS, next_offset=2 * RECORDS)
    assert after == Produced(base_offset=2 * RECORDS, next_offset=3 * RECORDS)
    assert resends >= 1
    values: list[str] = []
    with Subscriber(address, "t", 0, secret=secret) as sub:
        for event in sub:
            if isinstance(event, Data):
                values += [r.value.decode() for r in event.records]
            assert not isinstance(event, EndOfStream) or values
    assert values == [f"{b}:{i}" for b in range(3) for i in range(RECORDS)]


def test_a_cohort_across_a_broker_crash_ends_its_stream_once(processes,
                                                             tmp_path) -> None:
    """Two writers of one collective publication (a cohort of 2, as two processes of a
    query write a Merge topic) keep writing across a SIGKILL of their broker: they rejoin,
    nothing is lost or doubled, and the stream ends once, when the second writer ends."""
    path, secret = secret_file(tmp_path)
    port = free_port()
    data = tmp_path / "data"
    broker = start_broker(processes, data, port, path, secret)
    address = f"tcp://127.0.0.1:{port}"
    writers = [Producer(address, "m", 0, secret=secret, lease=1.0,
                        cohort=Cohort("q1/m#1", str(w), 2)) for w in range(2)]
    try:
        for t in range(3):
            for w, producer in enumerate(writers):
                producer.send_values([f"{w}:{t}:{i}".encode() for i in range(RECORDS)], time=t)
                producer.advance(t + 1)
        for producer in writers:
            producer.flush()
        os.killpg(broker.pid, signal.SIGKILL)
        broker.wait(timeout=10)
        for t in range(3, 6):  # sent while the broker is down, or as it comes back
            for w, producer in enumerate(writers):
                producer.send_values([f"{w}:{t}:{i}".encode() for i in range(RECORDS)], time=t)
        broker = start_broker(processes, data, port, path, secret)
        writers[0].close()  # its end does not end the stream: writer 1 is still live
        assert list_partitions(address, secret, topic="m")[0].ended is False
        writers[1].advance(6)
        writers[1].close()
    finally:
        for producer in writers:
            producer.close()
    values, ends = [], 0
    with Subscriber(address, "m", 0, secret=secret, follow=False) as sub:
        while (event := sub.next_event(timeout=30)) is not None:
            if isinstance(event, Data):
                values += [r.value.decode() for r in event.records]
            elif isinstance(event, EndOfStream):
                ends += 1
    assert sorted(values) == sorted(f"{w}:{t}:{i}" for w in range(2) for t in range(6)
                                    for i in range(RECORDS))
    assert ends == 1 and list_partitions(address, secret, topic="m")[0].ended


@pytest.mark.parametrize("reopen", [False, True])
def test_a_producer_whose_end_was_stored_but_not_answered_rejoins_and_is_answered(
        processes, tmp_path, reopen: bool) -> None:
    """The broker stores a producer's last batch and its end of stream, then dies before
    either answer leaves. The producer comes back to an ended stream: it is answered as the
    first time (the batch with its offsets, the end with Done), not refused, and the stream
    is not reopened (even by a producer allowed to, as querylib's publishers are): the log
    holds each record once and one end of stream."""
    path, secret = secret_file(tmp_path)
    port = free_port()
    data = tmp_path / "data"
    broker = start_broker(processes, data, port, path, secret)
    address = f"tcp://127.0.0.1:{port}"

    def ended() -> bool:
        (info,) = list_partitions(address, secret, topic="t", timeout=2.0)
        return info.ended

    async def scenario() -> Produced:
        nonlocal broker
        link = BrokerLink(address, secret, lease=1.0, timeout=5.0)
        await link.start()
        core = ProducerCore(link, "t", 0, reopen=reopen)
        await core.open()
        first = await core.send_batch(encode_records(_entries(0), **core.stamping(RECORDS)))
        assert await first == Produced(base_offset=0, next_offset=RECORDS)

        real = link.send_request
        unanswered: list[Any] = []

        def losing_replies(request: Any, on_answer: Any, **options: Any) -> None:
            if isinstance(request, ProduceRequest | EndStreamRequest) and \
                    link.generation == 1:
                # Lost (nobody hears it); the resend after the restart answers.
                real(request, lambda reply, error: unanswered.append(request), **options)
                return
            real(request, on_answer, **options)

        link.send_request = losing_replies  # type: ignore[method-assign]
        second = await core.send_batch(encode_records(_entries(1), **core.stamping(RECORDS)))
        ending = asyncio.get_running_loop().create_task(core.end())
        await wait_for_async(lambda: len(unanswered) == 2, timeout=30,
                             what="the broker to store batch 1 and the end of stream")
        assert await asyncio.to_thread(ended)
        os.killpg(broker.pid, signal.SIGKILL)
        broker.wait(timeout=10)
        broker = await asyncio.to_thread(start_broker, processes, data, port, path, secret)

        await asyncio.wait_for(ending, timeout=60)  # raises what the broker refused
        resent = await second
        await link.close()
        return resent

    resent = asyncio.run(scenario())
    assert resent == Produced(base_offset=RECORDS, next_offset=2 * RECORDS)
    values, ends = [], 0
    with Subscriber(address, "t", 0, secret=secret, follow=False) as sub:
        while (event := sub.next_event(timeout=30)) is not None:
            if isinstance(event, Data):
                values += [r.value.decode() for r in event.records]
            elif isinstance(event, EndOfStream):
                ends += 1
    assert values == [f"{b}:{i}" for b in range(2) for i in range(RECORDS)]
    (info,) = list_partitions(address, secret, topic="t")
    assert ends == 1 and info.ended and info.log_end == 2 * RECORDS + 1


def test_pre_built_batches_are_stamped_without_copying_their_records(processes,
                                                             tmp_path) -> None:
    """A batch the producer did not encode gets its producer id and sequence in a new header
    sent apart from its records, which go out as the caller's bytes (issue 13: copying each
    batch to stamp it cost the pre-built path its throughput); the broker stores the whole
    batch, stamped, and answers a resend of it with the offsets it got the first time."""
    path, secret = secret_file(tmp_path)
    port = free_port()
    broker = start_broker(processes, tmp_path / "data", port, path, secret)
    address = f"tcp://127.0.0.1:{port}"
    batches = [encode_records(_entries(b)) for b in range(3)]

    async def scenario() -> tuple[list[Produced], Produced, int]:
        link = BrokerLink(address, secret, lease=1.0, timeout=5.0)
        await link.start()
        core = ProducerCore(link, "t", 0)
        await core.open()
        sent: list[Any] = []
        real = link.send_request

        def keeping(request: Any, on_answer: Any, **options: Any) -> None:
            if isinstance(request, ProduceRequest):
                sent.append(list(options["payload"]))
            real(request, on_answer, **options)

        link.send_request = keeping  # type: ignore[method-assign]
        acks = [await (await core.send_batch(b)) for b in batches]
        # Every batch went out as a new header and a view of the caller's bytes.
        assert [len(frames) for frames in sent] == [2, 2, 2]
        assert all(frames[1].obj is b for frames, b in zip(sent, batches, strict=True))
        # The second batch again, as a producer sends it after a reconnect: stored once.
        again = await link.request(ProduceRequest(session=link.session, topic="t",
                                                  partition=0), payload=sent[1])
        await core.end()
        await link.close()
        return acks, again, core.producer_id

    acks, again, producer_id = asyncio.run(scenario())
    assert acks == [Produced(base_offset=b * RECORDS, next_offset=(b + 1) * RECORDS)
                    for b in range(3)]
    assert again == acks[1]
    stored: list[Any] = []
    with Subscriber(address, "t", 0, secret=secret) as sub:
        while len(stored) < 3:
            chunk = sub.next_chunk(30)
            assert chunk is not None, "the stored batches within 30 s"
            stored += [b for b in iter_batches(chunk.data) if not b.is_control]
            sub.consumed(chunk)
    assert [(b.producer_id, b.base_sequence) for b in stored] == \
        [(producer_id, b * RECORDS) for b in range(3)]
    assert [r.value.decode() for b in stored for r in b.records] == \
        [f"{b}:{i}" for b in range(3) for i in range(RECORDS)]
    broker.terminate()
