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
    _spans.py        uncompressed batches -> offsets, timestamps and the positions of keys,
                     values and headers (RecordSpans): what a column reader (Spark) copies
    _decode.py       RecordBatch v2 bytes -> RecordBatch (and CRC verification); the records
                     alone, with where their tq.time changes (TimeMarks), for subscribers
    _compression.py  gzip, snappy (xerial and raw), lz4 frame, zstd; bounded output
    _legacy.py       legacy message sets v0/v1 (read-only)
    _segment.py      iterate the batches of a log segment or fetch response
    _control.py      tq's control records (FRONTIER, END_OF_STREAM, REOPEN) and header names

The scanning primitives are public too, for readers that decode in bulk elsewhere (Spark's
Arrow and numpy paths) and must not copy the format: the attribute bits (COMPRESSION_MASK,
TIMESTAMP_TYPE_BIT, TRANSACTIONAL_BIT, CONTROL_BIT), ATTRIBUTES_OFFSET (where the CRC-32C's
range starts), MIN_RECORD_SIZE, the varint readers and tables (read_varint, read_varlong,
read_uvarint: the unsigned one of Kafka's flexible protocol versions, MAX_VARINT_BYTES,
UNZIGZAG, UNZIGZAG2: UNZIGZAG[b] for a 1-byte varint b, UNZIGZAG2[c][b] for the 2-byte b c),
wrap_int64 (Java's long arithmetic on timestamps), the bytes of the lone tq.time header
(TIME_HEADER_PREFIX, TIME_HEADER_SIZE), size_runs and scan_records.
"""

from querylib.records._compression import MAX_DECOMPRESSED_SIZE
from querylib.records._control import (
    DIFF_HEADER,
    TIME_HEADER,
    TIME_HEADER_PREFIX,
    TIME_HEADER_SIZE,
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
from querylib.records._decode import (
    MIN_RECORD_SIZE,
    UNTIMED,
    TimeMarks,
    decode_batch,
    decode_records,
    verify_batch,
)
from querylib.records._encode import encode_batch
from querylib.records._encode_runs import Run, RunBatch, encode_value_runs
from querylib.records._header import (
    ATTRIBUTES_OFFSET,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAX_BATCH_SIZE,
    SEQUENCE_MODULUS,
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
from querylib.records._runs import Irregular, ValueRun, size_runs, value_runs
from querylib.records._segment import iter_batches
from querylib.records._spans import RecordSpans, header_spans, scan_records
from querylib.records._types import (
    COMPRESSION_MASK,
    CONTROL_BIT,
    TIMESTAMP_TYPE_BIT,
    TRANSACTIONAL_BIT,
    Compression,
    Record,
    RecordBatch,
    TimestampType,
)
from querylib.records._varint import (
    MAX_VARINT_BYTES,
    UNZIGZAG,
    UNZIGZAG2,
    read_uvarint,
    read_varint,
    read_varlong,
    wrap_int64,
)

__all__ = [
    "ATTRIBUTES_OFFSET",
    "COMPRESSION_MASK",
    "CONTROL_BIT",
    "MAX_VARINT_BYTES",
    "MIN_RECORD_SIZE",
    "TIMESTAMP_TYPE_BIT",
    "TIME_HEADER_PREFIX",
    "TIME_HEADER_SIZE",
    "TRANSACTIONAL_BIT",
    "UNZIGZAG",
    "UNZIGZAG2",
    "RecordSpans",
    "header_spans",
    "read_uvarint",
    "read_varint",
    "read_varlong",
    "scan_records",
    "size_runs",
    "wrap_int64",
    "DIFF_HEADER",
    "HEADER_SIZE",
    "Irregular",
    "LOG_OVERHEAD",
    "MAX_BATCH_SIZE",
    "SEQUENCE_MODULUS",
    "MAX_DECOMPRESSED_SIZE",
    "TIME_HEADER",
    "UNTIMED",
    "TimeMarks",
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
    "decode_records",
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
