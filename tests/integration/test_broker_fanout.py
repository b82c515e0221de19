"""One partition pushed to many subscribers (issue 17's fan-out): a broker on loopback (in a
thread of this process, real sockets and files). Every subscriber gets every batch once and
in order, and a payload pushed to all of them is hashed once for its signatures (each push
is still signed for its own subscriber: DESIGN §2 "Messages and signing")."""

from __future__ import annotations

import os

from querylib.broker import Data, Producer, Subscriber
from querylib.broker._stream import encode_records
from querylib.log import LogConfig

from ._broker_helpers import broker_on_thread, read_records

SECRET = os.urandom(32)


def test_every_subscriber_gets_every_batch_once_in_order_hashed_once(tmp_path) -> None:
    subscribers, batches, per_batch = 6, 40, 3
    with broker_on_thread(str(tmp_path), SECRET, LogConfig(flush="never")) as (endpoint,
                                                                               server):
        subs = [Subscriber(endpoint, "fan", 0, secret=SECRET, create=True)
                for _ in range(subscribers)]
        try:
            with Producer(endpoint, "fan", 0, secret=SECRET, linger=0.0) as producer:
                for b in range(batches):
                    producer.send_batch(encode_records(
                        [(None, f"{b}:{i}".encode(), (), 0, None) for i in range(per_batch)]))
                producer.flush()
            expected = [f"{b}:{i}".encode() for b in range(batches) for i in range(per_batch)]
            for sub in subs:
                got: list[tuple[int, bytes]] = []
                while len(got) < len(expected):
                    event = sub.next_event(timeout=30)
                    assert event is not None, f"only {len(got)} records arrived"
                    if isinstance(event, Data):
                        got += [(r.offset, r.value or b"") for r in event.records]
                assert [v for _, v in got] == expected
                assert [o for o, _ in got] == list(range(len(expected)))
        finally:
            for sub in subs:
                sub.close()
        # 6 subscribers x 40 batches: up to 240 pushes at the tail, but each payload was
        # hashed once, not once a subscriber. A subscription that landed after the first
        # batches catches up with one read first (under 1 MiB: one), hashing its own bytes.
        assert 1 <= server.counters["push_digests"] <= batches + subscribers


def test_big_batches_pushed_to_many_subscribers_arrive_whole(tmp_path) -> None:
    """Batches over zmq's copy threshold go to every subscriber as one shared zmq frame:
    each subscriber still gets each one whole, once, in order, and verifies it."""
    subscribers, batches = 4, 12
    values = [bytes([b]) * 70_000 for b in range(batches)]  # 840 KB: one catch-up read
    with broker_on_thread(str(tmp_path), SECRET, LogConfig(flush="never")) as (endpoint,
                                                                               server):
        subs = [Subscriber(endpoint, "big", 0, secret=SECRET, create=True,
                           credit=16 * 1024 * 1024) for _ in range(subscribers)]
        try:
            with Producer(endpoint, "big", 0, secret=SECRET, linger=0.0) as producer:
                for value in values:
                    producer.send_batch(encode_records([(None, value, (), 0, None)]))
                producer.flush()
            for sub in subs:
                assert read_records(sub, batches) == list(enumerate(values))
        finally:
            for sub in subs:
                sub.close()
        assert 1 <= server.counters["push_digests"] <= batches + subscribers


def _write(endpoint: str, topic: str, values: list[bytes]) -> None:
    with Producer(endpoint, topic, 0, secret=SECRET, linger=0.0) as producer:
        for value in values:
            producer.send_batch(encode_records([(None, value, (), 0, None)]))
        producer.flush()


def test_subscribers_catching_up_at_one_position_share_one_read(tmp_path) -> None:
    """Six subscriptions from the start of a stored log: one read of the disk, hashed once,
    answers all six (the later ones from the kept read or the read under way), and each
    gets every record once, in order."""
    subscribers, values = 6, [f"v{i}".encode() * 50 for i in range(40)]
    with broker_on_thread(str(tmp_path), SECRET, LogConfig(flush="never")) as (endpoint,
                                                                               server):
        _write(endpoint, "stored", values)
        subs = [Subscriber(endpoint, "stored", 0, secret=SECRET, start="earliest")
                for _ in range(subscribers)]
        try:
            for sub in subs:
                assert read_records(sub, len(values)) == list(enumerate(values))
        finally:
            for sub in subs:
                sub.close()
        assert server.counters["push_digests"] == 1
        assert server.counters["log_reads"] == 1
        assert server.counters["shared_reads"] == subscribers - 1


def test_a_slow_subscriber_holds_no_shared_reads_and_stalls_no_one(tmp_path) -> None:
    """A subscriber that stops granting credit part way keeps nothing in memory for itself:
    the kept reads stay within their bound while a fast subscriber reads the whole log past
    it; the slow one, once it reads again, reads the rest from the disk, whole and in order."""
    values = [bytes([i]) * 20_000 for i in range(60)]  # 1.2 MB: many reads
    budget = 100_000
    with broker_on_thread(str(tmp_path), SECRET, LogConfig(flush="never"),
                          read_cache_bytes=budget) as (endpoint, server):
        _write(endpoint, "slow", values)
        slow = Subscriber(endpoint, "slow", 0, secret=SECRET, start="earliest",
                          credit=64 * 1024)
        fast = Subscriber(endpoint, "slow", 0, secret=SECRET, start="earliest",
                          credit=256 * 1024)
        try:
            first = slow.next_event(timeout=30)  # it reads once, then stops granting
            assert first is not None
            assert read_records(fast, len(values)) == list(enumerate(values))
            assert 0 < server.read_cache.bytes <= budget
            assert server.counters["log_reads"] > len(values) * 20_000 // (256 * 1024)
            got = [(r.offset, bytes(r.value or b"")) for r in getattr(first, "records", [])]
            got += read_records(slow, len(values) - len(got))
            assert got == list(enumerate(values))
            assert server.read_cache.bytes <= budget
        finally:
            slow.close()
            fast.close()
