"""A test-only Python data source whose task fails once, after the tq writer downstream has
appended part of its input: how the writer behaves when Spark retries a task."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from querylib.spark._local import LocalDir
from tests.conftest import wait_for

BATCH = 1000


class FlakySource(DataSource):
    """Options: rows, data (a tq data dir), topic, marker (a file created at the failure)."""

    @classmethod
    def name(cls) -> str:
        return "tq_test_flaky"

    def schema(self) -> str:
        return "value binary"

    def reader(self, schema: object) -> DataSourceReader:
        return _FlakyReader(dict(self.options))


class _FlakyReader(DataSourceReader):
    def __init__(self, options: dict) -> None:
        self.options = options

    def _wait_for_an_append(self) -> None:
        local = LocalDir(self.options["data"])
        wait_for(lambda: local.offset_range(self.options["topic"], 0)[1] > 0, timeout=120,
                 what="the writer's first append")

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        rows = int(self.options["rows"])
        marker = self.options["marker"]
        for first in range(0, rows, BATCH):
            if first + BATCH >= rows and not os.path.exists(marker):
                self._wait_for_an_append()
                with open(marker, "w"):
                    pass
                raise RuntimeError("injected task failure")
            # 1 KB values: the worker's output buffer (64 KiB) must fill to reach the JVM
            values = [b"%06d" % i + b"." * 1000
                      for i in range(first, min(rows, first + BATCH))]
            yield pa.RecordBatch.from_arrays([pa.array(values, pa.binary())], names=["value"])
