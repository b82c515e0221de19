"""Kafka's record compression codecs, with a hard bound on what decompression may produce.

Codec ids are the attributes bits 0-2: 1 gzip (RFC 1952, as Java's GZIPOutputStream), 2 snappy
(Java writes xerial's block framing; raw snappy is read too), 3 lz4 (the LZ4 frame format with
independent blocks, as Kafka's KafkaLZ4BlockOutputStream; the broken v0 header checksum of Kafka
0.8-0.9 is not supported), 4 zstd.

Every decoder stops at `limit` output bytes and raises CompressionError instead of going on: a
few KiB of hostile input must not become gigabytes in memory. Errors of the libraries are
translated here, once, into CompressionError. Pure functions: bytes in, bytes out.
"""

from __future__ import annotations

import struct
import zlib

import cramjam
import lz4.frame
import zstandard

from querylib.errors import CompressionError
from querylib.records._header import MAX_BATCH_SIZE

# The default bound on one batch's decompressed records. Kafka itself has none; ratios above 256
# are rare for real data, so 256 MiB leaves room for them without letting a bomb take the host.
MAX_DECOMPRESSED_SIZE = 4 * MAX_BATCH_SIZE

GZIP_LEVEL = 6  # java.util.zip.Deflater's default, what Kafka's gzip producer uses
ZSTD_LEVEL = 3  # zstd-jni's default
XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = XERIAL_MAGIC + struct.pack(">ii", 1, 1)  # version 1, minimum compatible 1
XERIAL_BLOCK_SIZE = 32 * 1024  # xerial SnappyOutputStream's default, what Java's producer writes
_INT32 = struct.Struct(">i")
# zstd can expand a 4-byte RLE block into 128 KiB; feeding at most room / 2**15 input bytes per
# step bounds what one step can produce by the room left (so memory stays below 2 x limit).
_ZSTD_MAX_RATIO_SHIFT = 15
_ZSTD_MIN_STEP = 1024

_ZSTD_COMPRESSOR = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
_ZSTD_DECOMPRESSOR = zstandard.ZstdDecompressor()


def compress(codec: int, data: bytes) -> bytes:
    """Compress data the way Kafka's Java producer does for this codec id (1-4)."""
    if codec == 1:
        return zlib.compress(data, GZIP_LEVEL, wbits=31)
    if codec == 2:
        return _xerial_compress(data)
    if codec == 3:
        # 64 KiB independent blocks, no content size, no checksums: KafkaLZ4BlockOutputStream.
        return lz4.frame.compress(
            data, block_size=lz4.frame.BLOCKSIZE_MAX64KB, block_linked=False,
            content_checksum=False, block_checksum=False, store_size=False)
    if codec == 4:
        return _ZSTD_COMPRESSOR.compress(data)
    raise ValueError(f"unknown compression codec {codec}")


def decompress(codec: int, data: bytes | memoryview, limit: int = MAX_DECOMPRESSED_SIZE) -> bytes:
    """Decompress a whole payload of codec id 1-4, producing at most `limit` bytes.

    Raises CompressionError for an unknown codec, a corrupt or truncated payload, trailing
    garbage, or output beyond `limit`.
    """
    try:
        if codec == 1:
            return _gunzip(data, limit)
        if codec == 2:
            return _snappy_decompress(data, limit)
        if codec == 3:
            return _lz4_decompress(data, limit)
        if codec == 4:
            return _zstd_decompress(data, limit)
    except (zlib.error, RuntimeError, zstandard.ZstdError, cramjam.DecompressionError) as exc:
        raise CompressionError(f"codec {codec}: {exc}") from exc
    raise CompressionError(f"unknown compression codec {codec}")


def _too_big(codec: str, limit: int) -> CompressionError:
    return CompressionError(f"{codec} payload decompresses to more than {limit} bytes")


