"""LocalDir: reading a data dir's segment files without opening (locking) the logs."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from catalog.errors import UnknownTopicError
from querylib.errors import CorruptDataError
from querylib.log import LogConfig, PartitionLog
from querylib.records import encode_batch, frontier_batch, iter_batches
from querylib.spark import DataLossError
from querylib.spark._local import LocalDir
from tests.spark._topics import append, create_topic, partition_path

pytestmark = pytest.mark.spark

SMALL = LogConfig(segment_bytes=4096, index_interval_bytes=512)


def batch(first: int, count: int = 10, size: int = 40) -> bytes:
    return encode_batch([(i, None, b"%06d" % (first + i) + b"x" * size, ())
                         for i in range(count)])


def offsets_read(local: LocalDir, topic: str, partition: int, start: int, stop: int,
                 **kwargs) -> list[int]:
    out = []
    for buf in local.read(topic, partition, start, stop, **kwargs):
        for b in iter_batches(buf):
            out += [r.offset for r in b.records] if not b.is_control else [b.base_offset]
    return out


def test_topics_partitions_and_ranges(tmp_path: Path) -> None:
    create_topic(tmp_path, "a", 3)
    create_topic(tmp_path, "t/ns/b", 1)
    (tmp_path / ".tq-kafka.json").write_text("{}")
    (tmp_path / "not a partition").mkdir()
    append(tmp_path, "a", 1, [batch(0), frontier_batch(10, timestamp=1), batch(11)])
    local = LocalDir(str(tmp_path))
    assert local.topics() == {"a": 3, "t/ns/b": 1}
    assert local.partitions("a") == 3 and local.partitions("persistent://t/ns/b") == 1
    assert local.offset_range("a", 0) == (0, 0)
    assert local.offset_range("a", 1) == (0, 21)
    with pytest.raises(UnknownTopicError, match="no zz-0 directory"):
        local.partitions("zz")


def test_reads_across_segments_from_any_offset(tmp_path: Path) -> None:
    append(tmp_path, "a", 0, [batch(10 * i) for i in range(60)], SMALL)
    local = LocalDir(str(tmp_path))
    segments = [n for n in os.listdir(partition_path(tmp_path, "a", 0)) if n.endswith(".log")]
    assert len(segments) > 5
    assert local.offset_range("a", 0) == (0, 600)
    for start, stop in [(0, 600), (95, 96), (123, 457), (590, 600)]:
        got = offsets_read(local, "a", 0, start, stop, chunk_bytes=1000)
        assert got[0] <= start and got[-1] >= stop - 1
        assert [o for o in got if start <= o < stop] == list(range(start, stop))


def test_a_batch_larger_than_a_chunk(tmp_path: Path) -> None:
    append(tmp_path, "a", 0, [batch(0, 5), batch(5, 200, 500), batch(205, 5)])
    got = offsets_read(LocalDir(str(tmp_path)), "a", 0, 0, 210, chunk_bytes=4096)
    assert got == list(range(210))


def test_reads_while_the_owner_appends(tmp_path: Path) -> None:
    """The owner holds the log's lock and appends; readers see whole batches only."""
    log = PartitionLog.open(partition_path(tmp_path, "a", 0), SMALL)
    local = LocalDir(str(tmp_path))
    done = threading.Event()

    def write() -> None:
        for i in range(300):
            log.append(batch(10 * i))
        done.set()

    writer = threading.Thread(target=write)
    writer.start()
    try:
        seen = 0
        for _ in range(10_000):  # bounded; each step reads what is there
            _start, end = local.offset_range("a", 0)
            assert end % 10 == 0 and end >= seen
            got = offsets_read(local, "a", 0, seen, end)
            assert [o for o in got if o >= seen] == list(range(seen, end))
            seen = end
            if done.is_set() and seen == 3000:
                break
        assert seen == 3000
    finally:
        writer.join()
        log.close()


