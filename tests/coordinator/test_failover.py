"""Coordinator failover on a real etcd: the election, guarded catalog commits, standby replay."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from catalog import Catalog, OpenSession, SessionKind
from coordinator._failover import (
    EtcdCatalog,
    NotActiveError,
    ReadCatalog,
    parse_etcd_urls,
)
from tests.catalog._helpers import add_user, host
from tests.conftest import Processes, wait_for_async

from ._etcd import etcd_server, needs_etcd

pytestmark = [needs_etcd, pytest.mark.timeout(60)]


def test_parse_etcd_urls() -> None:
    assert parse_etcd_urls("http://a:2379, b:2380") == [("a", 2379), ("b", 2380)]
    for bad in ("", "a", "a:x", "a:0", ":2379"):
        with pytest.raises(ValueError):
            parse_etcd_urls(bad)


def _commits(catalog: Catalog, count: int) -> list[list[tuple[int, list]]]:
    """`count` commits of one change each, made on `catalog`."""
    out = []
    for i in range(count):
        change = catalog.apply(OpenSession(kind=SessionKind.CLIENT, peer=f"p{i}", at_ms=i))
        out.append([(change.version, list(change.updates))])
    return out


def _same(a: Catalog, b: Catalog) -> None:
    assert dict((n, sorted(map(repr, c))) for n, c in a.collections()) == \
        dict((n, sorted(map(repr, c))) for n, c in b.collections())
    assert a.version == b.version


def _own_broker(client: object) -> tuple[int, int]:
    """Two partitions on the coordinator's own broker, which these tests (no executor) name
    to have topics in the catalog: with failover, placement never puts one there (DESIGN §5)."""
    records = client.snapshot("brokers")["brokers"].records  # type: ignore[attr-defined]
    own = next(b.broker_id for b, _ in records if b.session_id is None)
    return own, own


async def _etcd(address: str, lease: float = 2.0) -> EtcdCatalog:
    etcd = EtcdCatalog(address, "test", lease=lease)
    await etcd.connect()
    return etcd


def test_one_active_and_the_standby_takes_over_when_it_resigns(tmp_path: Path) -> None:
    async def run(address: str) -> None:
        a, b = await _etcd(address), await _etcd(address)
        term = await a.campaign("a:1")
        assert term > 0 and await b.active() == "a:1"
        standby = asyncio.ensure_future(b.campaign("b:1"))
        done, _ = await asyncio.wait([standby], timeout=0.5)
        assert not done  # a holds it: b waits
        await a.close()  # revokes the lease: the key goes at once
        assert await asyncio.wait_for(standby, 10) > term
        assert await b.active() == "b:1"
        await b.close()

    with etcd_server(tmp_path / "etcd") as address:
        asyncio.run(run(address))


def test_a_deposed_active_cannot_write(tmp_path: Path) -> None:
    """The lease expires (a stalled or cut-off coordinator): its key goes, another is active,
    and the old one's guarded append is refused and it knows it is no longer active."""
    async def run(address: str) -> None:
        a, b = await _etcd(address, lease=1), await _etcd(address, lease=1)
        await a.campaign("a:1")
        assert a._keeper is not None
        a._keeper.cancel()  # stops renewing, as a process that hangs would
        await asyncio.gather(a._keeper, return_exceptions=True)
        a.lost.clear()
        await asyncio.wait_for(b.campaign("b:1"), 20)
        catalog = Catalog()
        with pytest.raises(NotActiveError):
            await a.append(_commits(catalog, 1)[0])
        assert a.lost.is_set()
        assert (await b.read()).version == 0  # nothing of a's got in
        await a.close(resign=False)
        await b.close()

    with etcd_server(tmp_path / "etcd") as address:
        asyncio.run(run(address))


def test_the_keeper_says_lost_when_the_lease_is_gone(tmp_path: Path) -> None:
    async def run(address: str) -> None:
        a = await _etcd(address, lease=1)
        await a.campaign("a:1")
        assert a._lease is not None
        await a.client.revoke_lease(a._lease)  # as etcd does when the lease expires
        await asyncio.wait_for(a.lost.wait(), 10)
        await a.close(resign=False)

    with etcd_server(tmp_path / "etcd") as address:
        asyncio.run(run(address))


