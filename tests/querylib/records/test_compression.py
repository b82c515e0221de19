"""The codecs: round trips, Kafka's framings (xerial snappy, LZ4 frame with independent blocks),
and bounded decompression of hostile payloads."""

from __future__ import annotations

import os
import struct
import zlib

import cramjam
import lz4.frame
import pytest
import zstandard

from querylib.errors import CompressionError
from querylib.records import Compression
from querylib.records._compression import XERIAL_BLOCK_SIZE, compress, decompress

CODECS = [Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD]
DATA = [b"", b"x", os.urandom(1000), bytes(100_000), os.urandom(70_000) + bytes(70_000)]


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("data", DATA, ids=lambda d: f"{len(d)}B")
def test_round_trip(codec: Compression, data: bytes) -> None:
    assert decompress(codec, compress(codec, data)) == data
    assert decompress(codec, memoryview(compress(codec, data))) == data


@pytest.mark.parametrize("codec", CODECS)
def test_output_is_bounded_exactly(codec: Compression) -> None:
    packed = compress(codec, bytes(100_000))
    assert len(decompress(codec, packed, limit=100_000)) == 100_000
    with pytest.raises(CompressionError, match="more than 99999"):
        decompress(codec, packed, limit=99_999)


@pytest.mark.parametrize("codec", CODECS)
def test_truncated_and_garbage_payloads(codec: Compression) -> None:
    packed = compress(codec, os.urandom(5000))
    for bad in (packed[:-3], packed[: len(packed) // 2], packed + b"trailing junk",
                b"\x00" * 40, os.urandom(64)):
        with pytest.raises(CompressionError):
            decompress(codec, bad)


def test_unknown_codec() -> None:
    with pytest.raises(CompressionError):
        decompress(5, b"abc")
    with pytest.raises(ValueError):
        compress(6, b"abc")


def test_xerial_framing_is_what_the_java_producer_writes() -> None:
    data = os.urandom(XERIAL_BLOCK_SIZE * 2 + 100)
    packed = compress(Compression.SNAPPY, data)
    # magic, version 1, compatible version 1
    assert packed[:16] == b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    pos, blocks = 16, []
    while pos < len(packed):
        (size,) = struct.unpack_from(">i", packed, pos)
        blocks.append(bytes(cramjam.snappy.decompress_raw(packed[pos + 4:pos + 4 + size])))
        pos += 4 + size
    assert [len(b) for b in blocks] == [XERIAL_BLOCK_SIZE, XERIAL_BLOCK_SIZE, 100]
    assert b"".join(blocks) == data


def test_raw_snappy_without_framing_is_read() -> None:
    data = b"hello snappy" * 100
    assert decompress(Compression.SNAPPY, bytes(cramjam.snappy.compress_raw(data))) == data


def test_xerial_versions_are_ignored_like_other_readers() -> None:
    block = bytes(cramjam.snappy.compress_raw(b"abc" * 10))
    little_endian_versions = b"\x82SNAPPY\x00" + struct.pack("<ii", 1, 1)
    packed = little_endian_versions + struct.pack(">i", len(block)) + block
    assert decompress(Compression.SNAPPY, packed) == b"abc" * 10


@pytest.mark.parametrize("bad_block", [
    struct.pack(">i", -1),  # negative block length
    struct.pack(">i", 1000) + b"abc",  # block longer than the payload
    b"\x00\x00",  # block length cut short
])
def test_bad_xerial_blocks(bad_block: bytes) -> None:
    with pytest.raises(CompressionError):
        decompress(Compression.SNAPPY, b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1) + bad_block)


def test_snappy_preamble_is_checked_before_the_library_allocates() -> None:
    # a raw block claiming 4 GiB of output: refused from its 5-byte preamble
    with pytest.raises(CompressionError, match="more than"):
        decompress(Compression.SNAPPY, b"\xff\xff\xff\xff\x0f" + b"\x00" * 20)


def test_lz4_frames_use_independent_64k_blocks_without_content_size() -> None:
    packed = compress(Compression.LZ4, os.urandom(200_000))
    info = lz4.frame.get_frame_info(packed)
    assert info["block_linked"] is False
    assert info["block_size"] == 64 * 1024
    assert info["content_size"] == 0  # not stored, as KafkaLZ4BlockOutputStream
    assert info["content_checksum"] is False


def test_concatenated_members_and_frames() -> None:
    gz = zlib.compress(b"one", wbits=31) + zlib.compress(b"two", wbits=31)
    assert decompress(Compression.GZIP, gz) == b"onetwo"
    frames = lz4.frame.compress(b"one") + lz4.frame.compress(b"two")
    assert decompress(Compression.LZ4, frames) == b"onetwo"
    zc = zstandard.ZstdCompressor()
    assert decompress(Compression.ZSTD, zc.compress(b"one") + zc.compress(b"two")) == b"onetwo"


def test_zstd_bomb_without_declared_size_is_bounded() -> None:
    # a streaming frame does not declare its size; the output is still cut at the limit
    packed = zstandard.ZstdCompressor(write_content_size=False).compressobj()
    bomb = packed.compress(bytes(20 << 20)) + packed.flush()
    assert zstandard.frame_content_size(bomb) == -1  # not declared
    assert len(bomb) < 10_000
    with pytest.raises(CompressionError, match="more than"):
        decompress(Compression.ZSTD, bomb, limit=1 << 20)


def test_zstd_declared_size_above_limit_is_refused_up_front() -> None:
    bomb = zstandard.ZstdCompressor().compress(bytes(20 << 20))
    with pytest.raises(CompressionError, match="more than"):
        decompress(Compression.ZSTD, bomb, limit=1 << 20)
