"""querylib's publish/subscribe API against a real `tq coordinator` process (and the broker it
embeds): the thesis' numbers query as 2 processes x 2 workers in both partitionings, a
collection's snapshot then diffs, blocking subscribe, type checks, and the catalog entries of
publications and subscriptions."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import querylib
import querylib.broker
from catalog import Broker, RecordTypeMismatchError, Resources, SessionKind, UnknownTopicError
from catalog.errors import UserError
from querylib.cluster import Cluster
from tests.conftest import Processes, wait_for
from tests.coordinator._cluster import ROOT, CoordinatorProcess, query_env, tq, tq_env

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TQ_HOME", str(tmp_path))
    monkeypatch.delenv("TQ_COORDINATOR", raising=False)
    return tmp_path


@pytest.fixture
def coordinator(processes: Processes, home: Path) -> CoordinatorProcess:
    return CoordinatorProcess(processes, home).start()


@pytest.fixture
def agent(coordinator: CoordinatorProcess) -> Iterator[tuple[Cluster, int]]:
    """A stand-in executor on the coordinator's own broker, so queries can be submitted and
    their partitions land on a broker that runs."""
    with Cluster.connect(kind=SessionKind.EXECUTOR, peer="test agent") as cluster:
        brokers = cluster.snapshot("brokers")["brokers"].records
        (broker,) = [b for b, _ in brokers
                     if isinstance(b, Broker) and b.address == cluster.catalog_broker]
        executor = cluster.register_executor(socket.gethostname(), broker.broker_id,
                                             Resources(cores=2, memory=1 << 30, disk=1 << 30,
                                                       slots=4))
        yield cluster, executor.executor_id


def _stand_in(home: Path, query_id: int, process: int, processes: int,
              workers: int) -> Cluster:
    """A session registered as process `process` of the query, for a test that starts that
    process late: `execute` runs `main` only once every process registered (the start
    barrier, DESIGN §6), so a late process is one that registered and is slow to publish.
    Close it before the real process starts (which then registers in its place)."""
    env = query_env(home, query_id, process, processes, workers)
    return Cluster.connect(secret_file=env["TQ_CREDENTIALS"], kind=SessionKind.QUERY,
                           query_id=query_id, process=process)


def _records(cluster: Cluster, collection: str) -> list[Any]:
    return [r for r, _ in cluster.snapshot(collection)[collection].records]


def _drain(sub: querylib.Subscription) -> tuple[dict[int, int], list[int], set[int]]:
    """Sum of values per time, the frontiers seen, the partitions data came from."""
    sums: dict[int, int] = {}
    frontiers: list[int] = []
    partitions: set[int] = set()
    for event in sub:
        if isinstance(event, querylib.Data):
            assert event.time is not None
            assert sub.frontier is None or event.time >= sub.frontier
            sums[event.time] = sums.get(event.time, 0) + sum(event.records)
            partitions.add(event.partition)
        elif isinstance(event, querylib.Progress):
            frontiers.append(event.frontier)
    return sums, frontiers, partitions


@pytest.mark.parametrize(("merge", "late"), [(False, False), (True, False), (True, True)],
                         ids=["PerWorker", "Merge", "Merge-late-process"])
def test_numbers_two_processes_two_workers(processes: Processes, home: Path,
                                           agent: tuple[Cluster, int], merge: bool,
                                           late: bool) -> None:
    """`late`: process 1 starts only once process 0 has created the topic, so process 0's
    workers must wait for it before moving the merged partition's frontier."""
    cluster, executor_id = agent
    query = cluster.submit_query("numbers", "querylib/examples/numbers_query.py",
                                 processes=2, workers=2, executors=(executor_id, executor_id))
    topic = "merged" if merge else "numbers"
    times = 5

    def start(process: int) -> subprocess.Popen[str]:
        env = query_env(home, query.query_id, process, 2, 2)
        args = ["-m", "querylib.examples.numbers_query", "--topic", topic,
                "--times", str(times)]
        return processes.python(*args, *(["--merge"] if merge else []), env=env, cwd=ROOT,
                                stderr=subprocess.PIPE, text=True)

    stand_in = _stand_in(home, query.query_id, 1, 2, 2) if late else None
    jobs = [start(0)]
    if stand_in is not None:
        cluster.lookup_topic(topic, wait=60)
        stand_in.close()
    jobs.append(start(1))
    with querylib.connect() as ctx, ctx.subscribe(topic, timeout=60) as sub:
        sums, frontiers, partitions = _drain(sub)
    for job in jobs:
        assert job.wait(timeout=60) == 0, job.stderr.read()  # type: ignore[union-attr]
    expected = {t: sum(n for n in range(400) if n % times == t) for t in range(times)}
    assert sums == expected
    assert frontiers == sorted(frontiers) and frontiers[-1] == times
    assert partitions == ({0} if merge else {0, 1, 2, 3})
    (info,) = [t for t in _records(cluster, "topics") if t.short_name == topic]
    assert info.partitions == (1 if merge else 4) and info.record_type == "msgpack"
    wait_for(lambda: not [p for p in _records(cluster, "publications")
                          if p.topic_id == info.topic_id],
             timeout=30, what="the query's publication to leave the catalog")


