"""A broker on loopback (in a thread of this process, real sockets and files) under each flush
policy: acknowledgements wait for the policy ("interval" needs the broker's own flush timer,
since nothing else flushes once appends stop), and subscribers see exactly the acknowledged
data, as the stored bytes."""

from __future__ import annotations

import contextlib
import os

import pytest

from querylib.broker import Data, EndOfStream, Producer, Subscriber
from querylib.log import LogConfig
from querylib.server.broker import BrokerServer

from ._broker_helpers import broker_on_thread

SECRET = os.urandom(32)


def broker(data_dir: str, config: LogConfig
           ) -> contextlib.AbstractContextManager[tuple[str, BrokerServer]]:
    return broker_on_thread(data_dir, SECRET, config)


@pytest.mark.parametrize("flush", ["always", "interval", "never"])
def test_every_policy_acknowledges_and_delivers_everything(tmp_path, flush):
    config = LogConfig(flush=flush, flush_interval_ms=50)
    with broker(str(tmp_path), config) as (endpoint, server):
        with Producer(endpoint, "p", secret=SECRET, batch_records=50) as producer:
            for i in range(500):
                producer.send(f"{i}".encode(), time=i // 100)
                if i % 100 == 99:
                    producer.advance(i // 100 + 1)
            producer.flush()
            core = producer.core  # what to look at when it fails (seen under heavy load)
            assert producer.last_acked.next_offset >= 500, (
                f"last ack {producer.last_acked}, {core.acked_batches} batches acked, "
                f"{core.resent} sent again, stats {server.statistics()}")
        with Subscriber(endpoint, "p", 0, secret=SECRET) as sub:
            events = list(sub)
        values = [r.value for e in events if isinstance(e, Data) for r in e.records]
        assert values == [f"{i}".encode() for i in range(500)]
        assert isinstance(events[-1], EndOfStream)
        assert server.statistics()["bugs"] == 0


def test_tail_and_catch_up_deliver_the_bytes_the_log_stores(tmp_path):
    with broker(str(tmp_path), LogConfig()) as (endpoint, _):
        chunks: list[bytes] = []
        with Subscriber(endpoint, "b", 0, secret=SECRET, create=True) as tail:
            with Producer(endpoint, "b", secret=SECRET, batch_records=7) as producer:
                for i in range(300):
                    producer.send(b"x" * (i % 13), key=b"k")
            while True:
                chunk = tail.next_chunk(timeout=30)
                assert chunk is not None
                chunks.append(bytes(chunk.data))
                tail.consumed(chunk)
                if chunk.next_offset >= producer.last_acked.next_offset + 1:  # + end-of-stream
                    break
        with Subscriber(endpoint, "b", 0, secret=SECRET, credit=1000) as late:
            late_chunks = []
            while late.positions[0] < chunk.next_offset:
                c = late.next_chunk(timeout=30)
                late_chunks.append(bytes(c.data))
                late.consumed(c)
    segment = (tmp_path / "b-0" / ("0" * 20 + ".log")).read_bytes()
    assert b"".join(chunks) == segment  # from memory, as the batches were appended
    assert b"".join(late_chunks) == segment  # from disk


def test_appends_that_roll_segments_keep_order_and_acks_under_never(tmp_path):
    """Under "never" a commit that rolls its segment is written off the loop, and the
    partition's later batches queue behind it (tests/querylib/server/broker/test_appender.py):
    a producer rolling many segments still has every batch acknowledged, in order, and read
    back in order, while another partition's producer writes beside it."""
    config = LogConfig(segment_bytes=4096)
    with broker(str(tmp_path), config) as (endpoint, server):
        with Producer(endpoint, "bulk", secret=SECRET, batch_records=20) as bulk, \
                Producer(endpoint, "probe", secret=SECRET, batch_records=1) as probe:
            for i in range(2000):
                bulk.send(b"%06d" % i + bytes(94))
                if i % 100 == 0:
                    probe.send(b"%d" % i)
            bulk.flush()
            probe.flush()
            assert bulk.last_acked.next_offset == 2000
            assert probe.last_acked.next_offset == 20
        segments = server.partition_log(("bulk", 0)).segment_count
        for topic, expected in (("bulk", [b"%06d" % i + bytes(94) for i in range(2000)]),
                                ("probe", [b"%d" % i for i in range(0, 2000, 100)])):
            with Subscriber(endpoint, topic, 0, secret=SECRET) as sub:
                values = [r.value for e in sub if isinstance(e, Data) for r in e.records]
            assert values == expected
        assert segments > 20  # ~2,200 bytes per batch of 20: each commit rolled
        assert server.statistics()["bugs"] == 0
