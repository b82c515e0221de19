"""Test topics written straight into partition logs, and what those logs hold (the oracle)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from catalog import TopicName
from querylib.log import LogConfig, PartitionLog
from querylib.records import TIME_HEADER, TimestampType, control_of, iter_batches

Row = tuple  # (key, value, topic, partition, offset, ts_ms, ts_type, headers, tq_time)


def partition_path(data_dir: str | os.PathLike, topic: str, partition: int) -> str:
    return os.path.join(data_dir, TopicName.parse(topic).partition_dir(partition))


def create_topic(data_dir: str | os.PathLike, topic: str, partitions: int) -> None:
    for p in range(partitions):
        PartitionLog.open(partition_path(data_dir, topic, p), LogConfig()).close()


def append(data_dir: str | os.PathLike, topic: str, partition: int, batches: Sequence[bytes],
           config: LogConfig | None = None) -> list[int]:
    log = PartitionLog.open(partition_path(data_dir, topic, partition), config or LogConfig())
    try:
        return log.append_batches(list(batches))
    finally:
        log.close()


def log_rows(data_dir: str | os.PathLike, topic: str) -> list[Row]:
    """Every data record of every partition of `topic`, as the tq source should show it."""
    short = TopicName.parse(topic).short
    rows: list[Row] = []
    p = 0
    while os.path.isdir(partition_path(data_dir, topic, p)):
        log = PartitionLog.open(partition_path(data_dir, topic, p), LogConfig())
        try:
            offset = log.log_start_offset
            while offset < log.log_end_offset:
                data = log.read(offset, 1 << 20)
                for batch in iter_batches(data):
                    offset = batch.next_offset
                    if batch.is_control:
                        for record in batch.records:
                            control_of(record)  # a valid control record, not a row
                        continue
                    log_append = batch.timestamp_type == TimestampType.LOG_APPEND_TIME
                    for r in batch.records:
                        headers = [(k, v) for k, v in r.headers] or None
                        tq_time = next((int.from_bytes(v, "big", signed=True)
                                        for k, v in r.headers
                                        if k == TIME_HEADER and v is not None and len(v) == 8),
                                       None)
                        rows.append((r.key, r.value, short, p, r.offset, r.timestamp,
                                     1 if log_append else 0, headers, tq_time))
        finally:
            log.close()
        p += 1
    return rows


ROW_SQL = ["key", "value", "topic", "partition", "offset", "unix_millis(timestamp) AS ts",
           "timestampType", "headers", "tq_time"]


def spark_rows(df) -> list[Row]:
    """A tq DataFrame's rows in the oracle's form, sorted like the oracle (partition, offset)."""
    out = []
    for r in df.selectExpr(*ROW_SQL).collect():
        headers = None if r.headers is None else [(h.key, h.value) for h in r.headers]
        out.append((r.key, r.value, r.topic, r.partition, r.offset, r.ts, r.timestampType,
                    headers, r.tq_time))
    return sorted(out, key=lambda row: (row[2], row[3], row[4]))
