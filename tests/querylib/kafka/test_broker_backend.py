"""BrokerBackend over a real BrokerServer in this process (standalone: the broker alone is the
cluster): producer batches go through the broker (its lane writes the log), idempotent retries
are answered with the original offset, reads stop at what subscribers may see, a waiting fetch
wakes on an append, tenant topics work, and committed offsets and groups survive a restart of
the broker."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest

from catalog.errors import ReservedTopicNameError, TopicExistsError
from querylib.broker import BrokerServer
from querylib.kafka import (
    BrokerBackend,
    CommittedOffset,
    GroupRecord,
    InvalidTopicError,
    KafkaConfig,
    OutOfOrderSequenceError,
    UnknownPartitionError,
)
from querylib.log import LogConfig
from querylib.records import encode_batch, iter_batches

T = TypeVar("T")
SECRET = b"0123456789abcdef0123456789abcdef"


def run(data_dir: Path, body: Callable[[BrokerBackend], Awaitable[T]]) -> T:
    async def main() -> T:
        server = BrokerServer(data_dir, SECRET, log_config=LogConfig())
        await server.start("tcp://127.0.0.1:0")
        backend = await BrokerBackend(server, KafkaConfig(port=0), secret=SECRET).open()
        try:
            return await body(backend)
        finally:
            await backend.close()
            await server.close()

    return asyncio.run(main())


def batch(*values: bytes, **kwargs) -> bytes:
    return encode_batch([(1_700_000_000_000 + i, b"k", v, ()) for i, v in enumerate(values)],
                        **kwargs)


def values(read) -> list[bytes]:
    data = b"".join(c if isinstance(c, bytes) else c.read() for c in read.chunks)
    return [r.value for b in iter_batches(data) for r in b.records]


def test_appends_go_through_the_broker_and_read_back(tmp_path: Path) -> None:
    async def body(backend: BrokerBackend) -> None:
        created = await backend.create_topic("acme/lab/raw", 2)
        assert [p.index for p in created.partitions] == [0, 1]
        with pytest.raises(TopicExistsError):
            await backend.create_topic("acme/lab/raw", 1)
        with pytest.raises(ReservedTopicNameError):
            await backend.create_topic("__mine", 1)
        first = await backend.append("acme/lab/raw", 1, [batch(b"a", b"b")], acks=-1)
        second = await backend.append("acme/lab/raw", 1, [batch(b"c")], acks=1)
        assert (first.base_offset, second.base_offset) == (0, 2)
        offsets = await backend.offsets("acme/lab/raw", 1)
        assert offsets.high_watermark == offsets.last_stable_offset == 3
        read = await backend.read("acme/lab/raw", 1, 0, 1 << 20)
        try:
            assert values(read) == [b"a", b"b", b"c"]
        finally:
            read.close()
        names = [t.name for t in await backend.topics()]
        assert "acme/lab/raw" in names and "__consumer_offsets" in names
        with pytest.raises(UnknownPartitionError):
            await backend.read("nothing", 0, 0, 100)
        with pytest.raises(InvalidTopicError):
            await backend.append("__consumer_offsets", 0, [batch(b"x")], acks=1)

    run(tmp_path, body)


def test_idempotent_retries_and_gaps(tmp_path: Path) -> None:
    async def body(backend: BrokerBackend) -> None:
        await backend.create_topic("t", 1)
        pid = await backend.allocate_producer_id()
        assert pid >> 32 == 0  # the standalone broker is node 0
        b0 = batch(b"a", b"b", producer_id=pid, producer_epoch=0, base_sequence=0)
        assert (await backend.append("t", 0, [b0], acks=-1)).base_offset == 0
        assert (await backend.append("t", 0, [b0], acks=-1)).base_offset == 0  # a retry
        with pytest.raises(OutOfOrderSequenceError):
            await backend.append("t", 0, [batch(b"c", producer_id=pid, producer_epoch=0,
                                                base_sequence=7)], acks=-1)
        assert (await backend.offsets("t", 0)).high_watermark == 2

    run(tmp_path, body)


def test_a_waiting_fetch_wakes_on_an_append(tmp_path: Path) -> None:
    async def body(backend: BrokerBackend) -> bool:
        await backend.create_topic("t", 1)
        waiting = asyncio.ensure_future(backend.wait_for_data([("t", 0, 0)], 60.0))
        await asyncio.sleep(0)  # let the wait register before the append
        await backend.append("t", 0, [batch(b"a")], acks=1)
        await asyncio.wait_for(waiting, 30.0)
        return waiting.done()

    assert run(tmp_path, body)


def test_commits_and_groups_survive_a_restart(tmp_path: Path) -> None:
    committed = CommittedOffset("t", 0, 42, metadata="m", commit_timestamp=5)
    group = GroupRecord("g", "consumer", 3, "range", "m1", 7)

    async def store(backend: BrokerBackend) -> list[int]:
        await backend.store_offsets("g", [committed])
        await backend.store_group(group)
        return [await backend.allocate_producer_id() for _ in range(3)]

    async def load(backend: BrokerBackend) -> tuple:
        return (dict(await backend.committed_offsets("g")), list(await backend.stored_groups()),
                await backend.allocate_producer_id())

    ids = run(tmp_path, store)
    offsets, groups, next_id = run(tmp_path, load)
    assert offsets == {("t", 0): committed} and groups == [group]
    assert next_id > max(ids)  # producer ids are never handed out twice
