"""A real `tq up` child process with its broker endpoints (connector, Kafka) on the ports a
test gives, the `tq` commands run against it, and reading a topic back through a querylib
subscriber on the broker the catalog names."""

from __future__ import annotations

from pathlib import Path

from querylib.broker import Data, EndOfStream, Subscriber
from querylib.records import Record
from querylib.rpc import load_secret
from tests.integration._up import Up


class UpWithEndpoints(Up):
    """`tq up` with its endpoints on free ports (or as given), one slot, and readers of what
    its brokers hold."""

    def __init__(self, home: Path, *extra: str, require_endpoints: bool = True) -> None:
        super().__init__(home, *extra, slots=1, require_endpoints=require_endpoints)

    def read(self, topic: str) -> list[tuple[bytes | None, bytes | None]]:
        """Every record of partition 0 of `topic` up to its end-of-stream."""
        return [(r.key, r.value) for r in self.records(topic)]

    def records(self, topic: str, count: int | None = None) -> list[Record]:
        """The records of partition 0 of `topic`, through the broker the catalog names: the
        first `count`, or all up to end-of-stream."""
        with self.cluster() as cluster:
            info = cluster.lookup_topic(topic)
        address = info.brokers[info.topic.locations[0]]
        secret = load_secret(self.info["secret_file"])
        records = []
        with Subscriber(address, info.topic.topic_name.short, [0], secret=secret,
                        start="earliest") as sub:
            while True:
                event = sub.next_event(30)
                assert event is not None, "the subscriber saw no end-of-stream"
                if isinstance(event, Data):
                    records += event.records
                    if count is not None and len(records) >= count:
                        return records
                elif isinstance(event, EndOfStream):
                    return records