def test_a_clean_close_is_not_reported_as_a_lost_lease(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def run(address: str) -> None:
        a = await _etcd(address)
        await a.campaign("a:1")
        await a.announce("a:1")  # a round trip: the lease keeper is running by then
        await a.close()

    with etcd_server(tmp_path / "etcd") as address:
        asyncio.run(run(address))
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_standby_replays_and_follows_the_catalog_across_checkpoints(tmp_path: Path) -> None:
    async def run(address: str) -> None:
        source = Catalog()
        add_user(source, "user:alice")
        host(source)
        active, standby = await _etcd(address), await _etcd(address)
        await active.campaign("a:1")
        await active.append([(source.version, source.snapshot())])  # the catalog so far
        for commit in _commits(source, 5):
            await active.append(commit)

        read = await standby.read()
        replica = Catalog.replay(read.updates)
        _same(source, replica)

        applied: list[int] = []

        def apply(commits: list) -> None:
            for version, updates in commits:
                replica._write(list(updates))
                replica._counters = max((r for c, r, d in updates
                                         if c == "counters" and d > 0),
                                        key=lambda r: r.version)
                applied.append(version)

        def reread(fresh: ReadCatalog) -> None:
            raise AssertionError("no compaction here")

        following = asyncio.ensure_future(standby.follow(read, apply, reread))
        for commit in _commits(source, 3):
            await active.append(commit)
        await active.checkpoint(source.version, source.snapshot())
        for commit in _commits(source, 2):
            await active.append(commit)
        deadline = asyncio.get_running_loop().time() + 10
        while replica.version != source.version:
            assert asyncio.get_running_loop().time() < deadline, applied
            await asyncio.sleep(0.01)
        _same(source, replica)
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)

        # etcd holds the checkpoint and the commits after it, no more.
        logs = await active.client.get_prefix(active.prefix + b"catalog/")
        assert len(logs) == 2
        again = await standby.read()
        _same(source, Catalog.replay(again.updates))
        await active.close()
        await standby.close()

    with etcd_server(tmp_path / "etcd") as address:
        asyncio.run(run(address))


def test_a_checkpoint_larger_than_an_etcd_request_is_split(tmp_path: Path) -> None:
    """Written in chunks under etcd's request limit, and read back in one Txn however large:
    here above gRPC's default 4 MiB for an answer, which a standby's read must pass."""
    async def run(address: str) -> None:
        source = Catalog()
        for i in range(90):
            source.apply(OpenSession(kind=SessionKind.CLIENT, peer=f"{i}" + "x" * 60_000,
                                     at_ms=i))
        active = await _etcd(address)
        await active.campaign("a:1")
        await active.checkpoint(source.version, source.snapshot())
        chunks = await active.client.get_prefix(active.prefix + b"checkpoint/")
        assert len(chunks) > 1
        _same(source, Catalog.replay((await active.read()).updates))
        await active.close()

    with etcd_server(tmp_path / "etcd") as address:
        asyncio.run(run(address))


def test_a_malformed_commit_is_a_clear_corruption() -> None:
    from catalog import CorruptCatalogError
    from coordinator._failover import _decode

    for bad in (b"", b"\x91\x92\x01\x91\x93\xa5nope!\xc4\x00\x01", b"\xc1"):
        with pytest.raises(CorruptCatalogError):
            _decode(bad)


SECRET = b"0123456789abcdef0123456789abcdef"


def _collections(catalog: Catalog) -> dict[str, list[str]]:
    return {name: sorted(map(repr, c)) for name, c in catalog.collections()}


def test_an_active_coordinator_writes_every_commit_to_etcd_before_answering(
        tmp_path: Path) -> None:
    from coordinator import Coordinator
    from querylib.cluster import AsyncCluster

    async def run(address: str) -> None:
        coordinator = Coordinator(tmp_path / "a", SECRET, listen="tcp://127.0.0.1:0",
                                  broker_listen="tcp://127.0.0.1:0", etcd=address,
                                  cluster="t")
        await coordinator.start()
        standby = EtcdCatalog(address, "t", lease=2)
        await standby.connect()
        try:
            assert coordinator.endpoint is not None and coordinator.state is not None
            assert await standby.active() == coordinator.endpoint
            async with AsyncCluster(coordinator.endpoint, SECRET, lease=5.0) as client:
                own = coordinator.state.catalog_broker_id
                assert own is not None
                info = await client.create_topic("numbers", 2, locations=(own, own))
                # Answered: etcd has it already.
                read = await standby.read()
                assert read.version >= info.version
                assert _collections(Catalog.replay(read.updates)) == \
                    _collections(coordinator.state.catalog)
        finally:
            await standby.close()
            await coordinator.close()

    with etcd_server(tmp_path / "etcd") as address:
        asyncio.run(run(address))


