"""Queries on a real `tq up` (coordinator + executor agent in one process): `tq submit` packs,
uploads and runs programs on the executor, the processes register (the barrier), their exits
reach the catalog; `tq kill` terminates them; a process that cannot start fails the query and
its submitter hears why; a SIGKILLed process fails its query; output reaches `tq logs`."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import textwrap
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from catalog import InvalidCommandError
from querylib.cluster import Cluster
from tests.conftest import wait_for
from tests.coordinator._cluster import ROOT
from tests.integration._up import SLOTS, Up

pytestmark = pytest.mark.timeout(180)

SUBSCRIBER = textwrap.dedent('''
    import sys
    import querylib

    def main(ctx):
        total = 0
        with ctx.subscribe(sys.argv[1], timeout=120) as sub:
            for event in sub:
                if isinstance(event, querylib.Data):
                    total += sum(event.records)
        print(f"total {total}", flush=True)

    querylib.execute(main)
''')

SLEEPER = textwrap.dedent('''
    import os, sys, time
    from pathlib import Path
    import querylib

    def main(ctx):
        Path(sys.argv[1], f"{os.getpid()}").write_text("")
        while True:
            print("still here", flush=True)
            time.sleep(0.5)

    querylib.execute(main)
''')


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    with Up(tmp_path_factory.mktemp("tq-up")) as running:
        yield running


def _program(up: Up, name: str, text: str) -> Path:
    path = up.home / name
    path.write_text(text)
    return path


def _pids(directory: Path, count: int) -> list[int]:
    found = wait_for(lambda: len(list(directory.iterdir())) >= count and
                     sorted(int(p.name) for p in directory.iterdir()),
                     timeout=60, what=f"{count} processes to start")
    return found  # type: ignore[return-value]


def test_numbers_and_a_subscriber_run_to_the_end(up: Up) -> None:
    # The shipped example itself, run as a file (its folder is sys.path[0]).
    numbers = ROOT / "querylib" / "examples" / "numbers_query.py"
    subscriber = _program(up, "sum_job.py", SUBSCRIBER)
    reader = up.submit(subscriber, "--", "nums")
    writer = up.submit(numbers, "--processes", "2", "--workers", "2", "--wait", "--",
                       "--topic", "nums")
    done = up.ended(writer)
    assert (done.state.value, done.exit_codes, done.processes) == ("finished", (0, 0), 2)
    read = up.ended(reader)
    assert (read.state.value, read.exit_codes) == ("finished", (0,))
    logs = up.tq("logs", str(reader))
    assert logs.returncode == 0, logs.stderr
    assert f"[0] total {sum(range(400))}" in logs.stdout.splitlines()
    status = up.tq("status", str(writer))
    assert status.returncode == 0, status.stderr
    assert status.stdout.startswith(f"query {writer} numbers_query [finished] 2 x 2 on "
                                    "executors 1,1; exit codes 0,0"), status.stdout


def test_kill_terminates_the_processes(up: Up) -> None:
    pids_dir = up.home / "kill-pids"
    pids_dir.mkdir()
    sleeper = _program(up, "sleeper.py", SLEEPER)
    query_id = up.submit(sleeper, "--processes", "2", "--", str(pids_dir))
    pids = _pids(pids_dir, 2)
    assert up.query(query_id).state.value == "running"
    killed = up.tq("kill", str(query_id))
    assert killed.returncode == 0, killed.stderr
    assert up.ended(query_id).state.value == "killed"
    wait_for(lambda: not any(psutil.pid_exists(p) and psutil.Process(p).status() !=
                             psutil.STATUS_ZOMBIE for p in pids),
             timeout=30, what="the killed processes to be gone")
    logs = up.tq("logs", str(query_id))
    assert "still here" in logs.stdout


def test_a_failed_spawn_reaches_the_submitter(up: Up) -> None:
    sleeper = _program(up, "sleeper2.py", SLEEPER)
    pins = [arg for _ in range(SLOTS + 1) for arg in ("--executor", "1")]
    pids_dir = up.home / "spawn-pids"
    pids_dir.mkdir()
    done = up.tq("submit", str(sleeper), "--processes", str(SLOTS + 1), *pins, "--",
                 str(pids_dir))
    assert done.returncode != 0
    assert "NoFreeSlotsError" in done.stderr and "could not start" in done.stderr, done.stderr
    (query,) = [q for q in up.queries() if q.program.startswith("sha256:")
                and q.name == "sleeper2"]
    ended = up.ended(query.query_id)
    assert ended.state.value == "failed" and "NoFreeSlotsError" in ended.reason
    # What did start was killed: every slot comes back.
    wait_for(lambda: all(not psutil.pid_exists(int(p.name)) or
                         psutil.Process(int(p.name)).status() == psutil.STATUS_ZOMBIE
                         for p in pids_dir.iterdir()),
             timeout=30, what="the started processes to be killed")


def test_a_sigkilled_process_fails_its_query(up: Up) -> None:
    pids_dir = up.home / "sigkill-pids"
    pids_dir.mkdir()
    sleeper = _program(up, "sleeper3.py", SLEEPER)
    query_id = up.submit(sleeper, "--processes", "2", "--", str(pids_dir))
    pids = _pids(pids_dir, 2)
    os.kill(pids[0], signal.SIGKILL)
    ended = up.ended(query_id)
    assert ended.state.value == "failed"
    assert -signal.SIGKILL in ended.exit_codes


def test_uploads_are_checked_against_their_digest(up: Up) -> None:
    with Cluster.connect(up.info["coordinator"], secret_file=up.info["secret_file"]) as cluster:
        with pytest.raises(InvalidCommandError, match="hashes to"):
            cluster.upload_artifact("0" * 64, b"not the pack you named")
        with pytest.raises(InvalidCommandError, match="not a sha256 digest"):
            cluster.upload_artifact("../../etc/passwd", b"x")
        pack = b"any bytes at all"
        digest = hashlib.sha256(pack).hexdigest()
        assert cluster.upload_artifact(digest, pack) == f"sha256:{digest}"


def test_packs_upload_in_chunks_of_a_bounded_size(up: Up) -> None:
    """The coordinator takes no message bigger than one chunk and a little room (DESIGN §2
    "Limits"), so a pack of several chunks goes up a chunk at a time and comes back whole."""
    from querylib.cluster.messages import ARTIFACT_CHUNK_BYTES, UploadArtifact

    pack = os.urandom(5 * ARTIFACT_CHUNK_BYTES + 12345)
    digest = hashlib.sha256(pack).hexdigest()
    with Cluster.connect(up.info["coordinator"], secret_file=up.info["secret_file"]) as cluster:
        assert cluster.upload_artifact(digest, pack) == f"sha256:{digest}"
        assert cluster._call(cluster._async.fetch_artifact(digest)) == pack

        client, session = cluster._async.client, cluster.session_id

        def chunk(offset: int, size: int, data: bytes) -> object:
            request = UploadArtifact(session_id=session, sha256="1" * 64, offset=offset,
                                     size=size)
            return cluster._call(client.request(request, payload=[data]))

        with pytest.raises(InvalidCommandError, match="at most"):
            chunk(0, 64 * 1024 * 1024 + 1, b"x")  # refused at the first chunk, by its size
        assert chunk(0, 30, b"a" * 10).size == 10
        with pytest.raises(InvalidCommandError, match="does not follow"):
            chunk(20, 30, b"b" * 10)  # a chunk went missing
        with pytest.raises(InvalidCommandError, match="does not fit"):
            chunk(0, 5, b"c" * 10)


def test_topic_create(up: Up) -> None:
    done = up.tq("topic", "create", "feed", "--partitions", "3")
    assert done.returncode == 0, done.stderr
    listed = up.tq("topics", "--json")
    (topic,) = [t for t in map(json.loads, listed.stdout.splitlines()) if "feed" in str(t)]
    assert topic["partitions"] == 3


@pytest.mark.parametrize("command", [["logs"], ["kill"], ["status"], ["status", "--json"]])
def test_an_unknown_query_is_an_error(up: Up, command: list[str]) -> None:
    done = up.tq(*command[:1], "424242", *command[1:])
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.strip().startswith("tq: error: no query 424242"), done.stderr
    assert done.stdout == ""
