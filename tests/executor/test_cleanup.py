"""Bounded disk cleanup on an executor: old work dirs and unused artifacts go, running ones
and recent ones stay (real files; no clocks: ages are set with os.utime)."""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

import pytest

from executor._artifacts import ArtifactCache
from executor._cleanup import cache_bytes, prune_artifacts, prune_work_dirs, touch_artifact
from executor._pack import pack_bytes

NOW = 1_700_000_000.0


def _work_dir(root: Path, name: str, age: float) -> Path:
    path = root / name
    path.mkdir(parents=True)
    (path / "out.txt").write_text("left behind")
    read_only = path / "frozen"
    read_only.mkdir()
    (read_only / "f").write_text("x")
    read_only.chmod(0o500)  # a query may leave read-only trees: still removable
    os.utime(path, (NOW - age, NOW - age))
    return path


def test_work_dirs_beyond_the_newest_are_removed_but_never_a_running_one(tmp_path: Path):
    root = tmp_path / "work"
    newest = _work_dir(root, "7-0-0", 10)
    older = _work_dir(root, "6-1-0", 20)
    running = _work_dir(root, "1-0-0", 1000)  # old, but its process still runs
    oldest = _work_dir(root, "5-0-2", 30)
    stranger = root / "notes"  # not a work dir: never touched
    stranger.mkdir()
    removed = prune_work_dirs(root, keep=3, running=[running])
    assert removed == [oldest]
    assert {p.name for p in root.iterdir()} == {"7-0-0", "6-1-0", "1-0-0", "notes"}
    assert prune_work_dirs(root, keep=1, running=[running]) == [newest, older]
    assert prune_work_dirs(tmp_path / "absent", keep=0) == []
    with pytest.raises(ValueError):
        prune_work_dirs(root, keep=-1)


def test_ended_work_dirs_are_kept_within_their_bytes_oldest_first(tmp_path: Path):
    """Within the count bound ended work dirs had no bound in bytes: a query that wrote a lot
    into its work dir left that much for up to 49 later exits. Past `max_bytes` the oldest
    ended ones go (never a running one's), as many as it takes; sizes are measured without
    following symlinks, so a link to a big file elsewhere neither counts nor goes."""
    root = tmp_path / "work"
    ages = (40, 30, 20, 10)  # made[0] oldest
    made = [_work_dir(root, f"{n}-0-0", age) for n, age in enumerate(ages)]
    elsewhere = tmp_path / "elsewhere.bin"
    elsewhere.write_bytes(bytes(2_000_000))
    (made[3] / "link.bin").symlink_to(elsewhere)  # counted as a link, not as its target
    for path, age in zip(made, ages, strict=True):
        (path / "data.bin").write_bytes(os.urandom(200_000))
        os.utime(path, (NOW - age, NOW - age))  # writing into it made it new again
    (root / "9-0-0").symlink_to(tmp_path)  # a link named like a work dir: not one
    running = made[0]  # the oldest, but its process still runs
    removed = prune_work_dirs(root, keep=50, running=[running], max_bytes=250_000)
    assert removed == [made[1], made[2]]
    assert sorted(p.name for p in root.iterdir()) == ["0-0-0", "3-0-0", "9-0-0"]
    assert elsewhere.stat().st_size == 2_000_000 and (tmp_path / "work").is_dir()
    # The running one stays even past the bound: nothing else ended left to remove but the
    # newest, which is within it.
    assert prune_work_dirs(root, keep=50, running=[running], max_bytes=250_000) == []
    assert prune_work_dirs(root, keep=50, running=[running], max_bytes=1) == [made[3]]


def test_artifacts_unused_for_longer_than_the_ttl_are_removed(tmp_path: Path):
    cache = ArtifactCache(tmp_path / "artifacts")
    stale = cache.install(pack_bytes("job.py", b"print('old')\n"))
    busy = cache.install(pack_bytes("job.py", b"print('busy')\n"))
    fresh = cache.install(pack_bytes("job.py", b"print('new')\n"))
    for artifact in (stale, busy):
        os.utime(artifact.root, (NOW - 3600, NOW - 3600))
    os.utime(fresh.root, (NOW - 10, NOW - 10))
    removed = prune_artifacts(cache, unused_for=600, now=NOW, running={busy.digest})
    assert removed == [stale.digest]
    assert sorted(cache.digests()) == sorted([busy.digest, fresh.digest])


