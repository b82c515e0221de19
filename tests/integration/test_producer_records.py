"""What the producers' record path (`send`, once per record) puts in a record comes back
exactly: keys, values, headers with the logical time first, explicit and default timestamps,
in send order, mixed with runs from `send_values`. A broker on loopback in a thread of this
process (real sockets and files), a blocking Subscriber reading it back."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time

from querylib.broker import AsyncProducer, Producer, Subscriber
from querylib.log import LogConfig
from querylib.records import TIME_HEADER, Record, decode_int64
from querylib.server.broker import BrokerServer

from ._broker_helpers import broker_on_thread, next_records

SECRET = os.urandom(32)
T0 = 1_700_000_000_000

# (value, key, headers, timestamp, time): every field a record may carry, None where allowed
SENT = [
    (b"plain", None, (), None, None),
    (b"keyed", b"k1", (), T0, None),
    (None, b"tombstone", (), T0 + 1, None),
    (b"timed", None, (), T0 + 2, 7),
    (b"all", b"k2", (("h", b"1"), ("nil", None)), T0 + 3, 8),
    (b"", b"", (("h", b""),), T0 + 4, None),
]


def broker(data_dir: str) -> contextlib.AbstractContextManager[tuple[str, BrokerServer]]:
    return broker_on_thread(data_dir, SECRET, LogConfig(flush="never"))


def read(endpoint: str, topic: str, count: int) -> list[Record]:
    with Subscriber(endpoint, topic, 0, secret=SECRET) as sub:
        return next_records(sub, count)


def check(records: list[Record], before_ms: int, after_ms: int) -> None:
    assert [r.offset for r in records] == list(range(len(SENT)))
    for record, (value, key, headers, timestamp, t) in zip(records, SENT, strict=True):
        assert (record.value, record.key) == (value, key)
        expected = ((TIME_HEADER, record.headers[0][1]),) if t is not None else ()
        assert tuple(record.headers) == expected + tuple(headers)
        if t is not None:
            assert decode_int64(record.headers[0][1]) == t
        if timestamp is None:
            assert before_ms <= record.timestamp <= after_ms
        else:
            assert record.timestamp == timestamp


def test_the_blocking_producer_sends_every_field_of_a_record_as_given(tmp_path) -> None:
    with broker(str(tmp_path)) as (endpoint, _):
        before = time.time_ns() // 1_000_000
        with Producer(endpoint, "fields", secret=SECRET) as producer:
            for value, key, headers, timestamp, t in SENT:
                producer.send(value, key=key, headers=headers, timestamp=timestamp, time=t)
        after = time.time_ns() // 1_000_000
        check(read(endpoint, "fields", len(SENT)), before, after)


def test_the_async_producer_sends_every_field_of_a_record_as_given(tmp_path) -> None:
    with broker(str(tmp_path)) as (endpoint, _):
        async def main() -> None:
            async with AsyncProducer(endpoint, "fields", secret=SECRET) as producer:
                for value, key, headers, timestamp, t in SENT:
                    await producer.send(value, key=key, headers=headers, timestamp=timestamp,
                                        time=t)

        before = time.time_ns() // 1_000_000
        asyncio.run(main())
        after = time.time_ns() // 1_000_000
        check(read(endpoint, "fields", len(SENT)), before, after)


def test_records_and_runs_keep_the_order_they_were_sent_in(tmp_path) -> None:
    with broker(str(tmp_path)) as (endpoint, _):
        with Producer(endpoint, "mixed", secret=SECRET, batch_records=3) as producer:
            producer.send(b"r0", time=1)
            producer.send_values([b"v1", b"v2"], time=1)
            producer.send(b"r3", time=2)
            producer.send(b"r4", time=2)
            producer.send_values([b"v5", b"v6", b"v7", b"v8"], time=3)
            producer.send(b"r9", key=b"k", time=3)
        records = read(endpoint, "mixed", 10)
    assert [r.value for r in records] == [b"r0", b"v1", b"v2", b"r3", b"r4", b"v5", b"v6",
                                          b"v7", b"v8", b"r9"]
    assert [decode_int64(r.headers[0][1]) for r in records] == [1, 1, 1, 2, 2, 3, 3, 3, 3, 3]
    assert [r.offset for r in records] == list(range(10))
