"""The PySpark data source `tq`: batch and streaming reads, and the writers' entry points.

    spark.read.format("tq").option("subscribe", "orders").load()       # the cluster
    spark.read.format("tq").option("subscribe", "orders").load("/var/lib/tq")   # a data dir
    spark.readStream.format("tq").option("subscribe", "orders").load()
    df.write.format("tq").option("topic", "out").mode("append").save()

PySpark runs the pieces in different processes: `reader`/`streamReader` and their planning
methods in a Python worker on the driver (a streaming reader lives there for the whole query),
`read` in Python workers of the executors. So planning resolves everything and hands each
task an `OffsetRangePartition` that says all it needs; `read` keeps no state.

Streaming offsets are log offsets per partition ({"topic": {"0": 23}}: the next offset to
read), so Spark's offset log and commits give exactly-once reads across restarts. Admission
control follows Spark's Kafka source: maxOffsetsPerTrigger caps a micro-batch (in proportion to
what each partition has), Trigger.AvailableNow reads up to the offsets latest at its start.
Partitions that appear while a stream runs (subscribePattern, new partitions) are read from
their start.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from querylib.spark._access import close_access, open_access, place_of, read_range
from querylib.spark._cluster import ClusterTopics, PartitionPlace
from querylib.spark._errors import BadOptionError
from querylib.spark._options import (
    Location,
    ReadOptions,
    include_headers,
    parse_read_options,
    parse_write_options,
)
from querylib.spark._plan import (
    OffsetRange,
    Offsets,
    TopicAccess,
    end_offsets,
    from_offsets_dict,
    rate_limit,
    resolve_partitions,
    split_ranges,
    start_offsets,
    to_offsets_dict,
)
from querylib.spark._schema import spark_schema
from querylib.spark._writer import TqBatchWriter, TqStreamWriter

__all__ = ["OffsetRangePartition", "TqDataSource"]


class OffsetRangePartition(InputPartition):
    """One Spark task: offsets [start, stop) of one topic partition, and where they are."""

    def __init__(self, location: Location, task: OffsetRange, place: PartitionPlace | None,
                 fail_on_data_loss: bool, include_headers: bool) -> None:
        super().__init__(None)
        self.location = location
        self.task = task
        self.place = place
        self.fail_on_data_loss = fail_on_data_loss
        self.include_headers = include_headers


def _read(partition: InputPartition) -> Iterator[pa.RecordBatch]:
    assert isinstance(partition, OffsetRangePartition)
    return read_range(partition.location, partition.task, partition.place,
                      fail_on_data_loss=partition.fail_on_data_loss,
                      include_headers=partition.include_headers)


def _tasks(access: TopicAccess, options: ReadOptions,
           ranges: list[OffsetRange]) -> list[OffsetRangePartition]:
    tasks = split_ranges(ranges, options.max_records_per_partition, options.min_partitions)
    return [OffsetRangePartition(options.location, t, place_of(access, t.topic, t.partition),
                                 options.fail_on_data_loss, options.include_headers)
            for t in tasks]


def _check_schema(schema: StructType, options: ReadOptions) -> None:
    if schema != spark_schema(options.include_headers):
        raise BadOptionError("the tq source has a fixed schema (Spark's Kafka source columns "
                             "plus tq_time); do not pass .schema(...) to it")


class TqDataSource(DataSource):
    """Reads and writes tq topics. Registered as `tq` (see querylib.spark.register)."""

    @classmethod
    def name(cls) -> str:
        return "tq"

    def schema(self) -> StructType:
        return spark_schema(include_headers(self.options))

    def reader(self, schema: StructType) -> DataSourceReader:
        options = parse_read_options(self.options, streaming=False)
        _check_schema(schema, options)
        return TqBatchReader(options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = parse_read_options(self.options, streaming=True)
        _check_schema(schema, options)
        return TqStreamReader(options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return TqBatchWriter(parse_write_options(self.options), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return TqStreamWriter(parse_write_options(self.options), schema, overwrite)


class TqBatchReader(DataSourceReader):
    """A bounded read: offsets resolved once, when Spark plans the query."""

    def __init__(self, options: ReadOptions) -> None:
        access = open_access(options.location)
        try:
            partitions = resolve_partitions(options.subscription, access)
            if not partitions:
                raise BadOptionError(f"{options.subscription.describe()} matches no topic in "
                                     f"{options.location.describe()}")
            starts = start_offsets(options.starting, partitions, access,
                                   fail_on_data_loss=options.fail_on_data_loss)
            ends = end_offsets(options.ending, partitions, access)
            ranges = [OffsetRange(t, p, starts[(t, p)], ends[(t, p)]) for t, p in partitions]
            self._tasks = _tasks(access, options, ranges)
        finally:
            close_access(access)
        self._options = options

    def partitions(self) -> Sequence[InputPartition]:
        # Spark wants at least one task; an empty range reads nothing.
        return self._tasks or [OffsetRangePartition(self._options.location,
                                                    OffsetRange("", 0, 0, 0), None, True, False)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition)


class TqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """An unbounded read in micro-batches; lives on the driver for the whole query. PySpark
    also builds (and pickles) one just to ship `read` to tasks: it connects only when used."""

    def __init__(self, options: ReadOptions) -> None:
        self._options = options
        self._opened: TopicAccess | None = None
        self._target: Offsets | None = None  # Trigger.AvailableNow: never read past these

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_opened"] = None  # a cluster connection does not travel
        return state

    @property
    def _access(self) -> TopicAccess:
        if self._opened is None:
            self._opened = open_access(self._options.location)
        return self._opened

    def _latest(self) -> tuple[Offsets, Offsets]:
        """(log start, log end) of every partition the subscription covers now."""
        if isinstance(self._opened, ClusterTopics):
            self._opened.refresh()
        firsts: Offsets = {}
        ends: Offsets = {}
        for topic, partition in resolve_partitions(self._options.subscription, self._access):
            firsts[(topic, partition)], ends[(topic, partition)] = \
                self._access.offset_range(topic, partition)
        return firsts, ends

    def initialOffset(self) -> dict:
        partitions = resolve_partitions(self._options.subscription, self._access)
        starts = start_offsets(self._options.starting, partitions, self._access,
                               fail_on_data_loss=self._options.fail_on_data_loss)
        return to_offsets_dict(starts)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self._options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self._options.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._latest()[1]

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = from_offsets_dict(start)
        firsts, latest = self._latest()
        if self._target is not None:
            # AvailableNow: nothing appended after the query started, no partition added since.
            latest = {p: min(end, self._target[p]) for p, end in latest.items()
                      if p in self._target}
        for p in latest:
            if p not in begin:
                begin[p] = firsts[p]  # a partition new to this query: from its start
        latest = {p: max(end, begin[p]) for p, end in latest.items()}
        # Partitions gone from the subscription keep their offsets: Spark compares whole dicts.
        merged = dict(begin)
        if isinstance(limit, ReadMaxRows):
            merged.update(rate_limit(begin, latest, limit.max_rows))
        elif isinstance(limit, ReadMinRows):
            if sum(latest[p] - begin[p] for p in latest) >= limit.min_rows:
                merged.update(latest)
        else:
            merged.update(latest)
        return to_offsets_dict(merged)

    def reportLatestOffset(self) -> dict | None:
        return to_offsets_dict(self._latest()[1])

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begin = from_offsets_dict(start)
        stop = from_offsets_dict(end)
        ranges = []
        for (topic, partition), offset in sorted(stop.items()):
            first = begin.get((topic, partition))
            if first is None:  # new since the last batch: from its start, as it is now
                first = self._access.offset_range(topic, partition)[0]
            ranges.append(OffsetRange(topic, partition, first, offset))
        return _tasks(self._access, self._options, ranges)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition)

    def commit(self, end: dict) -> None:
        """Nothing to do: the log keeps records by retention, not by acknowledgement."""

    def stop(self) -> None:
        if self._opened is not None:
            close_access(self._opened)
            self._opened = None
