"""Hostile batches with a valid CRC: each malformation gets its own typed RecordError, before any
allocation the bytes do not justify."""

from __future__ import annotations

import pytest

from querylib.errors import (
    BadVarintError,
    CompressionError,
    InvalidLengthError,
    InvalidRecordError,
    RecordError,
    TruncatedRecordError,
    UnsupportedMagicError,
)
from querylib.records import MAX_BATCH_SIZE, Compression, decode_batch, encode_batch, iter_batches
from querylib.records._compression import compress
from querylib.records._varint import encode_varint

from ._build import raw_batch, recrc


def record(body: bytes) -> bytes:
    return encode_varint(len(body)) + body


GOOD = b"\x00\x00\x00\x01\x02v\x00"  # attributes, deltas 0, null key, value "v", no headers
LONG = b"\x00\x00\x00\x01\x14" + b"v" * 10 + b"\x00"  # the same with a 10-byte value

CASES = [
    ("negative recordsCount", raw_batch(b"", -1), InvalidLengthError),
    ("recordsCount beyond the bytes", raw_batch(record(GOOD), (1 << 31) - 1), InvalidLengthError),
    ("recordsCount above the records", raw_batch(record(LONG), 2), TruncatedRecordError),
    ("recordsCount below the records", raw_batch(record(GOOD) * 2, 1), InvalidRecordError),
    ("record length past the batch", raw_batch(encode_varint(100) + GOOD, 1), InvalidLengthError),
    ("record length too long for its fields", raw_batch(record(GOOD + b"\x00"), 1),
     InvalidRecordError),
    ("record length too short for its fields", raw_batch(record(GOOD[:-1]) + b"\x00", 1),
     InvalidLengthError),
    ("negative record length", raw_batch(b"\x03" + GOOD, 1), RecordError),
    ("6-byte record length varint", raw_batch(b"\x80\x80\x80\x80\x80\x00" + GOOD, 1),
     BadVarintError),
    ("11-byte timestamp delta", raw_batch(record(b"\x00" + b"\x80" * 10 + b"\x00\x00\x01\x00\x00"),
                                          1), BadVarintError),
    ("key length -2", raw_batch(record(b"\x00\x00\x00\x03k\x02v\x00"), 1), InvalidLengthError),
    ("key length past its record", raw_batch(record(b"\x00\x00\x00\x7ek\x02v\x00"), 1),
     InvalidLengthError),
    ("value length -3", raw_batch(record(b"\x00\x00\x00\x01\x05v\x00"), 1), InvalidLengthError),
    ("value length past its record", raw_batch(record(b"\x00\x00\x00\x01\x40vv\x00"), 1),
     InvalidLengthError),
    ("headersCount beyond the bytes", raw_batch(record(b"\x00\x00\x00\x01\x01\xfe\xff\x0f"), 1),
     InvalidLengthError),
    ("negative headersCount", raw_batch(record(b"\x00\x00\x00\x01\x01\x01\x00\x00"), 1),
     InvalidLengthError),
    ("null header key", raw_batch(record(b"\x00\x00\x00\x01\x01\x02\x01\x00"), 1),
     InvalidLengthError),
    ("header key not UTF-8", raw_batch(record(b"\x00\x00\x00\x01\x01\x02\x02\xff\x00"), 1),
     InvalidRecordError),
    ("header value length -2", raw_batch(record(b"\x00\x00\x00\x01\x01\x02\x02h\x03"), 1),
     InvalidLengthError),
    ("records cut short", raw_batch(record(GOOD)[:-2], 1), RecordError),
    ("unknown codec 5", raw_batch(record(GOOD), 1, attributes=5), CompressionError),
    ("unknown codec 7", raw_batch(record(GOOD), 1, attributes=7), CompressionError),
    ("gzip attribute over plain records", raw_batch(record(GOOD), 1, attributes=1),
     CompressionError),
    ("batchLength above MAX_BATCH_SIZE", raw_batch(b"", 0, batch_length=MAX_BATCH_SIZE + 1),
     InvalidLengthError),
    ("batchLength below the header", raw_batch(b"", 0, batch_length=48), InvalidLengthError),
    ("negative batchLength", raw_batch(b"", 0, batch_length=-1), InvalidLengthError),
    ("batchLength past the buffer", raw_batch(record(GOOD), 1, batch_length=200),
     TruncatedRecordError),
    ("magic 3", raw_batch(record(GOOD), 1, magic=3), UnsupportedMagicError),
    ("magic 1 given to decode_batch", raw_batch(record(GOOD), 1, magic=1), UnsupportedMagicError),
    ("a header alone", raw_batch(b"", 0)[:40], TruncatedRecordError),
]


@pytest.mark.parametrize(("what", "raw", "error"), CASES, ids=[c[0] for c in CASES])
def test_hostile_batch(what: str, raw: bytes, error: type[RecordError]) -> None:
    with pytest.raises(error):
        decode_batch(raw)


def test_the_good_record_is_good() -> None:
    (rec,) = decode_batch(raw_batch(record(GOOD), 1)).records
    assert (rec.key, rec.value, rec.headers) == (None, b"v", ())


def test_empty_batch_is_valid() -> None:
    # compaction can leave a batch with no records; it still has a header and offsets
    batch = decode_batch(raw_batch(b"", 0, last_offset_delta=4, base_offset=10))
    assert batch.records == [] and batch.next_offset == 15


@pytest.mark.parametrize("codec", [Compression.GZIP, Compression.SNAPPY, Compression.LZ4,
                                   Compression.ZSTD])
def test_compressed_hostile_records_are_found_after_decompression(codec: Compression) -> None:
    raw = raw_batch(compress(codec, record(GOOD) + b"junk"), 1, attributes=codec)
    with pytest.raises(InvalidRecordError):
        decode_batch(raw)
    raw = raw_batch(compress(codec, record(GOOD)), 1000, attributes=codec)
    with pytest.raises(InvalidLengthError):  # count bounded by the decompressed bytes
        decode_batch(raw)


@pytest.mark.parametrize("codec", [Compression.GZIP, Compression.SNAPPY, Compression.LZ4,
                                   Compression.ZSTD])
def test_decompression_bomb_is_refused(codec: Compression) -> None:
    raw = encode_batch([(0, None, bytes(1 << 20), ())] * 4, compression=codec)
    assert len(raw) < 1 << 20
    with pytest.raises(CompressionError, match="more than"):
        decode_batch(raw, max_decompressed=1 << 20)
    assert len(decode_batch(raw, max_decompressed=8 << 20).records) == 4


def test_a_bad_crc_is_reported_before_anything_is_parsed() -> None:
    raw = bytearray(raw_batch(b"\x80" * 20, 1))
    raw[-1] ^= 1
    from querylib.errors import CorruptRecordError
    with pytest.raises(CorruptRecordError):
        decode_batch(bytes(raw))


def test_iter_batches_reports_unknown_magic_and_short_tails() -> None:
    good = encode_batch([(0, None, b"v", ())])
    with pytest.raises(UnsupportedMagicError):
        list(iter_batches(good + recrc(good[:16] + b"\x07" + good[17:])))
    with pytest.raises(TruncatedRecordError):
        list(iter_batches(good + good[:10]))
