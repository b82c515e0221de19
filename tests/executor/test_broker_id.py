"""The executor broker keeps its id across restarts (`executor/_broker_id.py`), against a
stand-in for the coordinator that enforces the catalog's RegisterBroker rules, and the
addresses it listened on."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from catalog import (
    DEFAULT_NAMESPACE,
    DEFAULT_TENANT,
    Broker,
    BrokerExistsError,
    NotOwnerError,
    UnknownBrokerError,
    UnknownSessionError,
    default_namespace,
    set_default_namespace,
)
from executor._broker_id import (
    BROKER_ENDPOINTS_FILE,
    BROKER_ID_FILE,
    BROKER_SESSION_FILE,
    NAMESPACE_FILE,
    Endpoints,
    _remember,
    follow_remembered_namespace,
    preferred_listen,
    register_remembered,
    remember_endpoints,
    remember_namespace,
    remembered_endpoints,
)
from querylib.cluster.messages import CloseSession
from tests._fsync import assert_synced_then_its_folder, record_fsyncs


class Catalog:
    """RegisterBroker as catalog/_rules.py decides it: a known id not up, or with none the
    id last registered in the same slot (one host, one principal here) if it is down, else a
    new one. It is also the caller's session (`session_id`, set by a test for a new run), and
    CloseSession of a session it knows takes that session's ids down."""

    def __init__(self, next_id: int = 1, up: set[int] | None = None,
                 expire_after: int = 0) -> None:
        self.next_id = next_id
        self.up = up or set()
        self.expire_after = expire_after  # refusals before the held ids' session expires
        self.asked: list[tuple[int | None, int]] = []
        self.homes: dict[int, int] = {}  # slot -> the id last registered there
        self.foreign: set[int] = set()  # ids another principal registered
        self.session_id = 1
        self.holders: dict[int, int] = {}  # broker id -> the session that registered it
        self.closed: list[int] = []  # sessions closed by CloseSession

    async def request(self, request: CloseSession, *, timeout: float) -> None:
        held = [b for b, session in self.holders.items() if session == request.session_id]
        if not held:
            raise UnknownSessionError(f"no session {request.session_id}")
        self.closed.append(request.session_id)
        for broker_id in held:
            del self.holders[broker_id]
            self.up.discard(broker_id)

    async def register_broker(self, host: str, address: str, *, broker_id: int | None = None,
                              kafka_address: str = "", curve_key: str = "",
                              slot: int = 0) -> Broker:
        self.asked.append((broker_id, slot))
        if broker_id is None and self.homes.get(slot, 0) not in self.up | {0}:
            broker_id = self.homes[slot]
        elif broker_id is None:
            broker_id, self.next_id = self.next_id, self.next_id + 1
        elif broker_id >= self.next_id:
            raise UnknownBrokerError(f"broker id {broker_id} was never assigned")
        elif broker_id in self.foreign:
            raise NotOwnerError(f"broker {broker_id} belongs to executor:other, not us")
        elif broker_id in self.up:
            if self.expire_after == 0:
                self.up.clear()
            else:
                self.expire_after -= 1
            raise BrokerExistsError(f"broker {broker_id} is registered already")
        self.up.add(broker_id)
        self.homes[slot] = broker_id
        self.holders[broker_id] = self.session_id
        return Broker(broker_id=broker_id, host=host, address=address,
                      session_id=self.session_id, kafka_address=kafka_address)


def _register(catalog: Catalog, data: Path, wait: float = 30.0, *, slot: int = 0,
              claim: int | None = None) -> Broker:
    return asyncio.run(register_remembered(catalog, data, "h", "tcp://h:1",  # type: ignore[arg-type]
                                           wait=wait, slot=slot, claim=claim))


def test_a_new_broker_remembers_its_id_and_rejoins_under_it(tmp_path: Path) -> None:
    catalog = Catalog(next_id=3)
    assert _register(catalog, tmp_path).broker_id == 3
    assert (tmp_path / BROKER_ID_FILE).read_text() == "3\n"
    catalog.up.clear()  # the executor stopped cleanly: its broker left the catalog
    assert _register(catalog, tmp_path).broker_id == 3
    assert catalog.asked == [(None, 0), (3, 0)]


def test_a_lost_data_dir_asks_for_no_id_in_its_slot_and_remembers_what_it_got(
        tmp_path: Path) -> None:
    catalog = Catalog(next_id=3)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = _register(catalog, tmp_path / "a", slot=1).broker_id
    catalog.up.clear()  # the host went down, and its disk with it
    assert _register(catalog, tmp_path / "b", slot=1).broker_id == first
    assert (tmp_path / "b" / BROKER_ID_FILE).read_text() == f"{first}\n"
    assert catalog.asked == [(None, 1), (None, 1)]


def test_a_claimed_id_overrides_the_remembered_one_and_is_waited_for(tmp_path: Path) -> None:
    (tmp_path / BROKER_ID_FILE).write_text("2\n")
    catalog = Catalog(next_id=5, up={3}, expire_after=1)
    assert _register(catalog, tmp_path, claim=3).broker_id == 3
    assert (tmp_path / BROKER_ID_FILE).read_text() == "3\n"
    assert [asked for asked, _ in catalog.asked] == [3, 3, 3]


