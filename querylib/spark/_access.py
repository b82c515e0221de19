"""Where a query's partitions are, and how a Spark task reads one offset range.

`open_access(location)` gives the planning view (`TopicAccess`: topics, partition counts,
offset ranges) of a local data dir (`LocalDir`) or of a cluster (`ClusterTopics`);
`place_of` says where a task finds a partition: None for a data dir (the task reads the segment
files itself, on the same host), a `PartitionPlace` (broker address, secret file) for a
cluster. `read_range` runs in a Spark task: buffers of whole batches from either, turned into
Arrow record batches.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator

import pyarrow as pa

from querylib.spark._cluster import ClusterTopics, PartitionPlace, broker_read
from querylib.spark._columns import ColumnAssembler
from querylib.spark._local import LocalDir
from querylib.spark._options import Location
from querylib.spark._plan import OffsetRange, TopicAccess

__all__ = ["close_access", "open_access", "place_of", "read_range"]


def open_access(location: Location) -> TopicAccess:
    """The topics at `location`: a data dir read directly, or a cluster (the coordinator
    named by option coordinator, else TQ_COORDINATOR or $TQ_HOME/cluster.json)."""
    if location.data_dir:
        return LocalDir(location.data_dir)
    return ClusterTopics(location)


def close_access(access: TopicAccess) -> None:
    if isinstance(access, ClusterTopics):
        access.close()


def place_of(access: TopicAccess, topic: str, partition: int) -> PartitionPlace | None:
    if isinstance(access, ClusterTopics):
        return access.place(topic, partition)
    return None


def read_range(location: Location, task: OffsetRange, place: PartitionPlace | None, *,
               fail_on_data_loss: bool = True,
               include_headers: bool = False) -> Iterator[pa.RecordBatch]:
    """Arrow record batches of the records of one offset range (control records skipped)."""
    if task.start >= task.stop:
        return
    chunks: Generator[bytes | memoryview, None, None]
    if place is not None:
        chunks = broker_read(place, task.topic, task.partition, task.start, task.stop)
    else:
        assert location.data_dir is not None
        chunks = LocalDir(location.data_dir).read(task.topic, task.partition, task.start,
                                                  task.stop, fail_on_data_loss=fail_on_data_loss)
    assembler = ColumnAssembler(task.topic, task.partition, task.start, task.stop,
                                include_headers=include_headers)
    try:
        for buf in chunks:
            yield from assembler.add(buf)
            if assembler.done:
                break
    finally:
        chunks.close()  # ends a broker subscription at once
    yield from assembler.finish()
