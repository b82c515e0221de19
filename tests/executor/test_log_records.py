"""The record a log line becomes, and back."""

from executor import LogLine, line_of_record, record_of_line
from querylib.records import Record


def test_a_line_round_trips_through_its_record():
    for line in (LogLine(3, 1, "stderr", "héllo", 1700000000123),
                 LogLine(3, 0, "stdout", "piece", 1700000000124, continues=True)):
        key, value, headers, timestamp = record_of_line(line)
        assert key == f"3/{line.process}".encode()
        assert dict(headers)["stream"] == line.stream.encode()
        record = Record(offset=0, timestamp=timestamp, key=key, value=value, headers=headers)
        assert line_of_record(record) == line


def test_a_record_that_is_no_log_line_reads_as_none():
    for key in (None, b"nonsense", b"a/b", b"1/2/3", b"\xff/1"):
        assert line_of_record(Record(offset=0, timestamp=0, key=key, value=b"x")) is None