def test_a_remembered_id_of_another_principal_says_what_to_do(tmp_path: Path) -> None:
    (tmp_path / BROKER_ID_FILE).write_text("2\n")
    catalog = Catalog(next_id=5)
    catalog.foreign.add(2)
    with pytest.raises(NotOwnerError, match="belongs to executor:other.*broker.id names it.*"
                       "remove the file"):
        _register(catalog, tmp_path)
    assert (tmp_path / BROKER_ID_FILE).read_text() == "2\n"  # left for the operator


def test_a_claimed_id_the_cluster_never_assigned_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(UnknownBrokerError):
        _register(Catalog(next_id=4), tmp_path, claim=9)
    assert not (tmp_path / BROKER_ID_FILE).exists()


def test_an_id_still_up_after_a_crash_is_waited_for(tmp_path: Path) -> None:
    (tmp_path / BROKER_ID_FILE).write_text("2\n")
    catalog = Catalog(next_id=5, up={2}, expire_after=2)
    assert _register(catalog, tmp_path).broker_id == 2
    assert [asked for asked, _ in catalog.asked] == [2, 2, 2, 2]


def test_a_restart_closes_the_previous_runs_session_rather_than_wait_for_it(
        tmp_path: Path) -> None:
    """The caller holds the data dir's lock: the run that registered from it last has ended,
    so its session (kept in broker.session) is closed and the id is taken at once (here the
    id would stay up for good otherwise, and there is no wait)."""
    catalog = Catalog(next_id=3, expire_after=10**9)
    assert _register(catalog, tmp_path).broker_id == 3
    assert (tmp_path / BROKER_SESSION_FILE).read_text() == "1\n"
    catalog.session_id = 7  # the next run (the first was killed: id 3 is still up)
    assert _register(catalog, tmp_path, wait=0.0).broker_id == 3
    assert catalog.closed == [1]
    assert (tmp_path / BROKER_SESSION_FILE).read_text() == "7\n"
    catalog.up.clear()  # a rejoin in the same process: its own session is never closed
    catalog.holders.clear()
    assert _register(catalog, tmp_path, wait=0.0).broker_id == 3
    assert catalog.closed == [1]


def test_a_previous_session_gone_already_is_no_error_and_a_taken_id_still_waits(
        tmp_path: Path) -> None:
    (tmp_path / BROKER_ID_FILE).write_text("2\n")
    (tmp_path / BROKER_SESSION_FILE).write_text("5\n")  # expired meanwhile: unknown
    catalog = Catalog(next_id=5, up={2}, expire_after=1)  # held by another session
    assert _register(catalog, tmp_path).broker_id == 2
    assert catalog.closed == [] and [asked for asked, _ in catalog.asked] == [2, 2, 2]


def test_an_id_that_stays_up_is_refused_after_the_wait(tmp_path: Path) -> None:
    (tmp_path / BROKER_ID_FILE).write_text("2\n")
    catalog = Catalog(next_id=5, up={2}, expire_after=10**9)
    with pytest.raises(BrokerExistsError):
        _register(catalog, tmp_path, wait=0.0)


@pytest.mark.parametrize("content", ["9\n", "garbage", "-1", ""])
def test_an_id_from_another_cluster_or_a_damaged_file_gets_a_new_one(
        tmp_path: Path, content: str) -> None:
    (tmp_path / BROKER_ID_FILE).write_text(content)
    catalog = Catalog(next_id=4)
    assert _register(catalog, tmp_path).broker_id == 4
    assert (tmp_path / BROKER_ID_FILE).read_text() == "4\n"


@pytest.mark.parametrize("content", [b"\xff\xfe\n", "\u00b2\n".encode(), b"7" * 5000])
def test_a_broker_id_file_of_bytes_that_are_no_number_gets_a_new_one(
        tmp_path: Path, content: bytes) -> None:
    """Not UTF-8, digits int() refuses (a superscript two), or no id's length: damaged like
    "garbage", not a traceback at start."""
    (tmp_path / BROKER_ID_FILE).write_bytes(content)
    (tmp_path / BROKER_SESSION_FILE).write_bytes(content)
    catalog = Catalog(next_id=4)
    assert _register(catalog, tmp_path).broker_id == 4
    assert (tmp_path / BROKER_ID_FILE).read_text() == "4\n"
    assert catalog.closed == []


@pytest.mark.parametrize("content", [b"acme/lab\n", b"\xff\xfe/lab\n", b"", b"a/b/c\n"])
def test_a_damaged_namespace_file_is_ignored_not_a_traceback(tmp_path: Path,
                                                             content: bytes) -> None:
    """cluster.namespace is a hint the session confirms: one that is no TENANT/NAMESPACE
    (not UTF-8 either) leaves the default as it was."""
    (tmp_path / NAMESPACE_FILE).write_bytes(content)
    try:
        follow_remembered_namespace(tmp_path)
        expected = ("acme", "lab") if content == b"acme/lab\n" else (DEFAULT_TENANT,
                                                                     DEFAULT_NAMESPACE)
        assert default_namespace() == expected
    finally:
        set_default_namespace(DEFAULT_TENANT, DEFAULT_NAMESPACE)


