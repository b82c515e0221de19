"""The cluster secret file: created 0600 when missing, refused when too open."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from querylib.rpc import (
    Credential,
    SecretFileError,
    default_secret_path,
    load_credential,
    load_or_create_secret,
    load_secret,
    write_credential,
)
from tests._fsync import assert_synced_then_its_folder, record_fsyncs


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_missing_file_is_created_private_with_a_fresh_key(tmp_path: Path) -> None:
    path = tmp_path / "home" / "secret"
    key = load_or_create_secret(path)
    assert len(key) == 64 and int(key, 16) >= 0
    assert mode(path) == 0o600 and mode(path.parent) == 0o700
    assert load_or_create_secret(path) == key == load_secret(path)
    assert [p.name for p in path.parent.iterdir()] == ["secret"]  # no temp file left


def test_two_keys_differ(tmp_path: Path) -> None:
    assert load_or_create_secret(tmp_path / "a") != load_or_create_secret(tmp_path / "b")


@pytest.mark.parametrize("too_open", [0o640, 0o604, 0o644, 0o660, 0o602, 0o700])
def test_file_readable_or_writable_by_others_is_refused(tmp_path: Path, too_open: int) -> None:
    path = tmp_path / "secret"
    load_or_create_secret(path)
    os.chmod(path, too_open)
    if too_open & 0o077:
        with pytest.raises(SecretFileError, match="chmod 600"):
            load_secret(path)
        with pytest.raises(SecretFileError):
            load_or_create_secret(path)
    else:
        assert load_secret(path)


def test_missing_file_is_a_user_error_when_not_creating(tmp_path: Path) -> None:
    with pytest.raises(SecretFileError, match="does not exist") as info:
        load_secret(tmp_path / "nope")
    assert info.value.exit_code == 2


def test_short_key_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_bytes(b"short\n")
    os.chmod(path, 0o600)
    with pytest.raises(SecretFileError, match="at least 16"):
        load_secret(path)


def test_hand_written_key_is_used_as_is(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_bytes(b"  my own long cluster secret  \n")
    os.chmod(path, 0o600)
    assert load_secret(path) == b"my own long cluster secret"


def test_symlink_and_directory_are_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    load_or_create_secret(real)
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(SecretFileError):
        load_secret(link)
    with pytest.raises(SecretFileError):
        load_secret(tmp_path)


def test_concurrent_creators_agree_on_one_key(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    keys: list[bytes] = []
    threads = [threading.Thread(target=lambda: keys.append(load_or_create_secret(path)))
               for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(keys) == 8 and len(set(keys)) == 1


def test_default_path_follows_tq_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TQ_HOME", str(tmp_path))
    assert default_secret_path() == tmp_path / "secret"


@pytest.mark.parametrize("size", [5_000, 70_000])
def test_an_oversized_key_file_is_refused_not_cut(tmp_path: Path, size: int) -> None:
    """Every reader of a key file takes all of it or refuses it: the coordinator read up to
    64 KiB of the secret, a client (its credential) 4 KiB, so a longer hand-written key
    started a coordinator that refused its own admin; past 64 KiB both cut it silently."""
    path = tmp_path / "secret"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(b"a" * size)
    with pytest.raises(SecretFileError, match="more than"):
        load_secret(path)
    with pytest.raises(SecretFileError, match="more than"):
        load_credential(path)


# -- the folder a secret is written into ---------------------------------------------------------

# The two ways tq writes a secret: the cluster secret created when missing, and a credential
# file (`tq user add`, `tq user rotate`, a join token redeemed, an executor's own).
_WRITERS = {
    "secret": lambda path: load_or_create_secret(path),
    "credential": lambda path: write_credential(path, Credential("user:alice",
                                                                 bytes(range(32)))),
}


@pytest.mark.parametrize("writer", sorted(_WRITERS))
def test_a_new_secret_is_fsynced_then_its_folder(tmp_path: Path, writer: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A key is minted once (the coordinator keeps the user, the cluster signs with it): a
    power loss right after must not lose the file's link into the folder, so the folder is
    fsynced after the link, as the file is before it."""
    synced = record_fsyncs(monkeypatch)
    _WRITERS[writer](tmp_path / "key")
    assert_synced_then_its_folder(synced, tmp_path / "key")