def test_merge_frontier_waits_for_a_delayed_process(processes: Processes, home: Path,
                                                   agent: tuple[Cluster, int]) -> None:
    """Merge, 2 processes x 2 workers, process 1 started only after process 0 has sent all
    its records, advanced past them, closed and exited: the merged partition's frontier stays
    below process 1's first record time (0) and the stream does not end until process 1 has
    joined and ended; then every record arrives (DESIGN §5 "Collective publishing")."""
    cluster, executor_id = agent
    query = cluster.submit_query("numbers", "querylib/examples/numbers_query.py",
                                 processes=2, workers=2, executors=(executor_id, executor_id))
    times = 4

    def start(process: int) -> subprocess.Popen[str]:
        env = query_env(home, query.query_id, process, 2, 2)
        return processes.python("-m", "querylib.examples.numbers_query", "--topic", "held",
                                "--times", str(times), "--merge", env=env, cwd=ROOT,
                                stderr=subprocess.PIPE, text=True)

    stand_in = _stand_in(home, query.query_id, 1, 2, 2)
    first = start(0)
    assert first.wait(timeout=60) == 0, first.stderr.read()  # type: ignore[union-attr]
    info = cluster.lookup_topic("held")
    (part,) = querylib.broker.list_partitions(info.brokers[info.topic.locations[0]],
                                              cluster.secret, "held")
    assert part.log_end > 0 and part.frontier == 0 and not part.ended
    with querylib.connect() as ctx, ctx.subscribe("held", timeout=60) as sub:
        seen: list[Any] = []
        wait_for(lambda: _count(sub, seen) == 200, timeout=30,
                 what="process 0's 200 records")
        assert not [e for e in seen if isinstance(e, querylib.Progress) and e.frontier > 0]
        stand_in.close()
        second = start(1)
        sums, frontiers, _ = _drain(sub)
    assert second.wait(timeout=60) == 0, second.stderr.read()  # type: ignore[union-attr]
    for event in seen:
        if isinstance(event, querylib.Data):
            sums[event.time] = sums.get(event.time, 0) + sum(event.records)
    assert sums == {t: sum(n for n in range(400) if n % times == t) for t in range(times)}
    assert frontiers == sorted(frontiers) and frontiers[-1] == times


def _count(sub: querylib.Subscription, seen: list[Any]) -> int:
    event = sub.next_event(timeout=0.2)
    if event is not None:
        seen.append(event)
    return sum(len(e.records) for e in seen if isinstance(e, querylib.Data))