def test_torn_tail_and_stale_index_are_ignored(tmp_path: Path) -> None:
    append(tmp_path, "a", 0, [batch(10 * i) for i in range(20)], SMALL)
    path = partition_path(tmp_path, "a", 0)
    last = sorted(n for n in os.listdir(path) if n.endswith(".log"))[-1]
    with open(os.path.join(path, last), "ab") as f:
        f.write(batch(999)[:30])  # a batch cut short, as after a crash
    index = os.path.join(path, last[:-4] + ".index")
    with open(index, "wb") as f:  # entries pointing into the middle of batches
        f.write((1).to_bytes(4, "big") + (7).to_bytes(4, "big"))
    local = LocalDir(str(tmp_path))
    assert local.offset_range("a", 0)[1] == 200
    assert offsets_read(local, "a", 0, 0, 200)[-1] == 199
    base = int(last[:-4])
    assert [o for o in offsets_read(local, "a", 0, base + 15, 200) if o >= base + 15] == list(
        range(base + 15, 200))


def test_offsets_removed_by_retention(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=4096, retention_bytes=8192)
    append(tmp_path, "a", 0, [batch(10 * i) for i in range(40)], config)
    log = PartitionLog.open(partition_path(tmp_path, "a", 0), config)
    assert log.apply_retention() > 0
    first = log.log_start_offset
    log.close()
    local = LocalDir(str(tmp_path))
    assert local.offset_range("a", 0) == (first, 400)
    with pytest.raises(DataLossError, match="failOnDataLoss=false"):
        list(local.read("a", 0, 0, 400))
    got = offsets_read(local, "a", 0, 0, 400, fail_on_data_loss=False)
    assert got == list(range(first, 400))


def _flip_batch(path: str, segment_index: int, batch_index: int,
                at_header: bool = False) -> tuple[int, int]:
    """Flip 16 bytes in the middle of a batch of a segment file (or from its length field
    on); (base offset, next offset) of the batch."""
    name = sorted(n for n in os.listdir(path) if n.endswith(".log"))[segment_index]
    with open(os.path.join(path, name), "r+b") as f:
        data = f.read()
        pos = 0
        for _ in range(batch_index):
            pos += 12 + int.from_bytes(data[pos + 8:pos + 12], "big")
        size = 12 + int.from_bytes(data[pos + 8:pos + 12], "big")
        base = int.from_bytes(data[pos:pos + 8], "big")
        delta = int.from_bytes(data[pos + 23:pos + 27], "big")
        at = pos + 8 if at_header else pos + size // 2 - 8
        f.seek(at)
        f.write(bytes(b ^ 0x3C for b in data[at:at + 16]))
    return base, base + delta + 1


@pytest.mark.parametrize("recorded", [True, False])
def test_damaged_offsets_fail_and_the_rest_is_read(tmp_path: Path, recorded: bool) -> None:
    """Damage the broker recorded (it reopened the log since), or a header not checked yet:
    the damaged offsets fail with CorruptDataError, never skipped; offsets around them read."""
    append(tmp_path, "a", 0, [batch(10 * i) for i in range(60)], SMALL)
    path = partition_path(tmp_path, "a", 0)
    first, end = _flip_batch(path, 2, 3, at_header=not recorded)
    if recorded:
        PartitionLog.open(path, SMALL).close()
    local = LocalDir(str(tmp_path))
    with pytest.raises(CorruptDataError) as caught:
        offsets_read(local, "a", 0, 0, 600)
    assert (caught.value.start_offset, caught.value.kafka_error_code) == (first, 2)
    assert caught.value.end_offset == end if recorded else caught.value.end_offset > first
    assert [o for o in offsets_read(local, "a", 0, 0, first) if o < first] == list(range(first))
    if recorded:
        assert [o for o in offsets_read(local, "a", 0, end, 600) if o >= end] == list(
            range(end, 600))