@pytest.mark.parametrize("writer", sorted(_WRITERS))
@pytest.mark.parametrize("folder_mode", [0o777, 0o1777, 0o702], ids=oct)
def test_a_secret_is_not_written_into_a_folder_others_may_write(
        tmp_path: Path, writer: str, folder_mode: int) -> None:
    """Another user who may write the folder may replace the file tq writes there (with a key
    of their own, say): refused as ssh refuses keys in such a folder, naming the folder and
    what to do, with nothing written."""
    folder = tmp_path / "shared"
    folder.mkdir()
    os.chmod(folder, folder_mode)
    _assert_refused(writer, folder)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another group takes root")
@pytest.mark.parametrize("writer", sorted(_WRITERS))
@pytest.mark.parametrize("folder_mode", [0o770, 0o720], ids=oct)
def test_a_secret_is_not_written_into_a_folder_a_shared_group_may_write(
        tmp_path: Path, writer: str, folder_mode: int) -> None:
    """The folder's group holds other users (or may: a group that is not its owner's own)."""
    folder = tmp_path / "shared"
    folder.mkdir()
    os.chown(folder, -1, 54321)  # no such group here: nobody's own
    os.chmod(folder, folder_mode)
    _assert_refused(writer, folder)


def _assert_refused(writer: str, folder: Path) -> None:
    """`writer` refuses to write into `folder`, naming it and what to do, writing nothing."""
    with pytest.raises(SecretFileError, match=f"{folder}.*chmod 700 {folder}") as info:
        _WRITERS[writer](folder / "key")
    assert info.value.exit_code == 2
    assert list(folder.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder away takes root")
@pytest.mark.parametrize("writer", sorted(_WRITERS))
def test_a_secret_is_not_written_into_a_folder_of_another_user(tmp_path: Path,
                                                               writer: str) -> None:
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o700)
    os.chown(folder, 54321, -1)
    with pytest.raises(SecretFileError, match=f"{folder} belongs to uid 54321"):
        _WRITERS[writer](folder / "key")
    assert list(folder.iterdir()) == []


@pytest.mark.parametrize("writer", sorted(_WRITERS))
@pytest.mark.parametrize("folder_mode", [0o700, 0o750, 0o755], ids=oct)
def test_a_secret_is_written_into_a_folder_only_its_owner_may_write(
        tmp_path: Path, writer: str, folder_mode: int) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    os.chmod(folder, folder_mode)
    _WRITERS[writer](folder / "key")
    assert mode(folder / "key") == 0o600


def _own_group() -> bool:
    """Whether this user's primary group is its own (a user private group, as Debian and
    Ubuntu make, where umask 002 makes every new folder 0775)."""
    import grp
    import pwd

    user = pwd.getpwuid(os.getuid())
    try:
        group = grp.getgrgid(user.pw_gid)
    except KeyError:
        return False
    return group.gr_name == user.pw_name and not group.gr_mem


@pytest.mark.skipif(not _own_group(), reason="this user's group is not its own")
@pytest.mark.parametrize("writer", sorted(_WRITERS))
@pytest.mark.parametrize("folder_mode", [0o775, 0o770], ids=oct)
def test_a_secret_is_written_into_a_folder_its_owners_own_group_may_write(
        tmp_path: Path, writer: str, folder_mode: int) -> None:
    """A user private group holds its user alone: a folder it may write (every folder made
    under umask 002) is the user's own, and a newcomer's first `tq user add` there works."""
    folder = tmp_path / "mine"
    folder.mkdir()
    os.chown(folder, -1, os.getgid())
    os.chmod(folder, folder_mode)
    _WRITERS[writer](folder / "key")
    assert mode(folder / "key") == 0o600
