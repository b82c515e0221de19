"""How `tq consume` and `tq produce` turn records into lines and back (`_records_text`)."""

from __future__ import annotations

import msgspec
import pytest

from catalog.errors import UserError
from querylib.cli._records_text import (
    LineEncoder,
    RecordFormat,
    ValueText,
    escape,
    parse_start,
    serde_of,
)


def test_serde_of_a_type_tag() -> None:
    assert serde_of("msgpack") == "msgpack"
    assert serde_of("json/Point") == "json"
    assert serde_of("avro/Thing") == "bytes"  # not a serde tq knows: shown as bytes


@pytest.mark.parametrize(("data", "text"), [
    (b"plain", "plain"),
    (b"caf\xc3\xa9", "café"),
    (b"a\nb\tc\rd", "a\\nb\\tc\\rd"),
    (b"\x00\x01\x1b[0m", "\\x00\\x01\\x1b[0m"),
    (b"\xff\xfe", "\\xff\\xfe"),
    ("\u2028\x85".encode(), "\\u2028\\x85"),
])
def test_escape_leaves_no_control_character(data: bytes, text: str) -> None:
    assert escape(data) == text
    assert escape(data).isprintable()


def test_msgpack_and_json_values_read_as_one_line_of_json() -> None:
    packed = ValueText("msgpack")
    assert packed.text(msgspec.msgpack.encode({"a": [1, 2.5, None], "b": "x\ny"})) == \
        '{"a":[1,2.5,null],"b":"x\\ny"}'
    assert packed.text(msgspec.msgpack.encode(b"\x00")) == '"AA=="'  # bytes: base64
    assert packed.text(msgspec.msgpack.encode("\x85")) == '"\\u0085"'
    assert packed.json(msgspec.msgpack.encode({"a": 1})) == {"a": 1}
    assert packed.invalid == 0
    assert packed.text(b"\xc1") == "\\xc1"  # not msgpack: escaped, and counted
    assert packed.invalid == 1
    assert packed.text(None) == ""
    texts = ValueText("json")
    assert texts.text(b'{ "a" :\n 1 }') == '{"a":1}'
    assert texts.json(b"not json") == {"base64": "bm90IGpzb24="}


def test_pickle_is_never_unpickled() -> None:
    import base64
    import pickle

    value = ValueText("pickle")
    data = pickle.dumps(object())
    assert value.text(data) == f"<pickle: {len(data)} bytes>"
    assert value.json(data) == {"base64": base64.b64encode(data).decode()}


def test_format_fields_and_escapes() -> None:
    fmt = RecordFormat("%t/%p@%o %k=%s (%S) %% %x\\t|\\n".replace("%x", "%L"))
    fields = {"t": "nums", "p": "1", "o": "7", "k": "k", "s": "v", "S": "1", "L": "3"}
    assert fmt.render(fields) == "nums/1@7 k=v (1) % 3\t|\n"
    assert RecordFormat("%o %s\\n").render({"s": "v"}) == "- v\n"  # a field it lacks
    for bad, says in (("%q", "unknown field %q"), ("50%", "lone '%'"), ("x\\", "lone")):
        with pytest.raises(UserError, match=says):
            RecordFormat(bad)


def test_from() -> None:
    assert parse_start("earliest") == ("earliest", None)
    assert parse_start("12") == ("offset", 12)
    assert parse_start("-5") == ("last", 5)
    assert parse_start("@40") == ("time", 40)
    kind, ms = parse_start("@2026-11-25T21:00:00+00:00")
    assert (kind, ms) == ("timestamp", 1795640400000)
    for bad in ("-0", "soon", "@yesterday"):
        with pytest.raises(UserError, match="--from"):
            parse_start(bad)


def test_produce_lines_for_each_serde() -> None:
    json_lines = LineEncoder("json", "events", "stdin")
    assert json_lines.value(b'{"a": 1}', 1) == b'{"a": 1}'
    with pytest.raises(UserError, match="stdin, line 4: not JSON"):
        json_lines.value(b"{oops", 4)
    assert json_lines.key(b"user7") == b'"user7"'
    assert json_lines.key(b"7") == b"7"
    packed = LineEncoder("msgpack", "nums", "f.txt")
    assert msgspec.msgpack.decode(packed.value(b'[1, "two"]', 1)) == [1, "two"]
    assert LineEncoder("bytes", "raw", "-").value(b"\x00 anything", 1) == b"\x00 anything"
    with pytest.raises(UserError, match="pickle"):
        LineEncoder("pickle", "p", "-")