def test_a_publication_lives_while_any_process_holds_it(home: Path,
                                                      agent: tuple[Cluster, int]) -> None:
    """Processes 0 and 1 of a query publish one topic; process 0 closes first; the publication
    stays in `tq catalog publications`, held by process 1, until process 1 closes."""
    cluster, executor_id = agent
    query = cluster.submit_query("holders", "unused.py", processes=2, workers=1,
                                 executors=(executor_id, executor_id))
    published = [threading.Event(), threading.Event()]
    release = [threading.Event(), threading.Event()]
    closed = [threading.Event(), threading.Event()]
    failures: list[BaseException] = []

    def process(index: int) -> None:
        def main(ctx: querylib.Context) -> None:
            with ctx.publish("shared") as out:
                out.send(0, [index])
                published[index].set()
                assert release[index].wait(timeout=60)
            closed[index].set()

        env = query_env(home, query.query_id, index, 2, 1)
        try:
            querylib.execute(main, env=env)
        except BaseException as exc:  # reported by the test below
            failures.append(exc)
            published[index].set()
            closed[index].set()

    def listed() -> list[dict[str, Any]]:
        result = tq(home, "catalog", "publications", "--json")
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)["snapshot"]

    threads = [threading.Thread(target=process, args=(i,)) for i in (0, 1)]
    for thread in threads:
        thread.start()
    try:
        assert all(e.wait(timeout=60) for e in published) and not failures, failures
        (both,) = listed()
        assert both["processes"] == [0, 1]
        release[0].set()
        assert closed[0].wait(timeout=60) and not failures, failures
        (held,) = listed()
        assert held["publisher"] == {"type": "query", "query_id": query.query_id}
        assert held["processes"] == [1]
        release[1].set()
        assert closed[1].wait(timeout=60) and not failures, failures
        assert listed() == []
    finally:
        for event in release:
            event.set()
        for thread in threads:
            thread.join(timeout=60)


def test_collection_late_subscriber_sees_snapshot_then_diffs(coordinator: CoordinatorProcess
                                                             ) -> None:
    with querylib.connect() as writer_ctx, querylib.connect() as reader_ctx:
        with writer_ctx.publish("inventory", kind="collection", serde="json") as out:
            out.send(0, [("apple", 1), ("pear", 1)])
            out.send(1, [("apple", -1), ("plum", 2)])
            out.advance_to(2)
            out.flush()
            with reader_ctx.subscribe("inventory", serde="json") as sub:
                first = sub.next_event(timeout=30)
                assert isinstance(first, querylib.Snapshot)
                assert first.frontier == 2
                assert sorted(first.records) == [("pear", 1), ("plum", 2)]
                out.send(2, [("pear", -1)])
                out.advance_to(3)
                seen: list[Any] = []
                wait_for(lambda: _take(sub, seen, querylib.Progress), timeout=30,
                         what="the diff and the frontier after it")
                data = [e for e in seen if isinstance(e, querylib.Data)]
                assert [(d.time, d.records) for d in data] == [(2, [("pear", -1)])]
                assert seen[-1] == querylib.Progress(3)


def test_collection_records_stored_after_the_frontier_follow_the_snapshot(
        coordinator: CoordinatorProcess) -> None:
    """Records stored at or after the frontier when a subscriber arrives are not in its
    snapshot: they come next, as diffs (this path raised a TypeError)."""
    with querylib.connect() as writer_ctx, querylib.connect() as reader_ctx:
        with writer_ctx.publish("stock", kind="collection", serde="json") as out:
            out.send(0, [("apple", 1), ("pear", 2)])
            out.advance_to(1)
            out.send(1, [("pear", -1)])
            out.flush()
            with reader_ctx.subscribe("stock", serde="json") as sub:
                first = sub.next_event(timeout=30)
                assert first == querylib.Snapshot(1, [("apple", 1), ("pear", 2)])
                assert sub.next_event(timeout=30) == querylib.Data(1, [("pear", -1)], 0)


def test_an_ended_collection_ends_its_subscriptions(coordinator: CoordinatorProcess) -> None:
    """A collection whose publisher has closed gives its snapshot and then EndOfStream, as an
    ended stream does, so `for event in sub` ends (it used to wait forever after the
    snapshot)."""
    with querylib.connect() as ctx:
        with ctx.publish("prices", kind="collection") as out:
            out.send(0, [("tea", 3), ("milk", 1)])
            out.advance_to(1)
        with ctx.subscribe("prices") as sub:
            assert sub.next_event(timeout=30) == querylib.Snapshot(1, [("tea", 3), ("milk", 1)])
            assert sub.next_event(timeout=30) == querylib.EndOfStream()
            assert sub.next_event(timeout=0.1) is None


def _take(sub: querylib.Subscription, seen: list[Any], until: type) -> bool:
    event = sub.next_event(timeout=0.2)
    if event is not None:
        seen.append(event)
    return isinstance(event, until)


