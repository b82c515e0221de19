"""The catalog topics on disk: changes written as the writer writes them (counters last) and read
back by recovery, including a crash in the middle of a commit, with real partition logs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from catalog import (
    Catalog,
    CorruptCatalogError,
    SessionKind,
    Topic,
    catalog_topic,
)
from coordinator import Persist, read_catalog
from coordinator._journal import (
    CHECKPOINT_TOPIC,
    CheckpointEntry,
    TimedUpdate,
    encode_block,
    encode_checkpoint,
    encode_updates,
    group_updates,
)
from querylib.cluster import messages as m
from querylib.log import PartitionLog, partition_dir_name
from querylib.records import encode_batch, frontier_batch

from ._driver import Driver


class Disk:
    """Catalog partitions under a directory, appended to as the writer appends."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.logs: dict[str, PartitionLog] = {}

    def log(self, collection: str) -> PartitionLog:
        if collection not in self.logs:
            path = self.root / partition_dir_name(catalog_topic(collection), 0)
            self.logs[collection] = PartitionLog.open(path)
        return self.logs[collection]

    def write(self, per: dict[str, list[TimedUpdate]], *, skip: tuple[str, ...] = ()) -> None:
        for collection, updates in per.items():
            if collection in skip:
                continue
            for batch in encode_updates(updates, wall_ms=1):
                self.log(collection).append(batch)

    def commit(self, changes: list[Persist], *, crash_before: tuple[str, ...] = ()) -> None:
        """One commit, counters last; `crash_before` names collections never written."""
        per = group_updates(changes)
        counters = per.pop("counters", [])
        self.write(per, skip=crash_before)
        if "counters" not in crash_before:
            self.write({"counters": counters})
            last = changes[-1].version
            for collection in per:
                self.log(collection).append(frontier_batch(last + 1, timestamp=1))

    def blocks(self, catalog: Catalog) -> CheckpointEntry:
        """Every collection's block at the catalog's version (not indexed yet)."""
        offsets = {}
        for name, collection in catalog.collections():
            log = self.log(name)
            offsets[name] = log.log_end_offset
            for batch in encode_block(catalog.version, list(collection.items()), wall_ms=1):
                log.append(batch)
        return CheckpointEntry(version=catalog.version, offsets=offsets)

    def index(self, entry: CheckpointEntry) -> None:
        if CHECKPOINT_TOPIC not in self.logs:
            self.logs[CHECKPOINT_TOPIC] = PartitionLog.open(
                self.root / partition_dir_name(CHECKPOINT_TOPIC, 0))
        self.logs[CHECKPOINT_TOPIC].append(encode_checkpoint(entry, wall_ms=1))

    def close(self) -> None:
        for log in self.logs.values():
            log.close()
        self.logs.clear()


def _busy_driver() -> Driver:
    d = Driver()
    a = d.session(lease_ms=1000)
    b = d.session(SessionKind.EXECUTOR, lease_ms=1000)
    d.call(m.CreateTopic(session_id=a, name="numbers", partitions=3))
    d.call(m.Publish(session_id=a, name="numbers"))
    d.call(m.Subscribe(session_id=b, name="numbers"))
    d.call(m.CreateTopic(session_id=b, name="tenant/ns/other", ingest=True))
    d.call(m.CloseSession(session_id=b))
    return d


def test_changes_written_in_commits_replay_to_the_same_catalog(tmp_path: Path) -> None:
    d = _busy_driver()
    disk = Disk(tmp_path)
    persisted = d.persisted
    for start in range(0, len(persisted), 3):  # commits of three changes
        disk.commit(persisted[start:start + 3])
    disk.close()
    recovered = read_catalog(tmp_path)
    assert recovered.catalog == d.state.catalog
    assert recovered.catalog.version == d.state.catalog.version
    assert recovered.catalog.counters == d.state.catalog.counters
    assert recovered.compensation == {}


