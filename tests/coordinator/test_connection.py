"""Finding the coordinator: --coordinator, TQ_COORDINATOR, then $TQ_HOME/cluster.json; and the
one-line errors when there is none."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from querylib.cluster import (
    ClusterFileError,
    ClusterInfo,
    NoCoordinatorError,
    cluster_file,
    discover,
    read_cluster_file,
    remove_cluster_file,
    write_cluster_file,
)
from querylib.rpc import Credential, SecretFileError, load_or_create_secret


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TQ_HOME", str(tmp_path))
    monkeypatch.delenv("TQ_COORDINATOR", raising=False)
    load_or_create_secret(tmp_path / "secret")
    return tmp_path


def _info(home: Path, **fields: object) -> ClusterInfo:
    values: dict[str, object] = {"coordinator": "tcp://127.0.0.1:7400",
                                 "secret_file": str(home / "secret"), "pid": os.getpid(),
                                 "host": socket.gethostname()}
    values.update(fields)
    return ClusterInfo(**values)  # type: ignore[arg-type]


def test_nothing_configured_says_how_to_start_a_coordinator(home: Path) -> None:
    with pytest.raises(NoCoordinatorError, match="tq coordinator"):
        discover()


def test_the_cluster_file_is_written_privately_and_read_back(home: Path) -> None:
    path = write_cluster_file(_info(home))
    assert path == cluster_file() == home / "cluster.json"
    assert (path.stat().st_mode & 0o777) == 0o600
    assert read_cluster_file() == _info(home)
    found = discover()
    assert found.address == "tcp://127.0.0.1:7400" and found.source == str(path)
    assert found.secret == Credential("admin", (home / "secret").read_bytes().strip())


def test_the_argument_beats_the_environment_beats_the_file(
        home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_cluster_file(_info(home))
    monkeypatch.setenv("TQ_COORDINATOR", "tcp://10.0.0.1:1")
    assert discover().address == "tcp://10.0.0.1:1"
    assert discover("tcp://10.0.0.2:2").address == "tcp://10.0.0.2:2"


def test_a_file_left_by_a_dead_coordinator_is_recognised(home: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    write_cluster_file(_info(home, pid=int(dead.stdout)))
    with pytest.raises(NoCoordinatorError, match="not running"):
        discover()


@pytest.mark.parametrize("content", [b"", b"[]", b"{}", b'{"coordinator": 5}',
                                     b"\xff\xfe", b'{"coordinator": "x", "secret_file": "y",'
                                     b' "pid": "nope"}', b" " * 70_000])
def test_a_malformed_cluster_file_is_one_clear_error(home: Path, content: bytes) -> None:
    (home / "cluster.json").write_bytes(content)
    with pytest.raises(ClusterFileError, match="cluster.json"):
        discover()


def test_writing_the_cluster_file_follows_no_link_planted_in_tq_home(
        home: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """A link planted in TQ_HOME where the file is first written (a shared or pre-made home)
    must not make the writer truncate and fill the file it points to."""
    victim = tmp_path_factory.mktemp("elsewhere") / "precious"
    victim.write_bytes(b"not yours\n")
    for name in (f".cluster.json.{os.getpid()}.tmp", ".cluster.json.tmp"):
        (home / name).symlink_to(victim)
    path = write_cluster_file(_info(home))
    assert victim.read_bytes() == b"not yours\n"
    assert not path.is_symlink() and read_cluster_file() == _info(home)
    assert (path.stat().st_mode & 0o777) == 0o600


@pytest.mark.parametrize("field", [{"coordinator_key": 5}, {"kafka": [1]}, {"host": 5},
                                   {"data": {}}, {"catalog_broker": 7}, {"connector": True}])
def test_a_cluster_file_field_of_the_wrong_type_is_one_clear_error(
        home: Path, field: dict[str, object]) -> None:
    """Not accepted and carried on to where it is used (a number as the coordinator's CURVE
    key ended in zmq's TypeError)."""
    body = {"coordinator": "tcp://127.0.0.1:7400", "secret_file": str(home / "secret"),
            "pid": os.getpid(), **field}
    (home / "cluster.json").write_text(json.dumps(body))
    with pytest.raises(ClusterFileError, match=f"cluster.json.*{next(iter(field))}"):
        discover()


def test_a_missing_secret_is_reported(home: Path) -> None:
    write_cluster_file(_info(home, secret_file=str(home / "missing")))
    with pytest.raises(SecretFileError):
        discover()


def test_only_the_writer_removes_the_file(home: Path) -> None:
    write_cluster_file(_info(home, pid=1))
    remove_cluster_file(os.getpid())
    assert cluster_file().exists()
    remove_cluster_file(1)
    assert not cluster_file().exists()


def test_where_the_coordinators_curve_key_comes_from(
        home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The argument, else TQ_COORDINATOR_KEY, else the credential file's, else cluster.json's
    (for the coordinator it names); else the admin derives it for a coordinator on another
    host; a loopback one without a key is PLAIN. Whatever is found is remembered for the
    address, so every client of the process connects with CURVE."""
    from querylib.rpc import (
        coordinator_public_key,
        principal_key,
        server_key_of,
        write_credential,
    )

    monkeypatch.delenv("TQ_COORDINATOR_KEY", raising=False)
    secret = (home / "secret").read_bytes().strip()
    derived = coordinator_public_key(secret)
    assert discover("tcp://127.0.0.1:7400").coordinator_key == ""
    assert server_key_of("tcp://127.0.0.1:7400") is None
    assert discover("tcp://10.0.0.9:7400").coordinator_key == derived
    assert server_key_of("tcp://10.0.0.9:7400") == derived.encode()
    write_cluster_file(_info(home, coordinator_key="k" * 40))
    assert discover().coordinator_key == "k" * 40
    assert discover("tcp://127.0.0.1:7499").coordinator_key == ""  # not the file's
    alice = Credential("user:alice", principal_key(secret, "user:alice"))
    write_credential(home / "alice.json", alice, coordinator_key="a" * 40)
    found = discover(secret_file=str(home / "alice.json"))
    assert found.coordinator_key == "a" * 40 and found.secret == alice
    monkeypatch.setenv("TQ_COORDINATOR_KEY", "e" * 40)
    assert discover(secret_file=str(home / "alice.json")).coordinator_key == "e" * 40
    assert discover(coordinator_key="g" * 40).coordinator_key == "g" * 40