def _gunzip(data: bytes | memoryview, limit: int) -> bytes:
    out: list[bytes] = []
    room = limit
    rest = bytes(data)
    while True:  # one pass per gzip member (Java's GZIPInputStream reads concatenated members)
        inflater = zlib.decompressobj(wbits=31)
        chunk = inflater.decompress(rest, room + 1)
        if len(chunk) > room:
            raise _too_big("gzip", limit)
        if not inflater.eof:
            raise CompressionError("gzip payload is truncated")
        out.append(chunk)
        room -= len(chunk)
        rest = inflater.unused_data
        if not rest:
            return b"".join(out)


def _xerial_compress(data: bytes) -> bytes:
    parts = [_XERIAL_HEADER]
    for start in range(0, len(data), XERIAL_BLOCK_SIZE):
        block = bytes(cramjam.snappy.compress_raw(data[start:start + XERIAL_BLOCK_SIZE]))
        parts.append(_INT32.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


def _snappy_length(block: bytes | memoryview) -> int:
    """The uncompressed length a raw snappy block declares (its preamble, an unsigned varint
    of at most 5 bytes), read before the library can allocate for it."""
    z = 0
    for i in range(min(5, len(block))):
        b = block[i]
        z |= (b & 0x7F) << (7 * i)
        if b < 0x80:
            return z
    raise CompressionError("snappy block has no valid length preamble")


def _snappy_raw(block: bytes | memoryview, room: int, limit: int) -> bytes:
    if _snappy_length(block) > room:
        raise _too_big("snappy", limit)
    return bytes(cramjam.snappy.decompress_raw(block))


def _snappy_decompress(data: bytes | memoryview, limit: int) -> bytes:
    view = memoryview(data)
    if len(view) < 16 or view[:8] != XERIAL_MAGIC:
        return _snappy_raw(view, limit, limit)
    # xerial framing: 8-byte magic, int32 version, int32 compatible version, then blocks of
    # (int32 compressed length, raw snappy block). Both version fields are ignored, as other
    # readers do (some writers get their byte order wrong).
    out: list[bytes] = []
    room = limit
    pos = 16
    while pos < len(view):
        if pos + 4 > len(view):
            raise CompressionError("xerial snappy block length is cut short")
        (size,) = _INT32.unpack_from(view, pos)
        pos += 4
        if size < 0 or pos + size > len(view):
            raise CompressionError(f"xerial snappy block of {size} bytes at {pos - 4} "
                                   f"does not fit the payload")
        chunk = _snappy_raw(view[pos:pos + size], room, limit)
        pos += size
        room -= len(chunk)
        out.append(chunk)
    return b"".join(out)


def _lz4_decompress(data: bytes | memoryview, limit: int) -> bytes:
    out: list[bytes] = []
    room = limit
    rest = bytes(data)
    while True:  # one pass per LZ4 frame
        decoder = lz4.frame.LZ4FrameDecompressor()
        chunk = decoder.decompress(rest, max_length=room + 1)
        if len(chunk) > room:
            raise _too_big("lz4", limit)
        if not decoder.eof:
            raise CompressionError("lz4 frame is truncated")
        out.append(chunk)
        room -= len(chunk)
        rest = decoder.unused_data
        if not rest:
            return b"".join(out)


def _zstd_decompress(data: bytes | memoryview, limit: int) -> bytes:
    out: list[bytes] = []
    room = limit
    view = memoryview(data)
    pos = 0
    while True:  # one pass per zstd frame
        declared = zstandard.frame_content_size(view[pos:pos + 18])  # -1 when not declared
        if declared > room:
            raise _too_big("zstd", limit)
        decoder = _ZSTD_DECOMPRESSOR.decompressobj()
        while not decoder.eof:
            if pos >= len(view):
                raise CompressionError("zstd frame is truncated")
            piece = view[pos:pos + max(_ZSTD_MIN_STEP, room >> _ZSTD_MAX_RATIO_SHIFT)]
            pos += len(piece)
            chunk = decoder.decompress(piece)
            if len(chunk) > room:
                raise _too_big("zstd", limit)
            room -= len(chunk)
            out.append(chunk)
        # what the decoder did not need belongs to the next frame
        pos -= len(decoder.unused_data)
        if pos >= len(view):
            return b"".join(out)