def test_the_cache_is_kept_within_its_bytes_least_recently_used_first(tmp_path: Path):
    """Within the TTL the cache had no bound: a user running a new 64 MiB pack each time filled
    an executor's disk within the week. Past `max_bytes` the least recently used go (never a
    running one), as many as it takes."""
    cache = ArtifactCache(tmp_path / "artifacts")
    blob = os.urandom(200_000)  # incompressible and large beside the trees' overhead
    made = [cache.install(pack_bytes("data.bin", blob + bytes([i]))) for i in range(4)]
    for age, artifact in zip((40, 30, 20, 10), made, strict=True):  # made[0] least recent
        os.utime(artifact.root, (NOW - age, NOW - age))
    size = cache_bytes(cache)
    assert size > 4 * 400_000  # each holds its pack and its unpacked program
    busy = made[0]  # the least recently used, but its process still runs
    removed = prune_artifacts(cache, unused_for=3600, now=NOW, running={busy.digest},
                              max_bytes=size // 2)
    assert removed == [made[1].digest, made[2].digest]
    assert sorted(cache.digests()) == sorted([busy.digest, made[3].digest])
    assert cache_bytes(cache) <= size // 2
    # Running ones are kept even past the bound: nothing else left to remove.
    assert prune_artifacts(cache, unused_for=3600, now=NOW,
                           running={busy.digest, made[3].digest}, max_bytes=1) == []


def test_touching_an_artifact_marks_it_used(tmp_path: Path):
    cache = ArtifactCache(tmp_path / "artifacts")
    artifact = cache.install(pack_bytes("job.py", b"pass\n"))
    os.utime(artifact.root, (0, 0))
    touch_artifact(cache, artifact.digest)
    assert artifact.root.stat().st_mtime > 0
    touch_artifact(cache, "0" * 64)  # unknown: nothing to mark


def test_a_work_dir_that_will_not_go_is_logged_and_not_reported_removed(
        tmp_path: Path, caplog: pytest.LogCaptureFixture):
    root = tmp_path / "work"
    stuck = _work_dir(root, "3-0-0", 30)
    pinned = stuck / "pinned"
    pinned.write_text("immutable")
    if subprocess.run(["chattr", "+i", str(pinned)], capture_output=True).returncode != 0:
        pytest.skip("needs chattr +i (root on a filesystem with the immutable attribute)")
    try:
        with caplog.at_level(logging.WARNING, logger="executor"):
            assert prune_work_dirs(root, keep=0) == []
        assert pinned.exists()
        assert "cannot remove all of" in caplog.text and "pinned" in caplog.text
    finally:
        subprocess.run(["chattr", "-i", str(pinned)], check=True)
    assert prune_work_dirs(root, keep=0) == [stuck]  # the next cleanup finishes it


def test_an_artifact_whose_removal_stopped_half_way_goes_at_the_next_cleanup(
        tmp_path: Path, caplog: pytest.LogCaptureFixture):
    """A removal renames the artifact to `.incoming-*` and deletes that; one that would not
    finish left it, unseen by the cache's byte bound, until the agent restarted. It is logged,
    and the next cleanup (after the next process exit, the same cache) finishes it."""
    cache = ArtifactCache(tmp_path / "artifacts")
    artifact = cache.install(pack_bytes("job.py", b"print('old')\n"))
    os.utime(artifact.root, (NOW - 3600, NOW - 3600))
    pinned = artifact.program / "job.py"
    if subprocess.run(["chattr", "+i", str(pinned)], capture_output=True).returncode != 0:
        pytest.skip("needs chattr +i (root on a filesystem with the immutable attribute)")
    try:
        with caplog.at_level(logging.WARNING, logger="executor"):
            assert prune_artifacts(cache, unused_for=600, now=NOW) == [artifact.digest]
        assert "cannot remove all of" in caplog.text
        left = [p.name for p in cache.directory.iterdir()]
        assert len(left) == 1 and left[0].startswith(".incoming-") and cache.digests() == []
    finally:
        for path in cache.directory.glob("*/program/job.py"):
            subprocess.run(["chattr", "-i", str(path)], check=True)
    assert prune_artifacts(cache, unused_for=600, now=NOW) == []
    assert list(cache.directory.iterdir()) == []
