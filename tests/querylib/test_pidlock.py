"""The lock files `tq up`, `tq coordinator` and every server's data directory are held by
(`querylib/_pidlock.py`): who holds them, and what a planted link cannot make them do."""

from __future__ import annotations

from pathlib import Path

import pytest

from catalog.errors import StorageError
from querylib._pidlock import PidLock, hold_data_dir


def test_a_lock_names_its_holder_and_is_refused_to_another(tmp_path: Path) -> None:
    first = hold_data_dir(tmp_path)
    try:
        other = PidLock(tmp_path / PidLock.FILE)
        assert not other.acquire()
        assert other.holder().startswith("process ")
    finally:
        first.release()
    assert other.acquire()
    other.release()


def test_a_link_planted_where_the_lock_goes_is_refused_and_its_target_kept(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """TQ_HOME or a data dir others can write: a link named cluster.lock or tq.lock must not
    make the lock truncate the file it points to and write a pid into it."""
    victim = tmp_path_factory.mktemp("elsewhere") / "precious"
    victim.write_bytes(b"not yours\n")
    (tmp_path / "cluster.lock").symlink_to(victim)
    with pytest.raises(StorageError, match="cluster.lock"):
        PidLock(tmp_path / "cluster.lock").acquire()
    assert victim.read_bytes() == b"not yours\n"
