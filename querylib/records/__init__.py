"""Kafka record batches (RecordBatch v2, legacy MessageSet v0/v1) and tq control records.

A sans-I/O codec: bytes in, `RecordBatch` / `Record` values out, and entries in, batch bytes
out. Hostile bytes raise `querylib.errors.RecordError` subclasses, never anything else, and
never cause an unbounded allocation.

    _header.py       the 61-byte batch header, what the log reads without decoding records
    _types.py        Record, RecordBatch, Compression, TimestampType
    _varint.py       zigzag varints and the lookup tables of the hot loops
    _encode.py       entries -> RecordBatch v2 bytes
    _encode_runs.py  runs of values sharing timestamp and headers -> the same bytes, faster
                     (RunBatch: a batch built run by run)
    _runs.py         regular batches -> runs of values, without Python work per record
    _decode.py       RecordBatch v2 bytes -> RecordBatch (and CRC verification)
    _compression.py  gzip, snappy (xerial and raw), lz4 frame, zstd; bounded output
    _legacy.py       legacy message sets v0/v1 (read-only)
    _segment.py      iterate the batches of a log segment or fetch response
    _control.py      tq's control records (FRONTIER, END_OF_STREAM, REOPEN) and header names
"""

from querylib.records._compression import MAX_DECOMPRESSED_SIZE
from querylib.records._control import (
    DIFF_HEADER,
    TIME_HEADER,
    ControlType,
    control_of,
    decode_frontier,
    decode_int64,
    decode_reopen,
    encode_int64,
    end_of_stream_batch,
    frontier_batch,
    frontier_of,
    reopen_batch,
    transaction_marker_batch,
    without_aborted,
)
from querylib.records._decode import decode_batch, verify_batch
from querylib.records._encode import encode_batch
from querylib.records._encode_runs import Run, RunBatch, encode_value_runs
from querylib.records._header import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAX_BATCH_SIZE,
    Batch,
    BatchHeader,
    SplitBatch,
    batch_head,
    read_header,
    stamp_base_offset,
    stamp_producer,
    stamp_producer_split,
)
from querylib.records._legacy import decode_legacy
from querylib.records._runs import Irregular, ValueRun, value_runs
from querylib.records._segment import iter_batches
from querylib.records._types import Compression, Record, RecordBatch, TimestampType

__all__ = [
    "DIFF_HEADER",
    "HEADER_SIZE",
    "Irregular",
    "LOG_OVERHEAD",
    "MAX_BATCH_SIZE",
    "MAX_DECOMPRESSED_SIZE",
    "TIME_HEADER",
    "Batch",
    "BatchHeader",
    "Compression",
    "ControlType",
    "Record",
    "RecordBatch",
    "Run",
    "RunBatch",
    "SplitBatch",
    "TimestampType",
    "ValueRun",
    "batch_head",
    "control_of",
    "decode_batch",
    "decode_frontier",
    "decode_int64",
    "decode_reopen",
    "decode_legacy",
    "encode_batch",
    "encode_int64",
    "encode_value_runs",
    "end_of_stream_batch",
    "frontier_batch",
    "frontier_of",
    "iter_batches",
    "read_header",
    "reopen_batch",
    "transaction_marker_batch",
    "without_aborted",
    "stamp_base_offset",
    "stamp_producer",
    "stamp_producer_split",
    "value_runs",
    "verify_batch",
]