def test_a_commit_cut_short_by_a_crash_is_taken_back(tmp_path: Path) -> None:
    d = _busy_driver()
    committed = Catalog.replay(d.state.catalog.snapshot())
    disk = Disk(tmp_path)
    disk.commit(d.persisted)
    session = d.session(lease_ms=1000)
    d.call(m.CreateTopic(session_id=session, name="lost", partitions=2))
    torn = d.persisted[-2:]
    # The topics batch made it, the sessions and counters batches did not.
    disk.commit(torn, crash_before=("sessions", "counters"))
    disk.close()
    recovered = read_catalog(tmp_path)
    assert recovered.catalog == committed
    assert recovered.catalog.find_topic("lost") is None
    (undo,) = recovered.compensation["topics"]
    assert isinstance(undo.record, Topic) and undo.record.short_name == "lost"
    assert undo.diff == -1 and undo.time == committed.version + 2

    # Appending the compensation makes the next recovery see nothing to take back, and the
    # aborted versions can be reused by new changes.
    disk = Disk(tmp_path)
    disk.write(recovered.compensation)
    disk.close()
    again = read_catalog(tmp_path)
    assert again.catalog == committed and again.compensation == {}


def test_an_empty_or_missing_directory_is_an_empty_catalog(tmp_path: Path) -> None:
    assert read_catalog(tmp_path / "none").catalog == Catalog()
    assert read_catalog(tmp_path).catalog.version == 0


def test_foreign_bytes_in_a_catalog_topic_are_refused(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / partition_dir_name(catalog_topic("topics"), 0))
    log.append(encode_batch([(1, None, b"\x81\xa4nope\x01", ())]))
    log.close()
    with pytest.raises(CorruptCatalogError):
        read_catalog(tmp_path)


def test_a_record_of_the_wrong_collection_is_refused(tmp_path: Path) -> None:
    d = _busy_driver()
    session = next(u.record for p in d.persisted for u in p.updates
                   if u.collection == "sessions")
    log = PartitionLog.open(tmp_path / partition_dir_name(catalog_topic("topics"), 0))
    (batch,) = encode_updates([TimedUpdate(1, session, 1)], wall_ms=1)
    log.append(batch)
    log.close()
    with pytest.raises(CorruptCatalogError):
        read_catalog(tmp_path)


def test_counters_that_disagree_with_the_log_are_refused(tmp_path: Path) -> None:
    d = _busy_driver()
    counters = d.state.catalog.counters
    log = PartitionLog.open(tmp_path / partition_dir_name(catalog_topic("counters"), 0))
    # A counters record claiming a version other than the time it was written at.
    (batch,) = encode_updates([TimedUpdate(counters.version + 5, counters, 1)], wall_ms=1)
    log.append(batch)
    log.close()
    with pytest.raises(CorruptCatalogError):
        read_catalog(tmp_path)


def test_big_commits_are_split_into_bounded_batches() -> None:
    d = Driver()
    topic = d.state.catalog_topics()["topics"]
    updates = [TimedUpdate(i, topic, 1) for i in range(20_000)]
    batches = list(encode_updates(updates, wall_ms=1))
    assert len(batches) > 1
    assert all(len(b) <= 2 * 1024 * 1024 for b in batches)


def _more(d: Driver, prefix: str) -> None:
    session = d.session(lease_ms=1000)
    for i in range(3):
        d.call(m.CreateTopic(session_id=session, name=f"{prefix}{i}"))
    d.call(m.Publish(session_id=session, name=f"{prefix}0"))
    d.call(m.DeleteTopic(session_id=session, name=f"{prefix}1"))


