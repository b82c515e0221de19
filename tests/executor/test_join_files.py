"""What a joined host keeps in its data directory (`executor/_join.py`): read back at a later
start, and refused in one line when it is damaged."""

from __future__ import annotations

from pathlib import Path

import pytest

from executor._join import COORDINATOR_FILE, CREDENTIAL_FILE, joined_host
from querylib.rpc import Credential, SecretFileError, write_credential

_CREDENTIAL = Credential("executor:h", bytes(range(32)))


def test_a_host_that_never_joined_has_nothing(tmp_path: Path) -> None:
    assert joined_host(tmp_path) is None


def test_what_a_join_kept_is_read_back(tmp_path: Path) -> None:
    write_credential(tmp_path / CREDENTIAL_FILE, _CREDENTIAL)
    (tmp_path / COORDINATOR_FILE).write_text('{"coordinators": ["tcp://a:7400", "tcp://b:7400"]}')
    joined = joined_host(tmp_path)
    assert joined is not None and joined.credential == _CREDENTIAL
    assert joined.coordinators == ("tcp://a:7400", "tcp://b:7400")


@pytest.mark.parametrize("content", [
    b"", b"{", b"[]", b'{"coordinators": []}',
    b'{"coordinators": "tcp://a:7400"}',        # one address, not a list: not its letters
    b'{"coordinators": {"tcp://a:7400": 1}}',
    b'{"coordinators": [7400]}', b'{"coordinators": [""]}',
    b'{"coordinators": ["tcp://a:7400"], "pad": "' + b" " * 70_000 + b'"}',
])
def test_a_damaged_coordinator_file_is_one_clear_error(tmp_path: Path, content: bytes) -> None:
    write_credential(tmp_path / CREDENTIAL_FILE, _CREDENTIAL)
    (tmp_path / COORDINATOR_FILE).write_bytes(content)
    with pytest.raises(SecretFileError, match="coordinator"):
        joined_host(tmp_path)