def test_a_standby_takes_over_when_the_active_coordinator_is_killed(
        tmp_path: Path, processes: Processes) -> None:
    """Two `tq coordinator --etcd` processes, one real etcd: SIGKILL the active one; the
    standby serves, with the catalog identical to what the killed one had acknowledged."""
    import shutil as _shutil

    from querylib.cluster import Cluster
    from querylib.rpc import load_secret
    from tests.conftest import wait_for
    from tests.coordinator._cluster import CoordinatorProcess, tq

    home_a, home_b = tmp_path / "a", tmp_path / "b"
    home_a.mkdir()
    home_b.mkdir()
    with etcd_server(tmp_path / "etcd") as address:
        options = ("--etcd", address, "--cluster-name", "t", "--active-lease", "2")
        active = CoordinatorProcess(processes, home_a, extra=options).start()
        secret = load_secret(home_a / "secret")
        _shutil.copy(home_a / "secret", home_b / "secret")
        standby = CoordinatorProcess(processes, home_b, extra=(*options, "--standby"))
        standby.start(wait=False)
        with Cluster(f"{active.address},{standby.address}", secret) as client:
            assert client.address == active.address  # the standby does not answer
            for name in ("alpha", "beta", "gamma"):
                client.create_topic(name, 2, locations=_own_broker(client))
            client.add_user("user:alice")
            before = client.snapshot("topics", "users")
        assert not (home_b / "cluster.json").exists()  # the standby does not serve yet
        both = f"{active.address},{standby.address}"
        watching = Cluster(both, secret, lease=30.0)  # follows the catalog across the kill
        follower = watching.follow("topics")
        assert follower.snapshot(timeout=20) is not None
        active.kill()
        standby.wait_serving(timeout=60)
        with Cluster(both, secret, connect_timeout=30) as client:  # finds the active one
            assert client.address == standby.address
            after = client.snapshot("topics", "users")
            client.create_topic("delta", 1,  # it serves changes too
                                locations=_own_broker(client)[:1])
        # The follower starts over at the new coordinator's catalog broker (a new Snapshot)
        # well before its link to the dead one would give up (60 s).
        seen: set[str] = set()

        def delta_seen() -> bool:
            event = follower.next_event(timeout=0.2)
            if event is not None:
                records = event.records if hasattr(event, "records") else [
                    (r, d) for r, d in event.updates if d > 0]  # type: ignore[union-attr]
                seen.update(t.short_name for t, _ in records)
            return "delta" in seen

        wait_for(delta_seen, timeout=30, interval=0, what="the follower to see topic delta")
        follower.close()
        watching.close()
        described = tq(home_b, "topic", "describe", "alpha", "--coordinator", both)
        assert described.returncode == 0, described.stderr
        assert "alpha" in described.stdout
        for name in ("topics", "users"):
            assert sorted(map(repr, after[name].records)) == \
                sorted(map(repr, before[name].records)), name
        assert standby.stop() == 0


@pytest.mark.timeout(180)
def test_an_executor_and_its_running_query_go_on_across_a_takeover(
        tmp_path: Path, processes: Processes) -> None:
    """An executor and a query publishing to a subscriber query, both given both coordinator
    addresses: SIGKILL the active coordinator; the standby takes over, every session comes
    back as itself, and the queries finish with every record delivered once."""
    import shutil as _shutil
    import sys

    import querylib
    from catalog import Session
    from querylib.cluster import Cluster, find_query
    from querylib.rpc import load_secret
    from tests.conftest import wait_for
    from tests.coordinator._cluster import ROOT, CoordinatorProcess, tq_env
    from tests.faults import test_query_faults as flows

    home_a, home_b = tmp_path / "a", tmp_path / "b"
    home_a.mkdir()
    home_b.mkdir()
    with etcd_server(tmp_path / "etcd") as address:
        options = ("--etcd", address, "--cluster-name", "t", "--active-lease", "2")
        active = CoordinatorProcess(processes, home_a, extra=options).start()
        _shutil.copy(home_a / "secret", home_b / "secret")
        secret = load_secret(home_a / "secret")
        standby = CoordinatorProcess(processes, home_b, extra=(*options, "--standby"))
        standby.start(wait=False)
        both = f"{active.address},{standby.address}"
        processes.python("-m", "querylib.cli", "executor", "--coordinator", both,
                         "--data", str(home_a / "executor"), "--slots", "4", "--lease", "10",
                         "--grace", "1", env=tq_env(home_a), cwd=ROOT,
                         stderr=(tmp_path / "executor.err").open("wb"))
        folder = tmp_path / "run"
        folder.mkdir()
        here = [flows, sys.modules[__name__]]

        def sessions(cluster: Cluster) -> dict[int, Session]:
            return {s.session_id: s for s, _ in cluster.snapshot("sessions")["sessions"].records}

        with Cluster(both, secret, lease=10.0) as cluster:
            wait_for(lambda: cluster.snapshot("executors")["executors"].records, timeout=30,
                     interval=0.1, what="the executor to register")
            reader = querylib.submit(flows._count_received, args=("flow", str(folder)),
                                     by_value=here, name="reader", cluster=cluster)
            writer = querylib.submit(flows._publish_until_stopped, args=("flow", str(folder)),
                                     by_value=here, name="writer", cluster=cluster)
            wait_for(lambda: (folder / "publishing").exists(), timeout=60,
                     what="the writer to be publishing")
            with Cluster(both, secret, session=False) as reading:
                before = sessions(reading)

            active.kill()
            standby.wait_serving(timeout=60)

            with Cluster(both, secret, session=False) as reading:
                after = wait_for(lambda: (s := sessions(reading)) == before and s, timeout=30,
                                 interval=0.2, what="the sessions to resume")
                assert after == before
                assert find_query(reading, writer.query_id).state.value == "running"
            (folder / "stop").touch()
            assert writer.wait(timeout=60).state.value == "finished"
            assert reader.wait(timeout=60).state.value == "finished"
        sent = int((folder / "sent").read_text())
        distinct, highest, twice = map(int, (folder / "received").read_text().split())
        assert (distinct, highest, twice) == (sent, sent - 1, 0)