def test_recovery_starts_at_the_last_checkpoint(tmp_path: Path) -> None:
    d = _busy_driver()
    disk = Disk(tmp_path)
    disk.commit(d.persisted)
    disk.index(disk.blocks(d.state.catalog))
    written = len(d.persisted)
    _more(d, "after")
    disk.commit(d.persisted[written:])
    disk.close()
    recovered = read_catalog(tmp_path)
    assert recovered.catalog == d.state.catalog
    assert recovered.catalog.counters == d.state.catalog.counters
    assert recovered.checkpoint is not None
    # Only the changes after the checkpoint were read as changes.
    assert recovered.since_checkpoint == sum(len(p.updates) for p in d.persisted[written:])


def test_an_unindexed_block_is_skipped_and_the_older_checkpoint_used(tmp_path: Path) -> None:
    d = _busy_driver()
    disk = Disk(tmp_path)
    disk.commit(d.persisted)
    first = disk.blocks(d.state.catalog)
    disk.index(first)
    written = len(d.persisted)
    _more(d, "mid")
    disk.commit(d.persisted[written:])
    disk.blocks(d.state.catalog)  # the crash came before its index entry
    written = len(d.persisted)
    _more(d, "late")
    disk.commit(d.persisted[written:])
    disk.close()
    recovered = read_catalog(tmp_path)
    assert recovered.checkpoint == first
    assert recovered.catalog == d.state.catalog


def test_recovery_without_a_checkpoint_skips_every_block(tmp_path: Path) -> None:
    d = _busy_driver()
    disk = Disk(tmp_path)
    disk.commit(d.persisted[:5])
    disk.blocks(Catalog.replay(u for p in d.persisted[:5] for u in p.updates))
    disk.commit(d.persisted[5:])
    disk.close()
    assert read_catalog(tmp_path).catalog == d.state.catalog


def test_a_collection_newer_than_the_checkpoint_is_read_whole(tmp_path: Path) -> None:
    """A catalog written before a collection existed (`homes`, say) has neither its topic nor
    a block for it in its checkpoint: recovery takes it as empty, and once the upgraded
    coordinator wrote to it, reads its topic from the start until the next checkpoint."""
    d = _busy_driver()
    disk = Disk(tmp_path)
    disk.commit(d.persisted)
    entry = disk.blocks(d.state.catalog)
    assert not d.state.catalog.homes  # nothing was written to it
    (disk.logs.pop("homes")).close()
    shutil.rmtree(tmp_path / partition_dir_name(catalog_topic("homes"), 0))
    disk.index(CheckpointEntry(version=entry.version,
                               offsets={c: o for c, o in entry.offsets.items() if c != "homes"}))
    written = len(d.persisted)
    disk.close()
    assert read_catalog(tmp_path).catalog == d.state.catalog
    d.host("host-a")  # a broker registered by an executor session: a home
    disk.commit(d.persisted[written:])
    disk.close()
    recovered = read_catalog(tmp_path)
    assert recovered.catalog == d.state.catalog and recovered.catalog.homes
    # A collection the checkpoint names must still be there.
    shutil.rmtree(tmp_path / partition_dir_name(catalog_topic("users"), 0), ignore_errors=True)
    shutil.rmtree(tmp_path / partition_dir_name(catalog_topic("topics"), 0))
    with pytest.raises(CorruptCatalogError, match="is missing"):
        read_catalog(tmp_path)


def test_a_checkpoint_pointing_nowhere_is_refused(tmp_path: Path) -> None:
    d = _busy_driver()
    disk = Disk(tmp_path)
    disk.commit(d.persisted)
    entry = disk.blocks(d.state.catalog)
    disk.index(CheckpointEntry(version=entry.version,
                               offsets={**entry.offsets, "topics": 0}))
    disk.close()
    with pytest.raises(CorruptCatalogError, match="does not start here"):
        read_catalog(tmp_path)


def test_a_malformed_checkpoint_entry_is_refused(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / partition_dir_name(CHECKPOINT_TOPIC, 0))
    log.append(encode_batch([(1, None, b"\x01", ())]))
    log.close()
    with pytest.raises(CorruptCatalogError):
        read_catalog(tmp_path)
