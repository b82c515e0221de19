"""Where each connector stream stands: the acknowledged point of reference per (program,
instance, stream id), kept in the system topic `__connector_offsets` and checked against the data.

Two sources, because either alone is wrong after a crash:

- The checkpoint: a record per stream in partition 0 of `__connector_offsets`, a real partition
  log of the same broker (key: msgpack [program, instance, stream_id]; value: msgpack
  `StreamProgress` without `verified`; the last record of a key wins). Replayed at start. It is
  written every `checkpoint_interval` seconds and when a stream's connection ends, so it lags;
  and before a stream's first append ever, so a stream without a record never wrote anything
  (if this topic were lost, that inference would be wrong: duplicates of what was appended
  before could then get through).
- The data partition: records carry their message id (tq.msgid) and their source (producerId),
  so `last_appended` finds the last id a stream appended after the checkpoint's offset. Data
  appended but not yet checkpointed is therefore not duplicated after a crash; and if the data
  partition lost its tail (a log truncated below the checkpoint), the scan says so and the
  connector is rewound.

The log grows by one small record per active stream and checkpoint interval and is never
compacted: replay costs O(history). Fine for thousands of streams checkpointed for months;
compaction is the fix if that stops being true. Blocking log reads run on a worker thread.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import msgspec

from catalog.errors import TqError
from querylib.broker import OpenProducerRequest, ProduceRequest
from querylib.connector._records import header_of, last_message_id
from querylib.errors import CorruptDataError
from querylib.log import PartitionLog
from querylib.records import decode_batch, encode_batch, read_header
from querylib.server.broker import BrokerPort, PortLink

__all__ = ["OFFSETS_TOPIC", "OffsetStore", "StreamKey", "StreamProgress", "backward_windows",
           "last_appended"]

logger = logging.getLogger("querylib.connector")

OFFSETS_TOPIC = "__connector_offsets"
_SESSION = "tq.connector-offsets"
_READ_BYTES = 1024 * 1024
_FIRST_WINDOW = 4096  # offsets; backward scans grow it x4 per step

StreamKey = tuple[str, str, int]  # (program, instance, stream_id)


class StreamProgress(msgspec.Struct):
    """What the endpoint knows of one stream."""

    name: str  # the stream name of its last NOTIFY
    topic: str  # broker topic and partition it was appended to
    partition: int
    processed: int | None  # last message id durably appended (a data record or a boundary)
    offset: int  # the data partition's end right after its last durable append
    verified: bool = False  # True once checked against the data partition by this process


class _Stored(msgspec.Struct, array_like=True):
    name: str
    topic: str
    partition: int
    processed: int | None
    offset: int


_encode_key = msgspec.msgpack.Encoder().encode
_encode_value = msgspec.msgpack.Encoder().encode
_decode_key = msgspec.msgpack.Decoder(tuple[str, str, int]).decode
_decode_value = msgspec.msgpack.Decoder(_Stored).decode


def _batches(log: PartitionLog, start: int, end: int) -> Iterator[tuple[bytes, int]]:
    """(batch bytes, position) of every batch with base offset in [start, end)."""
    offset = start
    while offset < end:
        try:
            data = log.read(offset, _READ_BYTES, end_offset=end)
        except CorruptDataError as exc:
            # Progress records are superseded by later ones, and a damaged data batch cannot
            # be a stream's resume point: go on after the range (a resume may repeat data).
            logger.error("%s: skipping damaged records: %s", log.path, exc)
            offset = max(exc.end_offset, offset + 1)
            continue
        if not data:
            return
        pos = 0
        while pos < len(data):
            size, _, next_offset, _ = header_of(data, pos)
            yield data, pos
            pos += size
            offset = next_offset


def backward_windows(low: int, high: int) -> Iterator[tuple[int, int]]:
    """The offset windows [lo, hi) a scan for the last of something between `low` and `high`
    reads, newest first, each 4x the one before: a recent find costs a small read however
    long the partition is. The local scan (`last_appended`) and a remote one (a shard's
    partition, `_partitions.py`) walk the same windows."""
    window = _FIRST_WINDOW
    while high > low:
        lo = max(low, high - window)
        yield lo, high
        high = lo
        window *= 4


def last_appended(log: PartitionLog, producer_id: int, start: int) -> tuple[int, int] | None:
    """(last message id, offset after its batch) of the last data batch written by
    `producer_id` at or after offset `start`, or None. Blocking; scans backwards from the end
    (`backward_windows`)."""
    for lo, high in backward_windows(max(start, log.log_start_offset), log.log_end_offset):
        # Base offsets only: the matching batches are read again one by one, so memory stays
        # at one read however many of them the window holds.
        found = [
            read_header(data, pos).base_offset
            for data, pos in _batches(log, lo, high)
            if (h := header_of(data, pos))[1] == producer_id and not h[3]
        ]
        for base in reversed(found):
            data = log.read(base, 1, end_offset=base + 1)
            size, _, next_offset, _ = header_of(data, 0)
            mid = last_message_id(decode_batch(data[:size]))
            if mid is not None:
                return mid, next_offset
    return None


class OffsetStore:
    """The progress of every stream this broker has seen, checkpointed to `__connector_offsets`
    through a broker session of its own, as tq itself ("system": the topic is internal)."""

    def __init__(self, port: BrokerPort, *, lease: float = 30.0) -> None:
        self._port = port
        self._link: PortLink = port.link("system", lease=lease, session=_SESSION)
        self._producing = False
        self._progress: dict[StreamKey, StreamProgress] = {}
        self._dirty: set[StreamKey] = set()
        self._lock = asyncio.Lock()
        self._pid = (OFFSETS_TOPIC, 0)
        self.checkpoints = 0

    async def load(self) -> int:
        """Open (creating) the checkpoint partition and replay it; returns streams known."""
        self._pid = await self._port.ensure(OFFSETS_TOPIC, 0, create=True)
        log = self._port.log(self._pid)
        loop = asyncio.get_running_loop()
        stored = await loop.run_in_executor(None, _replay, log)
        for key, value in stored.items():
            self._progress[key] = StreamProgress(value.name, value.topic, value.partition,
                                                 value.processed, value.offset)
        self._link.on_reopen.append(self._forgotten)
        await self._link.start()
        await self._open_producer()
        return len(stored)

    async def _forgotten(self) -> None:
        self._producing = False  # the broker forgot the session (a stalled loop)

    async def _open_producer(self) -> None:
        await self._link.request(OpenProducerRequest(session=self._link.session,
                                                     topic=self._pid[0],
                                                     partition=self._pid[1]))
        self._producing = True

    async def close(self) -> None:
        await self._link.close()

    def get(self, key: StreamKey) -> StreamProgress | None:
        return self._progress.get(key)

    def streams_of(self, program: str, instance: str) -> dict[int, StreamProgress]:
        # O(streams known); fine below ~100k streams per broker, which a HELLO walks once.
        return {k[2]: p for k, p in self._progress.items() if k[0] == program and k[1] == instance}

    def put(self, key: StreamKey, progress: StreamProgress) -> None:
        self._progress[key] = progress
        self._dirty.add(key)

    def touch(self, key: StreamKey) -> None:
        if key in self._progress:
            self._dirty.add(key)

    async def checkpoint(self) -> None:
        """Append every changed stream's progress (one batch) and wait until it is durable."""
        async with self._lock:
            if not self._dirty:
                return
            keys, self._dirty = sorted(self._dirty), set()
            entries = []
            for key in keys:
                p = self._progress[key]
                value = _Stored(p.name, p.topic, p.partition, p.processed, p.offset)
                entries.append((0, _encode_key(key), _encode_value(value), ()))
            try:
                await self._append(entries)
            except BaseException:
                self._dirty.update(keys)  # try again next time
                raise
            self.checkpoints += 1

    async def _append(self, entries: list) -> None:
        batch = encode_batch(entries)
        request = ProduceRequest(session=self._link.session, topic=self._pid[0],
                                 partition=self._pid[1])
        try:
            if not self._producing:
                await self._open_producer()
            await self._link.request(request, payload=[batch])
        except TqError:
            # The session may have lapsed (a stalled loop outlived its lease): its link opens
            # it again; open the producer again and retry once.
            self._producing = False
            await self._link.reopen(self._link.generation)
            await self._open_producer()
            await self._link.request(request, payload=[batch])


def _replay(log: PartitionLog) -> dict[StreamKey, _Stored]:
    stored: dict[StreamKey, _Stored] = {}
    for data, pos in _batches(log, log.log_start_offset, log.log_end_offset):
        size, _, _, control = header_of(data, pos)
        if control:
            continue
        for record in decode_batch(data[pos:pos + size]).records:
            try:
                key = _decode_key(record.key or b"")
                stored[key] = _decode_value(record.value or b"")
            except msgspec.DecodeError:
                logger.warning("%s: skipping an undecodable checkpoint at offset %d",
                               OFFSETS_TOPIC, record.offset)
    return stored
