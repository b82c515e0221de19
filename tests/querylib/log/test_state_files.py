"""The small files a partition log replaces whole beside its segments: the recovery point
(`recovery-point-offset-checkpoint`, and the log start offset's checkpoint), the leader epochs
(`leader-epoch-checkpoint`) and a segment's damaged ranges (`<base>.damage`). Each goes to a
temporary file of its own, is fsynced, renamed, and its directory fsynced
(`querylib._state_file.replace_file`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from querylib.log import LeaderEpochCache, PartitionLog
from querylib.log._config import CHECKPOINT_FILE, EPOCH_CHECKPOINT_FILE
from querylib.log._damage import Damage, load_damage, save_damage
from querylib.log._epochs import read_epoch_checkpoint, write_epoch_checkpoint
from querylib.log._recovery import read_checkpoint, write_checkpoint
from tests._fsync import assert_synced_then_its_folder, record_fsyncs
from tests.querylib.log._batches import make_batch

DAMAGE_FILE = "00000000000000000000.damage"
_DAMAGE = (Damage(10, 20, 3, 5, "CRC mismatch"),)


def _checkpoint(directory: Path) -> None:
    write_checkpoint(str(directory), 42)


def _epochs(directory: Path) -> None:
    write_epoch_checkpoint(str(directory), LeaderEpochCache(((1, 0), (4, 7))))


def _damage(directory: Path) -> None:
    save_damage(str(directory / DAMAGE_FILE), _DAMAGE)


# Each file, how the log writes it, and whether what is there now is what was written.
WRITERS: dict[str, tuple[Callable[[Path], None], Callable[[Path], bool]]] = {
    CHECKPOINT_FILE: (_checkpoint, lambda d: read_checkpoint(str(d)) == 42),
    EPOCH_CHECKPOINT_FILE: (_epochs, lambda d: (epochs := read_epoch_checkpoint(str(d)))
                            is not None and epochs.entries == ((1, 0), (4, 7))),
    DAMAGE_FILE: (_damage, lambda d: load_damage(str(d / DAMAGE_FILE)) == _DAMAGE),
}


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_a_link_planted_at_the_temporary_name_is_not_followed(tmp_path: Path,
                                                              name: str) -> None:
    """`<file>.tmp` was the temporary name: a link planted there made the write land in its
    target, and the rename put the link in the file's place."""
    part = tmp_path / "t-0"
    part.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (part / f"{name}.tmp").symlink_to(victim)
    write, written = WRITERS[name]
    write(part)
    assert victim.read_text() == "precious\n"
    assert not (part / name).is_symlink()
    assert written(part)


def test_an_open_log_does_not_follow_a_link_planted_beside_it(tmp_path: Path) -> None:
    """The same through the log itself: a new leader epoch rewrites the checkpoint while the
    log is open (its leftover temporary files were removed when it opened)."""
    path = tmp_path / "t-0"
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    with PartitionLog.open(path) as log:
        (path / f"{EPOCH_CHECKPOINT_FILE}.tmp").symlink_to(victim)
        log.append_batches([make_batch(2, seed=0)], leader_epoch=3)
    assert victim.read_text() == "precious\n"
    assert not (path / EPOCH_CHECKPOINT_FILE).is_symlink()
    with PartitionLog.open(path) as log:
        assert log.leader_epochs.entries == ((3, 0),)


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_each_file_is_fsynced_then_its_directory(tmp_path: Path, name: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    synced = record_fsyncs(monkeypatch)
    WRITERS[name][0](tmp_path)
    assert_synced_then_its_folder(synced, tmp_path / name)
    assert os.listdir(tmp_path) == [name]  # no temporary file left
