"""Topic names a broker hosts: the short form of every catalog name (`tenant/ns/name` too), one
spelling per topic, stored in `%2F`-escaped directories; and the in-process port endpoints use
(`BrokerPort`: sessions, partition info, the log for reads) on a real BrokerServer."""

from __future__ import annotations

import asyncio
import os

import pytest

from querylib.broker import (
    InvalidTopicError,
    OpenProducerRequest,
    ProduceRequest,
    UnknownPartitionError,
)
from querylib.broker._stream import encode_records
from querylib.log import LogConfig
from querylib.records import iter_batches
from querylib.server.broker import BrokerServer
from querylib.server.broker._disk import find_partitions, open_partition, validate_partition

SECRET = b"0123456789abcdef0123456789abcdef"


@pytest.mark.parametrize("topic", ["t/ns/events", "numbers", "a-b/c.d/__x", "t/ns/my-topic-3"])
def test_short_forms_are_hostable(topic):
    assert validate_partition(topic, 2) == (topic, 2)


@pytest.mark.parametrize("topic", ["public/default/numbers", "persistent://t/ns/events",
                                   "persistent://public/default/numbers"])
def test_other_spellings_are_refused_naming_the_short_form(topic):
    with pytest.raises(InvalidTopicError, match="short form"):
        validate_partition(topic, 0)


@pytest.mark.parametrize("topic", ["a/b", "t/ns/", "t%2Fns%2Fx", "t/ns/x/y"])
def test_malformed_names_are_refused(topic):
    with pytest.raises(InvalidTopicError):
        validate_partition(topic, 0)


def test_tenant_topics_live_in_escaped_directories(tmp_path):
    opened = open_partition(str(tmp_path), ("t/ns/my-events", 3), LogConfig())
    opened.log.close()
    assert os.listdir(tmp_path) == ["t%2Fns%2Fmy-events-3"]
    (tmp_path / "t%2fns%2fx-0").mkdir()  # not the canonical escape: ignored, not misread
    assert find_partitions(str(tmp_path)) == [("t/ns/my-events", 3)]


def test_the_port_appends_and_reads_a_tenant_topic(tmp_path):
    async def scenario() -> tuple[bytes, list[int]]:
        server = BrokerServer(tmp_path, SECRET, log_config=LogConfig())
        await server.start(None)  # the in-process port alone
        port = server.port
        try:
            with pytest.raises(UnknownPartitionError):
                await port.ensure("t/ns/feed", 0, create=False)
            link = port.link("anonymous")
            await link.start()
            pid = ("t/ns/feed", 0)
            await link.request(OpenProducerRequest(session=link.session, topic=pid[0],
                                                   partition=pid[1]))
            assert port.hosts(pid)  # opening the producer opened the partition
            batch = encode_records([(b"k", b"v", (), 0, 1)])
            await link.request(ProduceRequest(session=link.session, topic=pid[0],
                                              partition=pid[1]), payload=[batch])
            assert port.info(pid).log_end == 1
            data = port.log(pid).read(0, 1 << 20, end_offset=port.info(pid).log_end)
            with pytest.raises(UnknownPartitionError):
                port.log(("t/ns/other", 0))
            await link.close()
            return data, [b.base_offset for b in iter_batches(data)]
        finally:
            await server.close()

    data, offsets = asyncio.run(scenario())
    assert offsets == [0]
    records = [r for b in iter_batches(data) for r in b.records]
    assert [(r.key, r.value) for r in records] == [(b"k", b"v")]
    assert find_partitions(str(tmp_path)) == [("t/ns/feed", 0)]
