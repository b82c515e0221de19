"""The file `namespace` in the coordinator's data dir (coordinator/_namespace.py): written once
when a cluster is first started, replaced whole and durably (`querylib._state_file`)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from catalog import DEFAULT_NAMESPACE, DEFAULT_TENANT, set_default_namespace
from coordinator._namespace import FILE, settle_namespace
from tests._fsync import assert_synced_then_its_folder, record_fsyncs


@pytest.fixture(autouse=True)
def default_namespace_restored() -> Iterator[None]:
    """settle_namespace makes its answer this process's default: put the usual one back."""
    yield
    set_default_namespace(DEFAULT_TENANT, DEFAULT_NAMESPACE)


def test_the_chosen_namespace_is_kept_and_read_back(tmp_path: Path) -> None:
    assert settle_namespace(str(tmp_path), "acme/lab") == "acme/lab"
    assert (tmp_path / FILE).read_text() == "acme/lab\n"
    assert settle_namespace(str(tmp_path), None) == "acme/lab"
    assert os.listdir(tmp_path) == [FILE]  # no temporary file left


def test_a_link_planted_at_the_temporary_name_is_not_followed(tmp_path: Path) -> None:
    """`namespace.tmp` was the temporary name: a link planted there (a shared data dir, one
    unpacked from elsewhere) made the write land in its target."""
    data = tmp_path / "data"
    data.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (data / f"{FILE}.tmp").symlink_to(victim)
    settle_namespace(str(data), "acme/lab")
    assert victim.read_text() == "precious\n"
    assert (data / FILE).read_text() == "acme/lab\n"
    assert not (data / FILE).is_symlink()


def test_the_file_is_fsynced_then_its_directory(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A power loss right after the first start must not lose the default every bare name
    was resolved with: the file is fsynced before its rename, the directory after it."""
    synced = record_fsyncs(monkeypatch)
    settle_namespace(str(tmp_path), "acme/lab")
    assert_synced_then_its_folder(synced, tmp_path / FILE)