def test_blocking_subscribe_is_released_by_a_later_publish(coordinator: CoordinatorProcess
                                                           ) -> None:
    with querylib.connect() as ctx:
        with pytest.raises(UnknownTopicError):
            ctx.subscribe("nobody", timeout=0.2)
        got: list[Any] = []
        failure: list[BaseException] = []
        checked = threading.Event()

        def reader() -> None:
            try:
                with querylib.connect() as rctx:
                    with pytest.raises(UnknownTopicError):
                        rctx.runtime.cluster.lookup_topic("later")
                    checked.set()  # the topic did not exist when this reader started waiting
                    with rctx.subscribe("later", timeout=60) as sub:
                        got.extend(sub)
            except BaseException as exc:  # reported by the test below
                failure.append(exc)
                checked.set()

        thread = threading.Thread(target=reader)
        thread.start()
        try:
            assert checked.wait(timeout=30)
            with ctx.publish("later") as out:
                out.send(0, ["hello"])
                out.advance_to(1)
        finally:
            thread.join(timeout=60)
        assert not failure, failure
        assert querylib.Data(0, ["hello"], 0) in got
        assert isinstance(got[-1], querylib.EndOfStream)


def test_a_type_mismatch_is_a_clear_error(coordinator: CoordinatorProcess) -> None:
    with querylib.connect() as ctx:
        with ctx.publish("points", serde="json", record_type="Point") as out:
            out.send(0, [{"x": 1}])
            with pytest.raises(RecordTypeMismatchError, match="json"):
                ctx.subscribe("points", serde="msgpack")
            with pytest.raises(RecordTypeMismatchError, match="Point"):
                ctx.subscribe("points", serde="json", record_type="Line")
            with pytest.raises(RecordTypeMismatchError):
                ctx.publish("points", serde="msgpack")
            with pytest.raises(RecordTypeMismatchError, match="stream"):
                ctx.subscribe("points", serde="json", kind="collection")
            with ctx.subscribe("points", serde="json", record_type="Point") as sub:
                event = sub.next_event(timeout=30)
                assert event == querylib.Data(0, [{"x": 1}], 0)


def test_subscribe_without_a_serde_decodes_with_the_topics_own(coordinator: CoordinatorProcess
                                                               ) -> None:
    """A newcomer who published with serde="json" need not repeat it: the subscriber decodes
    with the serde the topic records (a json collection and a json stream in one
    subscription too), and record_type and kind are still checked."""
    with querylib.connect() as ctx:
        with ctx.publish("clicks", serde="json", record_type="Click") as out, \
                ctx.publish("pages", serde="json", kind="collection") as pages:
            out.send(0, [{"page": "/"}])
            pages.send(0, [("home", 1)])
            pages.advance_to(1)
            pages.flush()
            with ctx.subscribe("clicks") as sub:
                assert sub.next_event(timeout=30) == querylib.Data(0, [{"page": "/"}], 0)
            with pytest.raises(RecordTypeMismatchError, match="Click"):
                ctx.subscribe("clicks", record_type="Page")
            with ctx.subscribe("clicks", record_type="Click") as sub:
                assert sub.next_event(timeout=30) == querylib.Data(0, [{"page": "/"}], 0)
            with ctx.subscribe(["pages", "clicks"]) as sub:
                first = sub.next_event(timeout=30)
                assert isinstance(first, querylib.Snapshot)
                assert first.records == [("home", 1)]


def test_subscribe_without_a_serde_never_unpickles_and_never_mixes_serdes(
        coordinator: CoordinatorProcess) -> None:
    """Pickle runs code chosen by the topic's writers, so it is never chosen implicitly;
    topics of different serdes in one subscription are refused, naming each one's."""
    with querylib.connect() as ctx:
        with ctx.publish("objs", serde="pickle") as objs, \
                ctx.publish("nums", serde="msgpack") as nums:
            objs.send(0, [{1, 2}])
            nums.send(0, [7])
            with pytest.raises(UserError, match="serde='pickle' if you trust") as refused:
                ctx.subscribe("objs")
            assert "\n" not in str(refused.value)
            with pytest.raises(UserError, match="'nums' is msgpack.*'clicks' is json|"
                                                "different serdes") as mixed:
                with ctx.publish("clicks", serde="json"):
                    ctx.subscribe(["nums", "clicks"])
            assert "'nums'" in str(mixed.value) and "'clicks'" in str(mixed.value)
            with ctx.subscribe("nums") as sub:
                assert sub.next_event(timeout=30) == querylib.Data(0, [7], 0)
            with ctx.subscribe("objs", serde="pickle") as sub:
                assert sub.next_event(timeout=30) == querylib.Data(0, [{1, 2}], 0)


