"""The rows the `tq` source reads: Spark's Kafka source schema plus tq's own column.

    key binary, value binary, topic string, partition int, offset long, timestamp timestamp,
    timestampType int, [headers array<struct<key: string, value: binary>>,] tq_time long

As in Spark's Kafka source every column is nullable, `headers` is there only with option
includeHeaders=true (and then null for a record without headers), and `timestampType` is 0
(CreateTime) or 1 (LogAppendTime). `tq_time` is the logical time from the record's `tq.time`
header (8-byte big-endian int64), null when it has none. Why headers are optional, as in
Kafka's source: Spark converts the nested column row by row, and that alone costs about as much
as reading the rest of a small record.

`ARROW_SCHEMA` (`ARROW_SCHEMA_NO_HEADERS`) is `SCHEMA` (`SCHEMA_NO_HEADERS`) as PySpark converts
it (`to_arrow_schema(..., "UTC")`): PySpark rejects record batches whose schema differs.
Declarations only.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

__all__ = [
    "ARROW_SCHEMA",
    "ARROW_SCHEMA_NO_HEADERS",
    "HEADERS_TYPE",
    "SCHEMA",
    "SCHEMA_NO_HEADERS",
    "WRITE_COLUMNS",
    "arrow_schema",
    "spark_schema",
]

SCHEMA = StructType([
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("timestampType", IntegerType()),
    StructField("headers", ArrayType(StructType([
        StructField("key", StringType()),
        StructField("value", BinaryType()),
    ]))),
    StructField("tq_time", LongType()),
])

HEADERS_TYPE = pa.list_(pa.field("element", pa.struct([
    pa.field("key", pa.string()),
    pa.field("value", pa.binary()),
])))

ARROW_SCHEMA = pa.schema([
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", pa.timestamp("us", tz="UTC")),
    pa.field("timestampType", pa.int32()),
    pa.field("headers", HEADERS_TYPE),
    pa.field("tq_time", pa.int64()),
])

SCHEMA_NO_HEADERS = StructType([f for f in SCHEMA.fields if f.name != "headers"])
ARROW_SCHEMA_NO_HEADERS = ARROW_SCHEMA.remove(ARROW_SCHEMA.get_field_index("headers"))


def spark_schema(include_headers: bool) -> StructType:
    return SCHEMA if include_headers else SCHEMA_NO_HEADERS


def arrow_schema(include_headers: bool) -> pa.Schema:
    return ARROW_SCHEMA if include_headers else ARROW_SCHEMA_NO_HEADERS


# Columns a DataFrame written to tq may have; `value` is the only one required. `key` and
# `value` may be binary or string (written as UTF-8), as in Spark's Kafka sink.
WRITE_COLUMNS = ("key", "value", "headers", "partition", "timestamp", "tq_time", "topic")
