"""A partition's Kafka transaction history kept beside its log (DESIGN §8 "Transactions"),
as Kafka keeps its aborted transaction index (.txnindex) and producer snapshots: the aborted
transactions (producer id, first offset, marker offset), the transactions open and each
producer's last marker epoch, all as of the offset `through`. A partition opening reads it
and walks only the log after `through` (`_disk.transaction_history`), so it knows an aborted
transaction however far back it is, without reading the whole log.

The file is `aborted-transactions.tq` in the partition directory: one JSON object with a
CRC-32 of its body, written whole (temporary file, then rename). A file missing, unreadable,
damaged (bad CRC or shape) or describing offsets the log no longer has reads as None: the
opening then walks the whole log again and writes it anew. A replica truncating its log
removes it first (`forget_history`), and so does an opening finding it ends past the log end
(a tail lost) before it writes the new one: offsets appended again would make it look
current.

Blocking file I/O only (an executor thread's); no broker state, no asyncio. Must not decide
what is aborted: it stores what the walk and the broker core found.
"""

from __future__ import annotations

import json
import logging
import os
import zlib
from dataclasses import dataclass

from querylib._state_file import fsync_dir

__all__ = ["INDEX_FILE", "TxnHistory", "forget_history", "read_history", "write_history"]

INDEX_FILE = "aborted-transactions.tq"
_VERSION = 1
_MAX_FILE_BYTES = 64 * 1024 * 1024  # 100,000 aborted transactions take about 3 MB

logger = logging.getLogger("querylib.broker")


@dataclass(frozen=True)
class TxnHistory:
    """A partition's transactions as of `through` (the log's offsets below it)."""

    through: int
    open: tuple[tuple[int, int], ...] = ()            # (producer id, first offset)
    aborted: tuple[tuple[int, int, int], ...] = ()    # (producer id, first, marker offset)
    marked: tuple[tuple[int, int], ...] = ()          # (producer id, last marker's epoch)


def read_history(partition_dir: str) -> TxnHistory | None:
    """The history kept in `partition_dir`, or None when there is none or it is damaged."""
    path = os.path.join(partition_dir, INDEX_FILE)
    try:
        with open(path, "rb") as f:
            raw = f.read(_MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        logger.warning("%s: unreadable (%s): walking the log again", path, exc)
        return None
    try:
        if len(raw) > _MAX_FILE_BYTES:
            raise ValueError("too large")
        outer = json.loads(raw)
        body = outer["body"]
        if not isinstance(body, str):
            raise TypeError("body is not text")
        if zlib.crc32(body.encode()) != outer["crc"]:
            raise ValueError("CRC mismatch")
        data = json.loads(body)
        if data["version"] != _VERSION:
            raise ValueError(f"version {data['version']}")
        history = TxnHistory(
            through=_int(data["through"]),
            open=tuple((_int(p), _int(f)) for p, f in data["open"]),
            aborted=tuple((_int(p), _int(f), _int(m)) for p, f, m in data["aborted"]),
            marked=tuple((_int(p), _int(e)) for p, e in data["marked"]))
    except (ValueError, KeyError, TypeError) as exc:
        logger.warning("%s: damaged (%s): walking the log again", path, exc)
        return None
    return history


def write_history(partition_dir: str, history: TxnHistory) -> None:
    """Keep `history` in `partition_dir`, replacing the one there (atomically)."""
    body = json.dumps({"version": _VERSION, "through": history.through,
                       "open": history.open, "aborted": history.aborted,
                       "marked": history.marked}, separators=(",", ":"))
    path = os.path.join(partition_dir, INDEX_FILE)
    tmp = path + ".tmp"
    # No fsync, on purpose: the file is a cache of a walk of the log, and every state a power
    # loss can leave it in reads as one the opening handles (`_disk.transaction_history`).
    # Missing (the rename lost): None, the whole log is walked. Empty or half written: the
    # CRC or the JSON fails, None, walked. The previous version: its `through` is at most the
    # log end, and the log below it holds what it held (a replica's truncation below it, and
    # an opening finding the log ended below it, removed it durably first: `forget_history`),
    # so the walk after it completes it. The new version with the log's tail lost (flush
    # policies other than "always" leave it in the page cache): `through` beyond the log end,
    # None, walked, and removed durably before the log grows past it again. So no
    # acknowledged transaction's outcome depends on this file reaching the disk
    # (tests/querylib/server/broker/test_txn_history.py), and a close or an opening pays no
    # fsync per partition for it.
    with open(tmp, "w") as f:
        f.write(json.dumps({"crc": zlib.crc32(body.encode()), "body": body}))
    os.replace(tmp, path)


def forget_history(partition_dir: str) -> None:
    """Remove the history, durably, before the log is truncated: it may describe the tail
    that goes, and a later one written there would pass for it (its offsets are in the log
    again) were the history still read. Without one, the next opening walks the whole log."""
    try:
        os.unlink(os.path.join(partition_dir, INDEX_FILE))
    except FileNotFoundError:
        return
    fsync_dir(partition_dir)


def _int(value: object) -> int:
    if type(value) is not int or value < 0:
        raise ValueError(f"not an offset or id: {value!r}")
    return value