def test_publications_and_subscriptions_live_in_the_catalog(coordinator: CoordinatorProcess
                                                            ) -> None:
    with querylib.connect() as ctx, Cluster.connect(session=False) as watcher:
        def entries(collection: str) -> list[Any]:
            return _records(watcher, collection)

        out = ctx.publish("visible")
        (topic,) = [t for t in entries("topics") if t.short_name == "visible"]
        assert [p.topic_id for p in entries("publications")] == [topic.topic_id]
        sub = ctx.subscribe("visible")
        assert [s.topic_id for s in entries("subscriptions")] == [topic.topic_id]
        sub.close()
        assert entries("subscriptions") == []
        out.close()
        assert entries("publications") == []
        assert [t.short_name for t in entries("topics") if not t.internal] == ["visible"]


def test_a_directly_run_job_is_a_one_process_query(processes: Processes, home: Path,
                                                   coordinator: CoordinatorProcess) -> None:
    env = tq_env(home) | {"TQ_WORKERS": "2"}
    job = processes.python("-m", "querylib.examples.numbers_query", "--topic", "solo",
                           "--times", "2", env=env, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    with querylib.connect() as ctx, ctx.subscribe("solo", timeout=60) as sub:
        sums, frontiers, partitions = _drain(sub)
    assert job.wait(timeout=60) == 0, job.stderr.read()  # type: ignore[union-attr]
    assert sums == {t: sum(n for n in range(200) if n % 2 == t) for t in range(2)}
    assert frontiers[-1] == 2 and partitions == {0, 1}


def test_hash_partitioning_routes_by_key(coordinator: CoordinatorProcess) -> None:
    words = ["apple", "pear", "plum", "fig", "kiwi", "lime", "date", "sloe"]
    with querylib.connect() as ctx:
        with ctx.publish("words", partition=querylib.Hash(3), serde="json") as out:
            out.send(0, words)
            out.advance_to(1)
        with ctx.subscribe("words", serde="json") as sub:
            placed = {w: e.partition for e in sub if isinstance(e, querylib.Data)
                      for w in e.records}
    hashed = querylib.Hash(3)
    assert placed == {w: hashed.partition_of(querylib.serdes.JSON.encode(w)) for w in words}
    assert len(set(placed.values())) > 1


def test_start_latest_skips_what_is_stored(coordinator: CoordinatorProcess) -> None:
    with querylib.connect() as ctx, ctx.publish("ticks") as out:
        out.send(0, ["old"])
        out.advance_to(1)
        out.flush()
        with ctx.subscribe("ticks", start="latest") as sub:
            out.send(1, ["new"])
            out.advance_to(2)
            seen: list[Any] = []
            wait_for(lambda: _take(sub, seen, querylib.Progress), timeout=30,
                     what="the new record and its frontier")
    assert [e for e in seen if isinstance(e, querylib.Data)] == [querylib.Data(1, ["new"], 0)]


def test_the_bytes_serde_refuses_what_is_not_bytes_and_copies_what_it_sends(
        coordinator: CoordinatorProcess) -> None:
    """Other types (None included) are the serde's UserError and send nothing of that call;
    bytearrays are copied as they are sent, so changing them later changes nothing."""
    with querylib.connect() as ctx, ctx.publish("raw", serde="bytes") as out:
        for bad in ([b"x", "text"], [None], [b"y"] * 3 + [7]):
            with pytest.raises(UserError, match="bytes serde"):
                out.send(0, bad)
        mutable = [bytearray(b"m0"), bytearray(b"m1")]
        out.send(0, mutable)
        mutable[0][:] = b"changed"
        out.send(1, [b"b"])
        out.advance_to(2)
        out.flush()
        with ctx.subscribe("raw", serde="bytes") as sub:
            seen: list[Any] = []
            wait_for(lambda: _take(sub, seen, querylib.Progress), timeout=30,
                     what="the records and their frontier")
    assert [e for e in seen if isinstance(e, querylib.Data)] == [
        querylib.Data(0, [b"m0", b"m1"], 0), querylib.Data(1, [b"b"], 0)]
