"""LocalBackend over a real data directory: topics, appends with idempotence, reads as file
slices, offsets, waits, producer ids and the group store, across reopenings."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest

from catalog.errors import (
    InvalidPartitionsError,
    InvalidTopicNameError,
    ReservedTopicNameError,
    TopicExistsError,
    UnknownTopicError,
)
from querylib.errors import CorruptRecordError, OffsetOutOfRangeError
from querylib.kafka import (
    OFFSETS_TOPIC,
    CommittedOffset,
    GroupMemberRecord,
    GroupRecord,
    InvalidTopicError,
    LocalBackend,
    OutOfOrderSequenceError,
    UnknownPartitionError,
)
from querylib.log import LogConfig, PartitionLog
from querylib.records import decode_batch, encode_batch, iter_batches

T = TypeVar("T")


def run(data_dir: Path, body: Callable[[LocalBackend], Awaitable[T]], **options) -> T:
    async def main() -> T:
        backend = await LocalBackend.open(data_dir, **options)
        try:
            return await body(backend)
        finally:
            await backend.close()

    return asyncio.run(main())


def batch(*values: bytes, ts: int = 1_700_000_000_000, **kwargs) -> bytes:
    return encode_batch([(ts + i, b"k", v, (("h", b"x"),)) for i, v in enumerate(values)],
                        **kwargs)


def test_existing_partitions_are_served_and_offsets_topic_is_created(tmp_path: Path) -> None:
    with PartitionLog.open(tmp_path / "numbers-0") as log:
        log.append(batch(b"a", b"b"))
    with PartitionLog.open(tmp_path / "numbers-1") as log:
        log.append(batch(b"c"))

    async def body(backend: LocalBackend):
        return await backend.topics(), await backend.offsets("numbers", 0)

    topics, offsets = run(tmp_path, body)
    assert [(t.name, len(t.partitions), t.internal) for t in topics] == [
        (OFFSETS_TOPIC, 1, True), ("numbers", 2, False)]
    assert (offsets.log_start_offset, offsets.high_watermark) == (0, 2)
    assert (tmp_path / f"{OFFSETS_TOPIC}-0").is_dir()


def test_create_topic_and_its_refusals(tmp_path: Path) -> None:
    async def body(backend: LocalBackend) -> None:
        info = await backend.create_topic("events", 3)
        assert [p.index for p in info.partitions] == [0, 1, 2]
        assert [t.name for t in await backend.topics(["events", "nope"])] == ["events"]
        with pytest.raises(TopicExistsError):
            await backend.create_topic("events")
        with pytest.raises(ReservedTopicNameError):
            await backend.create_topic("__mine")
        with pytest.raises(InvalidTopicNameError):
            await backend.create_topic("bad name")
        with pytest.raises(InvalidPartitionsError):
            await backend.create_topic("zero", 0)
        tenant = await backend.create_topic("acme/prod/orders")
        assert tenant.name == "acme/prod/orders"

    run(tmp_path, body)
    assert sorted(os.listdir(tmp_path))[:4] == [
        ".tq-kafka.json", f"{OFFSETS_TOPIC}-0", "acme%2Fprod%2Forders-0", "events-0"]


def test_append_then_read_serves_the_stored_bytes(tmp_path: Path) -> None:
    async def body(backend: LocalBackend) -> None:
        await backend.create_topic("t")
        first = await backend.append("t", 0, [batch(b"a", b"b")], acks=1)
        second = await backend.append("t", 0, [batch(b"c")], acks=-1)
        assert (first.base_offset, second.base_offset) == (0, 2)
        read = await backend.read("t", 0, 1, 1 << 20)
        try:
            data = b"".join(c.read() for c in read.chunks)
        finally:
            read.close()
        assert data == backend.log("t", 0).read(0, 1 << 20)
        assert [r.value for b in iter_batches(data) for r in b.records] == [b"a", b"b", b"c"]
        assert read.offsets.high_watermark == 3
        empty = await backend.read("t", 0, 3, 1 << 20)
        assert empty.chunks == [] and empty.size == 0
        with pytest.raises(OffsetOutOfRangeError):
            await backend.read("t", 0, 4, 100)
        with pytest.raises(UnknownTopicError):
            await backend.append("nope", 0, [batch(b"x")], acks=1)
        with pytest.raises(UnknownPartitionError):
            await backend.append("t", 1, [batch(b"x")], acks=1)
        with pytest.raises(InvalidTopicError):
            await backend.append(OFFSETS_TOPIC, 0, [batch(b"x")], acks=1)
        corrupt = bytearray(batch(b"x"))
        corrupt[-1] ^= 1
        with pytest.raises(CorruptRecordError):
            await backend.append("t", 0, [bytes(corrupt)], acks=1)

    run(tmp_path, body)


def test_idempotent_retries_are_not_appended_twice(tmp_path: Path) -> None:
    async def body(backend: LocalBackend) -> None:
        await backend.create_topic("t")
        pid = await backend.allocate_producer_id()
        b0 = batch(b"a", b"b", producer_id=pid, producer_epoch=0, base_sequence=0)
        b1 = batch(b"c", producer_id=pid, producer_epoch=0, base_sequence=2)
        assert (await backend.append("t", 0, [b0], acks=-1)).base_offset == 0
        assert (await backend.append("t", 0, [b1], acks=-1)).base_offset == 2
        assert (await backend.append("t", 0, [b0], acks=-1)).base_offset == 0  # a retry
        assert (await backend.offsets("t", 0)).high_watermark == 3
        gap = batch(b"d", producer_id=pid, producer_epoch=0, base_sequence=9)
        with pytest.raises(OutOfOrderSequenceError):
            await backend.append("t", 0, [gap], acks=1)

    run(tmp_path, body)


def test_offset_for_timestamp(tmp_path: Path) -> None:
    async def body(backend: LocalBackend) -> None:
        await backend.create_topic("t")
        await backend.append("t", 0, [batch(b"a", b"b", ts=1000)], acks=1)
        await backend.append("t", 0, [batch(b"c", ts=5000)], acks=1)
        assert await backend.offset_for_timestamp("t", 0, 1001) == (1, 1001)
        assert await backend.offset_for_timestamp("t", 0, 1002) == (2, 5000)
        assert await backend.offset_for_timestamp("t", 0, 5001) is None

    run(tmp_path, body)


def test_wait_for_data_returns_when_an_append_arrives(tmp_path: Path) -> None:
    async def body(backend: LocalBackend) -> None:
        await backend.create_topic("t")
        waiter = asyncio.create_task(backend.wait_for_data([("t", 0, 0)], 60))
        await asyncio.sleep(0)
        assert not waiter.done()
        await backend.append("t", 0, [batch(b"a")], acks=1)
        await asyncio.wait_for(waiter, 10)
        # data already there: no wait at all
        await asyncio.wait_for(backend.wait_for_data([("t", 0, 0)], 60), 10)

    run(tmp_path, body)


def test_interval_flush_makes_data_visible_without_another_append(tmp_path: Path) -> None:
    config = LogConfig(flush="interval", flush_interval_ms=50)

    async def body(backend: LocalBackend) -> None:
        await backend.create_topic("t")
        await backend.append("t", 0, [batch(b"a")], acks=1)
        await asyncio.wait_for(backend.wait_for_data([("t", 0, 0)], 60), 10)
        assert (await backend.offsets("t", 0)).high_watermark == 1

    run(tmp_path, body, log_config=config)


def test_producer_ids_cluster_id_and_group_store_survive_reopening(tmp_path: Path) -> None:
    member = GroupMemberRecord("m", None, "c", "/h", 300, 100, b"sub", b"asg")
    group = GroupRecord("g", "consumer", 3, "range", "m", 42, (member,))

    async def first(backend: LocalBackend):
        ids = [await backend.allocate_producer_id() for _ in range(3)]
        await backend.store_offsets("g", [CommittedOffset("t", 0, 10, -1, "m", 1)])
        await backend.store_offsets("g", [CommittedOffset("t", 0, 12, -1, "", 2),
                                          CommittedOffset("t", 1, 5, -1, "", 2)])
        await backend.store_group(group)
        return ids, backend.cluster_id

    async def second(backend: LocalBackend):
        return (await backend.allocate_producer_id(), backend.cluster_id,
                await backend.committed_offsets("g"), await backend.stored_groups())

    ids, cluster = run(tmp_path, first)
    pid, cluster_again, committed, groups = run(tmp_path, second)
    assert ids == [0, 1, 2] and pid > 2
    assert cluster_again == cluster and cluster
    assert {k: v.offset for k, v in committed.items()} == {("t", 0): 12, ("t", 1): 5}
    assert groups == [group]
    # and the records are Kafka's formats in a real partition log
    with PartitionLog.open(tmp_path / f"{OFFSETS_TOPIC}-0") as log:
        data = log.read(0, 1 << 20)
    keys = [r.key[:2] for b in iter_batches(data) for r in b.records]
    assert keys == [b"\x00\x01", b"\x00\x01", b"\x00\x01", b"\x00\x02"]
    assert decode_batch(data).records[0].value[:2] == b"\x00\x03"
