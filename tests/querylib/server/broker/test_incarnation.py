"""Topic incarnations (DESIGN §4 "Topic incarnations"): a partition directory records which topic of
its name it belongs to (catalog topic id and creation time); a broker asked for a newer one sets the
old directory aside, refuses an older one, and takes a directory that records none as the one asked
for. A real BrokerServer, its in-process hook and its files."""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from catalog.errors import StorageError
from querylib.broker import AsyncProducer, Incarnation, StaleIncarnationError
from querylib.log import LogConfig
from querylib.records import iter_batches
from querylib.server.broker import BrokerServer
from querylib.server.broker._disk import INCARNATION_FILE, open_partition, write_incarnation
from tests._fsync import assert_synced_then_its_folder, record_fsyncs

SECRET = b"0123456789abcdef0123456789abcdef"


def _values(server: BrokerServer, pid) -> list[bytes]:
    log = server.partition_log(pid)
    data = log.read(0, 1 << 20, end_offset=log.durable_end_offset) \
        if log.log_end_offset else b""
    return [r.value for b in iter_batches(data) for r in b.records]


async def _write(server: BrokerServer, pid, session: str, value: bytes) -> None:
    """One record, written through the broker's public in-process port (and flushed)."""
    producer = AsyncProducer(server.port, pid[0], pid[1], principal="anonymous")
    await producer.start()
    await producer.send(value, time=0)
    await producer.flush()
    await producer.close(end=False)


def test_a_newer_topic_of_a_name_sets_the_old_partition_aside(tmp_path):
    async def scenario() -> None:
        server = BrokerServer(tmp_path, SECRET, log_config=LogConfig())
        await server.start("tcp://127.0.0.1:0")
        try:
            pid = await server.ensure_partition("x", 0, create=True, topic_id=5,
                                                topic_created_ms=100)
            await _write(server, pid, "s1", b"old")
            assert await server.ensure_partition("x", 0, create=False, topic_id=5,
                                                 topic_created_ms=100) == pid
            with pytest.raises(StaleIncarnationError, match="look the topic up again"):
                await server.ensure_partition("x", 0, create=True, topic_id=4,
                                              topic_created_ms=90)
            # the same id from a catalog started afresh later is another topic
            await server.ensure_partition("x", 0, create=True, topic_id=5,
                                          topic_created_ms=200)
            assert _values(server, pid) == []
            await _write(server, pid, "s2", b"new")
            assert _values(server, pid) == [b"new"]
        finally:
            await server.close()
        # a restarted broker knows the directory's incarnation from its file
        server = BrokerServer(tmp_path, SECRET, log_config=LogConfig())
        await server.start("tcp://127.0.0.1:0")
        try:
            with pytest.raises(StaleIncarnationError):
                await server.ensure_partition("x", 0, create=True, topic_id=5,
                                              topic_created_ms=100)
            assert _values(server, ("x", 0)) == [b"new"]
        finally:
            await server.close()

    asyncio.run(scenario())
    assert json.loads((tmp_path / "x-0" / "topic.json").read_text()) == {
        "topic": "x", "partition": 0, "topic_id": 5, "created_ms": 200}
    aside = tmp_path / ".orphaned-5-100-x-0"
    assert json.loads((aside / "topic.json").read_text())["created_ms"] == 100
    assert sorted(os.listdir(tmp_path)) == [".orphaned-5-100-x-0", "x-0"]


def test_opening_a_closed_partition_checks_its_incarnation(tmp_path):
    data = str(tmp_path)
    opened = open_partition(data, ("x", 1), LogConfig(), Incarnation(10, 3))
    opened.log.close()
    with pytest.raises(StaleIncarnationError):
        open_partition(data, ("x", 1), LogConfig(), Incarnation(5, 2))
    opened = open_partition(data, ("x", 1), LogConfig(), Incarnation(20, 9))
    assert opened.incarnation == Incarnation(20, 9)
    opened.log.close()
    assert sorted(os.listdir(tmp_path)) == [".orphaned-3-10-x-1", "x-1"]
    opened = open_partition(data, ("x", 1), LogConfig())  # no catalog: whatever it records
    assert opened.incarnation == Incarnation(20, 9)
    opened.log.close()


