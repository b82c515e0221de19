"""The console's reading of a query's output lines from `__logs` records."""

from __future__ import annotations

from querylib.records import Record
from querylib.server.console._logs import lines_of


def test_only_the_querys_lines_with_their_process_and_stream() -> None:
    records = [Record(0, 1000, b"12/0", b"hello", ()),
               Record(1, 1001, b"120/0", b"another query's", ()),
               Record(2, 1002, b"12/1", b"oops \xff", (("stream", b"stderr"),)),
               Record(3, 1003, None, b"no key", ())]
    assert lines_of(12, records) == [
        {"process": 0, "stream": "stdout", "text": "hello", "timestamp_ms": 1000},
        {"process": 1, "stream": "stderr", "text": "oops \ufffd", "timestamp_ms": 1002}]
