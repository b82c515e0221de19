"""The public surface of querylib.records: the contract other modules code against."""

from __future__ import annotations

import inspect

import querylib.records as records
from querylib import errors

CONTRACT = {
    "Compression", "TimestampType", "Record", "RecordBatch", "encode_batch", "decode_batch",
    "verify_batch", "iter_batches", "BatchHeader", "read_header", "stamp_base_offset",
    "HEADER_SIZE", "LOG_OVERHEAD", "MAX_BATCH_SIZE", "ControlType", "frontier_batch",
    "end_of_stream_batch", "control_of", "TIME_HEADER", "DIFF_HEADER",
    # the scanning primitives of readers that decode in bulk elsewhere (Spark's columns)
    "ATTRIBUTES_OFFSET", "COMPRESSION_MASK", "TIMESTAMP_TYPE_BIT", "TRANSACTIONAL_BIT",
    "CONTROL_BIT", "MIN_RECORD_SIZE", "MAX_VARINT_BYTES", "UNZIGZAG", "UNZIGZAG2",
    "read_varint", "read_varlong", "wrap_int64", "TIME_HEADER_PREFIX", "TIME_HEADER_SIZE",
    "size_runs", "RecordSpans", "scan_records", "header_spans",
}


def test_all_is_the_public_surface() -> None:
    public = {name for name in vars(records) if not name.startswith("_")} - {"annotations"}
    assert set(records.__all__) == public
    assert CONTRACT <= set(records.__all__)


def test_contract_values() -> None:
    assert [c.value for c in records.Compression] == [0, 1, 2, 3, 4]
    assert (records.TimestampType.CREATE_TIME, records.TimestampType.LOG_APPEND_TIME) == (0, 1)
    assert (records.ControlType.ABORT, records.ControlType.COMMIT, records.ControlType.FRONTIER,
            records.ControlType.END_OF_STREAM) == (0, 1, 100, 101)
    assert (records.TIME_HEADER, records.DIFF_HEADER) == ("tq.time", "tq.diff")
    assert (records.HEADER_SIZE, records.LOG_OVERHEAD) == (61, 12)
    assert list(records.Record.__struct_fields__) == [
        "offset", "timestamp", "key", "value", "headers"]
    assert list(inspect.signature(records.encode_batch).parameters) == [
        "entries", "base_offset", "compression", "timestamp_type", "producer_id",
        "producer_epoch", "base_sequence", "is_transactional", "is_control",
        "partition_leader_epoch"]


def test_record_errors_are_protocol_errors() -> None:
    for name in ("CorruptRecordError", "TruncatedRecordError", "InvalidLengthError",
                 "UnsupportedMagicError", "BadVarintError", "CompressionError",
                 "InvalidRecordError"):
        error = getattr(errors, name)
        assert issubclass(error, errors.RecordError)
        assert issubclass(error, errors.ProtocolError)
