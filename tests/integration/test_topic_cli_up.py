"""Reading and writing topics from the command line against a real `tq up` (issue 14, part
"Reading and writing topics" and "Topics"): `tq consume` decodes values with the topic's serde,
`--format`, `--from -N` / `--from @T`, `--group`; `tq produce` checks lines against the serde
and sets headers; `tq topic describe`, sizes in `tq topics`, `tq topic create --if-not-exists`.

Each test runs the commands as a user would, through $TQ_HOME/cluster.json."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.integration._up import Up

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    with Up(tmp_path_factory.mktemp("tq-up")) as running:
        yield running


def _publish(up: Up, name: str, values: list, **options: object) -> None:
    """Publish `values` at logical time 0 with querylib's defaults (msgpack unless named)."""
    with up.connect() as ctx, ctx.publish(name, **options) as out:
        out.send(0, values)


def test_consume_of_a_default_msgpack_topic_prints_one_json_line_per_record(up: Up) -> None:
    """Problem 1: 2,000 msgpack records printed as raw bytes came out as 2,008 lines of
    blank lines and control characters."""
    _publish(up, "nums", list(range(2000)))
    read = up.tq("consume", "nums")
    assert read.returncode == 0, read.stderr
    lines = read.stdout.splitlines()
    assert len(lines) == 2000
    assert [json.loads(line) for line in lines] == list(range(2000))
    assert all(c.isprintable() for c in read.stdout.replace("\n", ""))


def _json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def test_keys_are_shown_and_json_output_holds_decoded_values(up: Up) -> None:
    from querylib.api import Hash

    points = [{"id": i % 3, "x": i} for i in range(12)]
    _publish(up, "points", points, partition=Hash(2, key=lambda p: p["id"]),
             record_type="Point")
    read = up.tq("consume", "points")
    assert read.returncode == 0, read.stderr
    pairs = [line.split("\t") for line in read.stdout.splitlines()]
    assert sorted((json.loads(k), json.loads(v)["x"]) for k, v in pairs) == \
        sorted((p["id"], p["x"]) for p in points)

    records = [e for e in _json_lines(up.tq("consume", "points", "--json").stdout)
               if "value" in e]
    assert sorted(r["value"]["x"] for r in records) == list(range(12))
    assert all(r["key"] == r["value"]["id"] for r in records)


def test_bytes_are_escaped_and_pickle_is_never_unpickled(up: Up) -> None:
    _publish(up, "raw", [b"plain text", b"two\nlines", b"\x00\x1b[31m\xff"], serde="bytes")
    read = up.tq("consume", "raw")
    assert read.returncode == 0, read.stderr
    assert read.stdout == "plain text\ntwo\\nlines\n\\x00\\x1b[31m\\xff\n"

    marker = up.home / "unpickled"
    _publish(up, "pickled", [_Boom(str(marker))], serde="pickle")
    read = up.tq("consume", "pickled")
    assert read.returncode == 0, read.stderr
    assert read.stdout.startswith("<pickle: ") and read.stdout.endswith(" bytes>\n")
    assert not marker.exists()


