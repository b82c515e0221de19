"""Process exits on a real `tq up` (DESIGN §5 "Collective publishing", §3 "Publications are held per
process"): a Merge topic of a 2-process query whose second process exits 0 without ever publishing
it ends once the first closes (the broker learns the exit from the catalog); and a process that
exits without closing its publisher leaves the publication while the other process still runs."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import querylib
from catalog import Publication, Topic
from tests.conftest import wait_for
from tests.integration._up import Up

pytestmark = pytest.mark.timeout(120)

MERGE_ONE_WRITER = """\
import sys
import querylib

def main(ctx):
    if ctx.process == 0:  # process 1 returns at once: exit 0, never publishing
        with ctx.publish(sys.argv[1], partition=querylib.Merge, serde="json") as out:
            out.send(0, [1, 2, 3])
            out.advance_to(1)

querylib.execute(main)
"""

NO_CLOSE = """\
import os, sys, time
import querylib

def wait_for_file(path):
    deadline = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)

def main(ctx):
    topic, release = sys.argv[1], sys.argv[2]
    out = ctx.publish(topic, partition=querylib.PerWorker, serde="json")
    out.send(0, [ctx.process])
    if ctx.process == 0:
        wait_for_file(release + ".published")  # both hold the publication now
        os._exit(0)  # exits 0 without closing its publisher
    open(release + ".published", "w").close()
    wait_for_file(release)  # process 1 runs until the test lets it go
    out.close()

querylib.execute(main)
"""


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    with Up(tmp_path_factory.mktemp("tq-up-exits"), "--connector-port", "-1",
            "--kafka-port", "-1") as running:
        yield running


def _program(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.py"
    path.write_text(text)
    return path


def test_merge_ends_when_the_process_that_never_published_exits_0(up: Up,
                                                                  tmp_path: Path) -> None:
    query_id = up.submit(_program(tmp_path, MERGE_ONE_WRITER), "--processes", "2", "--",
                         "exit-merge")
    with querylib.connect(up.info["coordinator"], secret_file=up.info["secret_file"]) as ctx, \
            ctx.subscribe("exit-merge", timeout=60, serde="json") as sub:
        records: list[int] = []
        deadline = time.monotonic() + 60
        ended = False
        while not ended and time.monotonic() < deadline:
            event = sub.next_event(timeout=1.0)
            if isinstance(event, querylib.Data):
                records.extend(event.records)
            ended = isinstance(event, querylib.EndOfStream)
    assert ended, "no end of stream: the group still waits for process 1"
    assert records == [1, 2, 3]
    query = up.ended(query_id)
    assert query.state.value == "finished" and query.exit_codes == (0, 0)


def test_an_exit_without_close_leaves_the_publication(up: Up, tmp_path: Path) -> None:
    release = tmp_path / "release"
    query_id = up.submit(_program(tmp_path, NO_CLOSE), "--processes", "2", "--",
                         "exit-noclose", str(release))

    def held() -> tuple[int, ...] | None:
        with up.cluster() as cluster:
            snap = cluster.snapshot("topics", "publications")
        topics = [t for t, _ in snap["topics"].records
                  if isinstance(t, Topic) and t.short_name == "exit-noclose"]
        if not topics:
            return None
        pubs = [p.processes for p, _ in snap["publications"].records
                if isinstance(p, Publication) and p.topic_id == topics[0].topic_id]
        return pubs[0] if pubs else ()

    wait_for(lambda: up.query(query_id).exit_codes[0] == 0, timeout=60,
             what="process 0 to exit")
    assert held() == (1,)  # process 0 left it, though it never closed
    assert up.query(query_id).exit_codes[1] is None  # while process 1 still runs
    release.write_text("")
    query = up.ended(query_id)
    assert query.state.value == "finished"
    assert held() == ()