def test_a_directory_recording_no_topic_is_taken_as_the_one_asked_for(tmp_path):
    async def scenario() -> None:
        server = BrokerServer(tmp_path, SECRET, log_config=LogConfig())
        await server.start("tcp://127.0.0.1:0")
        try:
            pid = await server.ensure_partition("x", 0, create=True)  # no catalog
            await _write(server, pid, "s1", b"kept")
            await server.ensure_partition("x", 0, create=True, topic_id=7,
                                          topic_created_ms=70)
            assert _values(server, pid) == [b"kept"]
        finally:
            await server.close()

    asyncio.run(scenario())
    assert json.loads((tmp_path / "x-0" / "topic.json").read_text())["topic_id"] == 7


def test_a_link_planted_at_the_topic_files_temporary_name_is_not_followed(tmp_path):
    """`topic.json.tmp` was the temporary name: a link planted there made the incarnation
    land in its target (and the link take topic.json's place)."""
    part = tmp_path / "x-0"
    part.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (part / f"{INCARNATION_FILE}.tmp").symlink_to(victim)
    write_incarnation(str(part), ("x", 0), Incarnation(100, 5))
    assert victim.read_text() == "precious\n"
    assert not (part / INCARNATION_FILE).is_symlink()
    assert json.loads((part / INCARNATION_FILE).read_text())["topic_id"] == 5


def test_the_topic_file_is_fsynced_then_its_directory(tmp_path, monkeypatch):
    synced = record_fsyncs(monkeypatch)
    write_incarnation(str(tmp_path), ("x", 0), Incarnation(100, 5))
    assert_synced_then_its_folder(synced, tmp_path / INCARNATION_FILE)


def test_writers_naming_an_incarnation_record_it_one_at_a_time(tmp_path, monkeypatch):
    """A partition reopened (a promoted follower) while a subscriber naming its incarnation
    waits for it; in the loop turn the reopen ends, a second writer arrives. Seen on main:
    both wrote topic.json through the same temporary file at once, and one failed
    (FileNotFoundError renaming topic.json.tmp)."""
    import threading

    from querylib.server.broker import _server

    writing = [0]
    most = [0]
    guard = threading.Lock()
    real_write = _server.write_incarnation

    def write(*args):
        with guard:
            writing[0] += 1
            most[0] = max(most[0], writing[0])
        try:
            real_write(*args)
        finally:
            with guard:
                writing[0] -= 1

    monkeypatch.setattr(_server, "write_incarnation", write)

    async def scenario() -> None:
        server = BrokerServer(tmp_path, SECRET, log_config=LogConfig())
        await server.start("tcp://127.0.0.1:0")
        try:
            pid = await server.ensure_partition("x", 0, create=True)  # no catalog
            real_open = server._open
            arrive = asyncio.Event()

            async def reopened(*args):
                await real_open(*args)
                arrive.set()  # the late writer's wake-up is queued before the waiter's

            server._open = reopened  # type: ignore[method-assign]

            async def late() -> None:
                await arrive.wait()
                await server.ensure_partition("x", 0, create=True, topic_id=7,
                                              topic_created_ms=70)

            reopen = asyncio.create_task(server._reopen(pid))
            later = asyncio.create_task(late())
            await asyncio.sleep(0)
            waiting = asyncio.create_task(server.ensure_partition(
                "x", 0, create=True, topic_id=7, topic_created_ms=70))
            await asyncio.gather(reopen, later, waiting)
        finally:
            await server.close()

    asyncio.run(scenario())
    assert most[0] == 1
    assert json.loads((tmp_path / "x-0" / "topic.json").read_text())["topic_id"] == 7


@pytest.mark.parametrize("content", [
    b'{"created_ms": Infinity, "topic_id": 7}',  # JSON Python reads, no integer
    b'{"created_ms": 70.9, "topic_id": 7}',      # would be taken as 70: another incarnation
    b'{"created_ms": true, "topic_id": 7}',
    b'{"created_ms": "70", "topic_id": 7}',
])
def test_a_damaged_topic_file_is_one_clear_error_and_the_partition_is_kept(tmp_path, content):
    """topic.json decides whether a directory is set aside: one that holds no integers is
    refused naming the file, not read as some other incarnation, and not a traceback."""
    path = tmp_path / "x-0"
    open_partition(str(tmp_path), ("x", 0), LogConfig(),
                   Incarnation(created_ms=70, topic_id=7)).log.close()
    (path / "topic.json").write_bytes(content)
    with pytest.raises(StorageError, match="topic.json"):
        open_partition(str(tmp_path), ("x", 0), LogConfig(),
                       Incarnation(created_ms=80, topic_id=8))
    assert path.is_dir() and (path / "topic.json").read_bytes() == content
