"""Which inodes os.fsync was called on: a power cut cannot be simulated in a test, so the
calls (still made) are recorded, and a test checks that a replaced file was fsynced before
its rename and its folder after it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

Inode = tuple[int, int]


def record_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[Inode]:
    """From now on, every os.fsync's (device, inode), in order; each still syncs."""
    synced: list[Inode] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        st = os.fstat(fd)
        synced.append((st.st_dev, st.st_ino))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    return synced


def inode(path: str | os.PathLike[str]) -> Inode:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def assert_synced_then_its_folder(synced: list[Inode], path: str | os.PathLike[str]) -> None:
    """The file now at `path` was fsynced, and its folder after that."""
    file, folder = inode(path), inode(Path(path).parent)
    assert file in synced, f"{path} was not fsynced"
    assert folder in synced[synced.index(file) + 1:], \
        f"the folder of {path} was not fsynced after it"