class _Boom:
    """Unpickling one creates the file it names: proof that a reader unpickled it."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return (open, (self.path, "w"))


def test_format_like_kcat(up: Up) -> None:
    _publish(up, "fmt", ["a", "b"], serde="json")
    read = up.tq("consume", "fmt", "--format", "%t %p:%o @%L [%S] %s|%k%%\\n")
    assert read.returncode == 0, read.stderr
    assert read.stdout.splitlines() == ['fmt 0:0 @0 [3] "a"|%', 'fmt 0:1 @0 [3] "b"|%']
    bad = up.tq("consume", "fmt", "--format", "%q")
    assert bad.returncode != 0 and "unknown field %q" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_from_the_last_n_records_and_from_a_logical_time(up: Up) -> None:
    with up.connect() as ctx, ctx.publish("late", serde="json") as out:
        for t in range(10):  # one record per time: frontier records take offsets between
            out.send(t, [t])
            out.advance_to(t + 1)
    last = up.tq("consume", "late", "--from", "-3")
    assert last.returncode == 0, last.stderr
    assert last.stdout == "7\n8\n9\n"
    assert up.tq("consume", "late", "--from", "-30").stdout.splitlines() == \
        [str(t) for t in range(10)]
    since = up.tq("consume", "late", "--from", "@6", "--format", "%L=%s\\n")
    assert since.stdout == "6=6\n7=7\n8=8\n9=9\n"
    bad = up.tq("consume", "late", "--from=-x")
    assert bad.returncode != 0 and "-N (the last N records" in bad.stderr


def test_consume_as_a_consumer_group_resumes_at_its_commit(up: Up) -> None:
    with up.connect() as ctx, ctx.publish("grouped", serde="json") as out:
        for t in range(6):
            out.send(t, [t])
        out.send(6, [6, 7])
    first = up.tq("consume", "grouped", "--group", "readers", "--count", "4")
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines() == ["0", "1", "2", "3"]
    rest = up.tq("consume", "grouped", "--group", "readers", "--count", "3")
    assert rest.returncode == 0, rest.stderr
    # The group committed what the first member printed; --count finishes the records of
    # one time (6 and 7) rather than commit one it did not print.
    assert rest.stdout.splitlines() == ["4", "5", "6", "7"]
    again = up.tq("consume", "grouped", "--group", "readers", "--from", "earliest",
                  "--json")
    assert again.returncode == 0, again.stderr
    assert _json_lines(again.stdout) == [{"end_of_stream": True}]


def test_produce_checks_lines_against_a_json_topic(up: Up) -> None:
    assert up.tq("topic", "create", "events", "--record-type", "json").returncode == 0
    bad = up.tq("produce", "events", stdin='{"a": 1}\n{"a": 2}\nnot json\n{"a": 4}\n')
    assert bad.returncode != 0
    (line,) = bad.stderr.splitlines()
    assert "line 3: not JSON" in line and "'not json'" in line
    good = up.tq("produce", "events", "--header", "source=cli", "--header", "n=1",
                 stdin='{"a": 5}\n')
    assert good.returncode == 0, good.stderr
    read = up.tq("consume", "events", "--follow", "--format", "%s %h\\n")
    assert read.stdout.splitlines() == ['{"a":1} ', '{"a":2} ', '{"a":5} source=cli,n=1']


def test_produce_encodes_json_lines_into_a_msgpack_topic(up: Up) -> None:
    assert up.tq("topic", "create", "packed", "--record-type", "msgpack").returncode == 0
    done = up.tq("produce", "packed", "--key-separator", "|",
                  stdin='{"seed": 0}\n{"x": 1}\nuser7|[1, 2, "three"]\n')
    assert done.returncode == 0, done.stderr
    with up.connect() as ctx, ctx.subscribe("packed", timeout=30) as sub:
        from querylib.api import Data
        values = [r for e in sub if isinstance(e, Data) for r in e.records]
    assert values == [{"seed": 0}, {"x": 1}, [1, 2, "three"]]
    keyed = up.tq("consume", "packed", "--format", "%k|%s\\n").stdout.splitlines()
    assert keyed[-1] == '"user7"|[1,2,"three"]'


def test_topic_describe_sizes_in_topics_and_create_if_not_exists(up: Up) -> None:
    created = up.tq("topic", "create", "described", "--partitions", "2",
                    "--record-type", "json/Reading")
    assert created.returncode == 0, created.stderr
    again = up.tq("topic", "create", "described", "--partitions", "2")
    assert again.returncode != 0 and "--if-not-exists" in again.stderr
    again = up.tq("topic", "create", "described", "--if-not-exists")
    assert again.returncode == 0, again.stderr
    assert "exists already" in again.stderr
    lines = "".join(f'{{"n": {i}}}\n' for i in range(10))
    assert up.tq("produce", "described", "--partition", "1", stdin=lines).returncode == 0

    shown = up.tq("topic", "describe", "described")
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    assert "kind stream" in text and "serde json" in text and "record type Reading" in text
    assert "owner ingest" in text
    body = json.loads(up.tq("topic", "describe", "described", "--json").stdout)
    (p0, p1) = body["partitions"]
    assert (p0["start"], p0["end"], p0["bytes"]) == (0, 0, 0)
    assert p1["start"] == 0 and p1["end"] >= 10 and p1["bytes"] > 0
    assert p1["ended"] is True and isinstance(p1["broker"], int)
    assert p1["address"].startswith("tcp://127.0.0.1:")
    assert body["serde"] == "json" and body["record_type"] == "Reading"

    listed = {t["short_name"]: t for t in _json_lines(up.tq("topics", "--json").stdout)}
    assert listed["described"]["bytes"] == p1["bytes"]
    table = up.tq("topics").stdout.splitlines()
    assert "BYTES" in table[0]

    missing = up.tq("topic", "describe", "nowhere")
    assert missing.returncode != 0 and "nowhere" in missing.stderr
    assert "Traceback" not in missing.stderr