# -- addresses ------------------------------------------------------------------------------------


def test_endpoints_are_remembered_and_read_back(tmp_path: Path) -> None:
    assert remembered_endpoints(tmp_path) == Endpoints()
    endpoints = Endpoints("tcp://127.0.0.1:40001", "127.0.0.1:40002", "")
    remember_endpoints(tmp_path, endpoints)
    assert remembered_endpoints(tmp_path) == endpoints
    (tmp_path / BROKER_ENDPOINTS_FILE).write_text("{not json")
    assert remembered_endpoints(tmp_path) == Endpoints()  # ignored (with a warning)


@pytest.mark.parametrize(("listen", "previous", "preferred"), [
    ("tcp://127.0.0.1:0", "tcp://127.0.0.1:40001", "tcp://127.0.0.1:40001"),
    ("tcp://127.0.0.1:0", "", None),                          # first run
    ("tcp://127.0.0.1:7500", "tcp://127.0.0.1:40001", None),  # a port was asked for
    ("tcp://0.0.0.0:0", "tcp://127.0.0.1:40001", None),       # another host now
    ("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", None),
])
def test_the_previous_address_is_preferred_only_for_any_free_port(
        listen: str, previous: str, preferred: str | None) -> None:
    assert preferred_listen(listen, previous) == preferred


# -- the files themselves ----------------------------------------------------------------------

_ENDPOINTS = Endpoints("tcp://127.0.0.1:40001", "127.0.0.1:40002", "127.0.0.1:40003")

# Each file of the data dir, written as the executor writes it, and what it then holds.
_WRITERS: dict[str, tuple[Callable[[Path, int], None], Callable[[int], str]]] = {
    BROKER_ID_FILE: (lambda d, n: _remember(d, n), lambda n: f"{n}\n"),
    BROKER_SESSION_FILE: (lambda d, n: _remember(d, n, BROKER_SESSION_FILE),
                          lambda n: f"{n}\n"),
    BROKER_ENDPOINTS_FILE: (lambda d, n: remember_endpoints(d, _ENDPOINTS), lambda n: (
        '{"broker": "tcp://127.0.0.1:40001", "connector": "127.0.0.1:40002", '
        '"kafka": "127.0.0.1:40003"}\n')),
}


@pytest.fixture
def often_switching() -> Iterator[None]:
    """Threads switch as often as the interpreter allows, so writers interleave."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


@pytest.mark.usefixtures("often_switching")
def test_the_id_session_and_endpoints_files_written_at_once_never_swap(tmp_path: Path) -> None:
    """Three threads each rewrite one of the files over and over (as the broker's start and
    its session's renewal may): each file always holds what its own writer wrote last, and
    no write fails because another's took its temporary file."""
    rounds = 300
    failures: list[str] = []
    start = threading.Barrier(len(_WRITERS))

    def rewrite(name: str) -> None:
        write, expected = _WRITERS[name]
        start.wait()
        for n in range(1, rounds + 1):
            try:
                write(tmp_path, n)
                found = (tmp_path / name).read_text()
            except OSError as exc:
                failures.append(f"{name}: write {n}: {exc!r}")
                return
            if found != expected(n):
                failures.append(f"{name} holds {found!r} after write {n}")
                return

    threads = [threading.Thread(target=rewrite, args=(name,)) for name in _WRITERS]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert sorted(os.listdir(tmp_path)) == sorted(_WRITERS)  # no temporary file left


@pytest.mark.parametrize("name", sorted(_WRITERS))
def test_a_link_planted_where_the_temporary_file_was_is_not_followed(tmp_path: Path,
                                                                     name: str) -> None:
    """`broker.tmp` was the temporary name of all three files: a link planted there (the
    data dir is shared, or was unpacked from elsewhere) made the write go to its target."""
    data = tmp_path / "data"
    data.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (data / "broker.tmp").symlink_to(victim)
    write, expected = _WRITERS[name]
    write(data, 7)
    assert victim.read_text() == "precious\n"
    assert (data / name).read_text() == expected(7)
    assert not (data / name).is_symlink()


@pytest.mark.parametrize("name", [*sorted(_WRITERS), NAMESPACE_FILE])
def test_each_file_is_fsynced_then_its_directory(tmp_path: Path, name: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A power loss after the write must leave the new file, not an empty one or none: the
    file is fsynced before its rename and the directory after it (a power cut cannot be
    simulated, so the calls to os.fsync, still made, are recorded)."""
    synced = record_fsyncs(monkeypatch)
    if name == NAMESPACE_FILE:
        remember_namespace(tmp_path)
    else:
        _WRITERS[name][0](tmp_path, 7)
    assert_synced_then_its_folder(synced, tmp_path / name)
