"""What a broker's ZeroMQ socket takes, over real sockets: a batch of the broker's largest size
goes through (its socket refuses only bigger frames, DESIGN §2 "Limits"), and a producer told
the broker's maximum refuses a bigger batch itself, with the broker's error, instead of
sending what the socket would drop without an answer."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from querylib.broker import AsyncProducer
from querylib.errors import InvalidLengthError
from querylib.log import LogConfig
from querylib.records import encode_batch
from querylib.server.broker import BrokerServer

SECRET = b"0123456789abcdef0123456789abcdef"


def _batch_of(size: int) -> bytes:
    """A one-record batch of `size` bytes, or a few bytes less (varint lengths)."""
    value = size - len(encode_batch([(1, None, b"", ())]))
    while len(batch := encode_batch([(1, None, b"v" * value, ())])) > size:
        value -= len(batch) - size
    return batch


def test_the_largest_batch_goes_through_and_a_bigger_one_is_refused_by_the_producer(
        tmp_path: Path) -> None:
    async def scenario() -> None:
        server = BrokerServer(tmp_path, SECRET, log_config=LogConfig())
        endpoint = await server.start("tcp://127.0.0.1:0")
        try:
            limit = server.state.limits.max_batch_bytes
            async with AsyncProducer(endpoint, "big", secret=SECRET) as producer:
                largest = _batch_of(limit)
                assert limit - 8 <= len(largest) <= limit
                acked = await (await producer.send_batch(largest))
                assert acked is not None and acked.next_offset == 1
                with pytest.raises(InvalidLengthError, match="exceeds the broker's maximum"):
                    await producer.send_batch(_batch_of(limit + 1024))
                acked = await (await producer.send_batch(_batch_of(1000)))
                assert acked is not None and acked.next_offset == 2  # it goes on
        finally:
            await server.close()

    asyncio.run(scenario())


def test_a_record_too_large_for_a_batch_leaves_no_gap_in_the_producers_sequence(
        tmp_path: Path) -> None:
    """The producer's encoder stamps the next sequence numbers into a batch before the size
    check refuses it: they are given back, so the next batch follows the last one sent (no
    OutOfOrderSequenceError from the broker)."""
    async def scenario() -> None:
        server = BrokerServer(tmp_path, SECRET, log_config=LogConfig())
        endpoint = await server.start("tcp://127.0.0.1:0")
        try:
            limit = server.state.limits.max_batch_bytes
            async with AsyncProducer(endpoint, "big", secret=SECRET) as producer:
                await producer.send(b"small")
                await producer.flush()
                with pytest.raises(InvalidLengthError, match="exceeds the broker's maximum"):
                    await producer.send(b"v" * limit)  # a full batch goes out at once
                await producer.send(b"small again")
                await producer.flush()
                assert producer.core.last_acked is not None
                assert producer.core.last_acked.next_offset == 2
        finally:
            await server.close()

    asyncio.run(scenario())
