"""One partition pushed to many subscribers (issue 17's fan-out): a broker on loopback (in a
thread of this process, real sockets and files). Every subscriber gets every batch once and
in order, and a payload pushed to all of them is hashed once for its signatures (each push
is still signed for its own subscriber: DESIGN §2 "What is signed")."""

from __future__ import annotations

import os

from querylib.broker import Data, Producer, Subscriber
from querylib.broker._stream import encode_records
from querylib.log import LogConfig

from ._broker_helpers import broker_on_thread

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
        # 6 subscribers x 40 batches took at least 40 pushes each; their payloads were
        # hashed once each, not once a subscriber (a catch-up read hashes its own bytes).
        assert 1 <= server.counters["push_digests"] <= batches
