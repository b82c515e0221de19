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