def test_a_warm_standby_follows_and_reads_only_the_tail_at_takeover(tmp_path: Path) -> None:
    """A standby started on an empty etcd: the seed checkpoint is a gap its watch cannot see
    (it reads everything once more), then it follows commit by commit; at takeover it reads
    only what the watch had not delivered, unless a checkpoint replaced some of that."""
    from coordinator._standby import WarmStandby

    async def run(address: str) -> None:
        source = Catalog()
        add_user(source, "user:alice")
        host(source)
        active, etcd = await _etcd(address), await _etcd(address)
        standby = WarmStandby(etcd)
        await standby.start()
        assert standby.catalog.version == 0 and standby.reads == 1
        await active.campaign("a:1")
        await active.checkpoint(source.version, source.snapshot())  # as a first active seeds
        for commit in _commits(source, 3):
            await active.append(commit)
        await wait_for_async(lambda: standby.catalog.version == source.version,
                             what="the gap re-read")
        assert standby.reads == 2
        _same(source, standby.catalog)
        followed = standby.followed  # the commits after the seed the re-read did not cover
        for commit in _commits(source, 4):
            await active.append(commit)
        await wait_for_async(lambda: standby.catalog.version == source.version,
                             what="the standby to follow")
        assert standby.reads == 2 and standby.followed == followed + 4  # not re-read

        await standby.close()  # as if the watch lagged behind the last commits
        for commit in _commits(source, 2):
            await active.append(commit)
        taken = await standby.take_over()
        assert standby.reads == 2 and standby.followed == followed + 6  # the tail, no more
        _same(source, taken)

        for commit in _commits(source, 2):
            await active.append(commit)
        await active.checkpoint(source.version, source.snapshot())
        for commit in _commits(source, 2):
            await active.append(commit)
        again = WarmStandby(etcd)
        again.catalog = Catalog.replay(taken.snapshot())  # behind that checkpoint
        again.catalog.check_invariants()
        assert again.catalog.version < source.version
        _same(source, await again.take_over())  # the log it lacks is gone: read whole
        assert again.reads == 1
        await active.close()
        await etcd.close()

    with etcd_server(tmp_path / "etcd") as address:
        asyncio.run(run(address))


