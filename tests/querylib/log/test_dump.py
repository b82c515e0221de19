"""`tq log dump` and the rows behind it."""

from __future__ import annotations

import json
import os

import pytest

from catalog.errors import UserError
from querylib.cli import main
from querylib.log import LogConfig, PartitionLog, dump_segment
from querylib.records import encode_batch, frontier_batch


@pytest.fixture
def segment(tmp_path):
    with PartitionLog.open(tmp_path / "t-0", LogConfig(index_interval_bytes=0)) as log:
        log.append(encode_batch([(1000, b"key", b"hello", [("h", b"\x00\x01")]),
                                 (1001, None, b"\xff\xfe", [])], producer_id=7))
        log.append(frontier_batch(42, timestamp=2000))
        log.append(encode_batch([(3000, b"k", b"multi\nline", [])]))
    return str(tmp_path / "t-0" / "00000000000000000000.log")


def test_batches_have_kafka_dump_log_fields(segment):
    rows = list(dump_segment(segment))
    assert rows[0] == {"type": "segment", "path": segment, "baseOffset": 0,
                       "size": os.path.getsize(segment)}
    batches = [r for r in rows if r["type"] == "batch"]
    assert [(b["baseOffset"], b["lastOffset"], b["count"]) for b in batches] == [
        (0, 1, 2), (2, 2, 1), (3, 3, 1)]
    first = batches[0]
    assert first["position"] == 0 and first["producerId"] == 7
    assert first["CreateTime"] == 1001 and first["magic"] == 2
    assert first["compresscodec"] == "none" and first["isvalid"] is True
    assert first["partitionLeaderEpoch"] == 0
    assert batches[1]["isControl"] is True and batches[0]["isControl"] is False
    assert batches[1]["position"] == first["size"]


def test_records_show_keys_values_and_headers(segment):
    records = [r for r in dump_segment(segment, records=True) if r["type"] == "record"]
    assert records[0]["offset"] == 0 and records[0]["CreateTime"] == 1000
    assert (records[0]["key"], records[0]["payload"]) == ("key", "hello")
    assert records[0]["headers"] == {"h": repr(b"\x00\x01")}
    assert records[1]["key"] is None and records[1]["keySize"] == -1
    assert records[1]["payload"] == repr(b"\xff\xfe")
    assert records[2]["controlType"] == "FRONTIER" and records[2]["controlValue"] == 42
    assert records[3]["payload"] == repr(b"multi\nline")  # not printable as one line


def test_a_corrupt_batch_is_flagged_and_a_torn_tail_reported(segment):
    with open(segment, "r+b") as f:
        f.seek(70)
        f.write(b"\xee")
    with open(segment, "ab") as f:
        f.write(b"\x00" * 20)
    rows = list(dump_segment(segment))
    assert rows[1]["isvalid"] is False
    assert rows[-1]["type"] == "invalid" and rows[-1]["invalidBytes"] == 20


def test_cli_prints_text_lines(segment, capsys):
    assert main(["log", "dump", segment, "--records"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"Dumping {segment}"
    assert out[1] == "Log starting offset: 0"
    assert out[2].startswith("baseOffset: 0 lastOffset: 1 count: 2 baseSequence: -1")
    assert "isvalid: true" in out[2]
    assert out[3].startswith("| offset: 0 CreateTime: 1000 keySize: 3 valueSize: 5")
    assert "key: key payload: hello" in out[3]


def test_cli_json_is_one_object_per_line(segment, capsys):
    assert main(["log", "dump", segment, "--json", "--records"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["type"] for r in rows] == [
        "segment", "batch", "record", "record", "batch", "record", "batch", "record"]


def test_index_files_and_directories_dump_too(segment, capsys):
    directory = os.path.dirname(segment)
    index = list(dump_segment(segment.replace(".log", ".index")))
    assert index[0]["type"] == "index"
    assert [(r["offset"], r["position"]) for r in index[1:]][:1] == [(2, index[1]["position"])]
    times = list(dump_segment(segment.replace(".log", ".timeindex")))
    assert times[-1] == {"type": "timeIndexEntry", "timestamp": 3000, "offset": 3}
    assert [r["type"] for r in dump_segment(directory)].count("batch") == 3


@pytest.mark.parametrize("name", ["missing.log", "notes.txt", "empty-dir"])
def test_user_errors_are_one_line(tmp_path, capsys, name):
    (tmp_path / "notes.txt").write_text("hi")
    (tmp_path / "empty-dir").mkdir()
    with pytest.raises(UserError):
        list(dump_segment(tmp_path / name))
    assert main(["log", "dump", str(tmp_path / name)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tq: error: ") and err.count("\n") == 1
