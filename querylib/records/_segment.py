"""Walk a sequence of batches: a whole log segment or the records of a fetch response.

Dispatches on the magic byte, which sits at the same position (byte 16) in a RecordBatch v2 and
in a legacy message-set entry. Batches are contiguous, so a caller that catches an error knows
the valid prefix: the sum of `size_in_bytes` of the batches it received (what log recovery
truncates to).
"""

from __future__ import annotations

from collections.abc import Iterator

from querylib.errors import TruncatedRecordError, UnsupportedMagicError
from querylib.records._compression import MAX_DECOMPRESSED_SIZE
from querylib.records._decode import decode_batch
from querylib.records._header import MAGIC_OFFSET
from querylib.records._legacy import decode_legacy
from querylib.records._types import RecordBatch


def iter_batches(buf: bytes | bytearray | memoryview, *, verify_crc: bool = True,
                 max_decompressed: int = MAX_DECOMPRESSED_SIZE) -> Iterator[RecordBatch]:
    """Decode every batch in buf, in order: magic 2 batches and legacy v0/v1 messages (each
    message or compressed wrapper as one RecordBatch of magic 0 or 1).

    Raises the RecordError of the first batch that cannot be decoded, TruncatedRecordError
    included for a batch cut short at the end of buf.
    """
    pos = 0
    end = len(buf)
    while pos < end:
        if end - pos <= MAGIC_OFFSET:
            raise TruncatedRecordError(f"batch at {pos}: {end - pos} bytes left, no magic byte")
        magic = buf[pos + MAGIC_OFFSET]
        if magic == 2:
            batch = decode_batch(buf, pos, verify_crc=verify_crc,
                                 max_decompressed=max_decompressed)
        elif magic in (0, 1):
            batch = decode_legacy(buf, pos, verify_crc=verify_crc,
                                  max_decompressed=max_decompressed)
        else:
            raise UnsupportedMagicError(f"batch at {pos}: magic {magic}")
        pos += batch.size_in_bytes
        yield batch
