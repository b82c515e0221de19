"""`ingest`: lines or JSON lines from a file (or stdin) into a topic through the connector
protocol; what `tq ingest` runs.

Each input line is one message whose id is its line number (0-based), so ingesting the same
file again with the same program and instance resumes where the broker stands: lines already
stored are skipped, nothing is stored twice. A file's default instance is its real path, which
makes that the default; stdin's default instance is new each run (pass `instance` to resume).

Formats:
    lines   the line without its line ending is the value
    jsonl   every line must be JSON; an object with a "value" member is a record: value (a
            string as UTF-8, anything else as compact JSON), optional "key" (the same; released
            dialect only) and "timestamp" (event time, ms); any other JSON is the value as is

At the end of the input the stream ends (end-of-stream in the topic), unless `end` is False.
With the draft dialect the end is a BOUNDARY|EOS message whose id is the number of lines, so
the topic's frontier becomes lines + 1; a file that grows later should then be ingested under
another instance (or with `end=False` each time), since that id is taken.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any

import msgspec

from catalog.errors import UserError

from ._client import Connector, RewindError
from ._dialect import Dialect

__all__ = ["IngestResult", "ingest"]

FORMATS = ("lines", "jsonl")
_REWINDS = 3  # a replayable file is read again at most this often after a RewindError


class IngestResult(msgspec.Struct):
    stream: str
    sent: int = 0  # messages sent in this run
    skipped: int = 0  # lines the broker already had
    processed: int | None = None  # the stream's point of reference at the end
    seconds: float = 0.0
    reconnects: int = 0


def _field(value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode()
    if value is None:
        return b""
    return json.dumps(value, separators=(",", ":")).encode()


def parse_jsonl(line: bytes, number: int) -> tuple[bytes, bytes | None, int | None]:
    """(value, key, event_time) of one JSON line; UserError naming the line if it is not."""
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise UserError(f"line {number + 1}: not JSON ({exc})") from None
    if not isinstance(obj, dict) or "value" not in obj:
        return line.strip(), None, None
    key = obj.get("key")
    timestamp = obj.get("timestamp")
    if timestamp is not None and (not isinstance(timestamp, int) or isinstance(timestamp, bool)
                                  or timestamp <= 0):
        raise UserError(f"line {number + 1}: timestamp must be a positive integer (ms)")
    return _field(obj["value"]), None if key is None else _field(key), timestamp


def _lines(source: IO[bytes]) -> Iterator[bytes]:
    for line in source:
        yield line.rstrip(b"\r\n")


def ingest(source: str | os.PathLike[str] | IO[bytes], stream: str, *,
           address: str = "127.0.0.1:7600", dialect: Dialect | str = Dialect.DRAFT,
           fmt: str = "lines", program: str = "tq-ingest", instance: str | None = None,
           cookie: bytes | str = b"", timeout: float = 30.0, reconnect_timeout: float = 60.0,
           end: bool = True, progress: Callable[[int, int], None] | None = None,
           progress_every: int = 10_000, ssl_context: ssl.SSLContext | None = None
           ) -> IngestResult:
    """Send every line of `source` ("-" for stdin, a path, or a binary stream) to `stream`
    (a topic, `topic:N` for partition N). `progress(done, skipped)` is called every
    `progress_every` lines. Returns once everything sent is acknowledged."""
    if fmt not in FORMATS:
        raise UserError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    dialect = Dialect(dialect)
    path: str | None = None
    if isinstance(source, str | os.PathLike) and os.fspath(source) != "-":
        path = os.path.realpath(os.fspath(source))
        if not os.path.isfile(path):
            raise UserError(f"{os.fspath(source)}: no such file")
    if instance is None:
        instance = f"file:{path}" if path else f"stdin:{socket.gethostname()}-{os.getpid()}"
    result = IngestResult(stream)
    started = time.monotonic()
    for attempt in range(_REWINDS + 1):
        conn = Connector(address, program=program, instance=instance, cookie=cookie,
                         dialect=dialect, timeout=timeout, reconnect_timeout=reconnect_timeout,
                         ssl_context=ssl_context)
        try:
            with conn:
                try:
                    _run(conn, source, path, stream, fmt, dialect, end, result, progress,
                         progress_every)
                    conn.flush()
                finally:
                    result.reconnects += conn.counters["reconnects"]
            break
        except RewindError:
            if path is None or attempt == _REWINDS:
                raise
            # The broker lost messages it had acknowledged: read the file again from there.
    result.seconds = time.monotonic() - started
    return result


def _run(conn: Connector, source: Any, path: str | None, stream: str, fmt: str,
         dialect: Dialect, end: bool, result: IngestResult,
         progress: Callable[[int, int], None] | None, every: int) -> None:
    sid = conn.open_stream(stream)
    handle: IO[bytes] = open(path, "rb") if path else (  # noqa: SIM115 - closed below
        sys.stdin.buffer if source == "-" else source)
    sent = skipped = 0
    number = -1
    try:
        lines: Iterable[bytes] = _lines(handle)
        for number, line in enumerate(lines):
            floor = conn.processed(sid)
            if floor is not None and number <= floor:
                skipped += 1
            else:
                if fmt == "jsonl":
                    value, key, event_time = parse_jsonl(line, number)
                    if key is not None and dialect is Dialect.DRAFT:
                        raise UserError(f"line {number + 1}: keys need --dialect released")
                else:
                    value, key, event_time = line, None, None
                if conn.send(sid, value, message_id=number, event_time=event_time, key=key):
                    sent += 1
                else:
                    skipped += 1
            if progress is not None and (number + 1) % every == 0:
                progress(sent + skipped + result.sent + result.skipped, skipped)
    finally:
        if path:
            handle.close()
    result.sent += sent
    result.skipped += skipped
    if end:
        # Draft: the end is a message with id `lines`, skipped like a line when stored. The
        # released EOS has no id: ending an ended stream again only repeats the marker.
        conn.end_stream(sid, message_id=number + 1 if dialect is Dialect.DRAFT else None)
    conn.flush()
    result.processed = conn.processed(sid)
    if progress is not None:
        progress(result.sent + result.skipped, result.skipped)