def test_a_standby_coordinator_takes_over_with_the_catalog_it_followed(tmp_path: Path) -> None:
    """Two coordinators in this process: the standby follows every commit while it waits
    and, once the active one resigns, serves the same catalog without reading it again."""
    from coordinator import Coordinator
    from querylib.cluster import AsyncCluster

    def coordinator(name: str) -> Coordinator:
        return Coordinator(tmp_path / name, SECRET, listen="tcp://127.0.0.1:0",
                           broker_listen="tcp://127.0.0.1:0", etcd=address, cluster="t")

    async def run() -> None:
        active = coordinator("a")
        await active.start()
        standby = coordinator("b")
        waiting = asyncio.ensure_future(standby.start())
        try:
            assert active.endpoint is not None and active.state is not None
            await wait_for_async(lambda: standby.standby is not None and standby.standby.reads,
                                 what="the standby to read the catalog")
            follower = standby.standby
            assert follower is not None
            async with AsyncCluster(active.endpoint, SECRET, lease=5.0) as client:
                own = active.state.catalog_broker_id
                assert own is not None
                for name in ("alpha", "beta"):
                    await client.create_topic(name, 2, locations=(own, own))
                await client.add_user("user:alice")
            before = active.state.catalog
            await wait_for_async(lambda: follower.catalog.version == before.version,
                                 what="the standby to follow")
            assert not waiting.done()  # still a standby
            await active.close()  # resigns: the standby is elected at once
            await asyncio.wait_for(waiting, 30)
            assert follower.reads == 1 and follower.followed > 0  # followed, never re-read
            assert standby.state is not None
            after = standby.state.catalog
            for name in ("topics", "users"):
                assert _collections(after)[name] == _collections(before)[name], name
        finally:
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
            await standby.close()
            await active.close()

    with etcd_server(tmp_path / "etcd") as address:
        asyncio.run(run())


class _Lines:
    """A process's stderr lines, read on a thread (so its pipe never fills)."""

    def __init__(self, stream) -> None:  # type: ignore[no-untyped-def]
        import threading

        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:  # type: ignore[no-untyped-def]
        for line in iter(stream.readline, b""):
            self.lines.append(line.decode(errors="replace"))

    def has(self, text: str) -> bool:
        return any(text in line for line in self.lines)


@pytest.mark.timeout(180)
def test_takeover_time_after_a_sigkill_of_the_active_coordinator(
        tmp_path: Path, processes: Processes, capsys: pytest.CaptureFixture[str]) -> None:
    """SIGKILL the active coordinator (`--active-lease 2`), several times over: each time a
    warm standby serves the catalog the killed one had. Prints, per run, the time from the
    kill to the standby's RPC port accepting and to its first answer (the issue's goal: within
    lease + 1 s; no assertion on time)."""
    import shutil as _shutil
    import socket
    import time

    from querylib.cluster import Cluster
    from querylib.rpc import load_secret
    from tests.conftest import wait_for
    from tests.coordinator._cluster import CoordinatorProcess

    lease, runs = 2.0, 4

    def accepts(port: int) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.05):
                return True
        except OSError:
            return False

    figures = []
    with etcd_server(tmp_path / "etcd") as address:
        options = ("--etcd", address, "--cluster-name", "t", "--active-lease", str(lease))
        first = tmp_path / "h0"
        first.mkdir()
        active = CoordinatorProcess(processes, first, extra=options).start()
        secret = load_secret(first / "secret")
        with Cluster(active.address, secret) as client:
            own = _own_broker(client)
            for i in range(20):
                client.create_topic(f"t{i}", 2, locations=own)
            client.add_user("user:alice")
            before = client.snapshot("topics", "users")
        for run in range(1, runs + 1):
            home = tmp_path / f"h{run}"
            home.mkdir()
            _shutil.copy(first / "secret", home / "secret")
            standby = CoordinatorProcess(processes, home, extra=(*options, "--standby", "-v"))
            standby.start(wait=False)
            assert standby.proc is not None
            lines = _Lines(standby.proc.stderr)
            wait_for(lambda lines=lines: lines.has("following the catalog in etcd"), timeout=30,
                     what="the standby to follow the catalog")
            killed = time.monotonic()
            active.kill()
            while not accepts(standby.port):  # a tight poll: ZeroMQ reconnects per 100 ms
                assert time.monotonic() - killed < 30, "".join(lines.lines)
                time.sleep(0.002)
            listening = time.monotonic() - killed
            with Cluster(standby.address, secret, session=False, connect_timeout=30) as client:
                answered = time.monotonic() - killed
                after = client.snapshot("topics", "users")
            for name in ("topics", "users"):
                assert sorted(map(repr, after[name].records)) == \
                    sorted(map(repr, before[name].records)), name
            wait_for(lambda lines=lines: lines.has("after its election"), timeout=10,
                     what="the standby to say how long its takeover took")
            (said,) = [line for line in lines.lines if "after its election" in line]
            figures.append((listening, answered, said.split("serving ")[1].split("s ")[0]))
            active = standby
    with capsys.disabled():
        print(f"\ntakeover after SIGKILL, --active-lease {lease:g} (goal: lease + 1 s):")
        for run, (listening, answered, elected) in enumerate(figures, 1):
            print(f"  run {run}: listening {listening:.3f} s, answering {answered:.3f} s "
                  f"after the kill; serving {elected} s after its election")
