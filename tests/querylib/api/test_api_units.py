"""The pure parts of querylib.api: serdes, TQ_* parsing, partitionings, the public surface."""

from __future__ import annotations

import importlib
import pkgutil

import pytest
from hypothesis import given
from hypothesis import strategies as st

import querylib
import querylib.api
from catalog.errors import UserError
from querylib.api import QueryEnv, serdes
from querylib.api._partitioning import partition_count, per_worker_partition

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=10)


@given(json_values)
def test_json_and_msgpack_round_trip(value: object) -> None:
    for serde in (serdes.JSON, serdes.MSGPACK):
        assert serde.decode(serde.encode(value)) == value


def test_serdes_by_name_and_pickle_only_when_named() -> None:
    assert serdes.resolve("bytes").decode(serdes.resolve("bytes").encode(b"x")) == b"x"
    with pytest.raises(UserError, match="bytes serde"):
        serdes.BYTES.encode("text")
    with pytest.raises(UserError, match="unknown serde"):
        serdes.resolve("yaml")
    assert serdes.resolve("pickle") is serdes.PICKLE
    assert serdes.type_tag(serdes.MSGPACK, None) == "msgpack"
    assert serdes.type_tag(serdes.JSON, "Point") == "json/Point"
    for serde in (serdes.JSON, serdes.MSGPACK):
        with pytest.raises(serdes.ValueDecodeError, match=serde.name):
            serdes.decode_value(serde, b"\xc1{")


def test_query_env() -> None:
    env = QueryEnv.read({"TQ_QUERY_ID": "7", "TQ_PROCESS_INDEX": "1", "TQ_PROCESS_COUNT": "2",
                         "TQ_WORKERS": "3", "TQ_COORDINATOR": "tcp://h:1"})
    assert (env.query_id, env.process, env.processes, env.workers) == (7, 1, 2, 3)
    assert env.coordinator == "tcp://h:1" and env.broker is None
    alone = QueryEnv.read({})
    assert (alone.query_id, alone.process, alone.processes, alone.workers) == (None, 0, 1, 1)
    for bad, message in [({"TQ_WORKERS": "x"}, "whole number"), ({"TQ_WORKERS": "0"}, ">= 1"),
                         ({"TQ_QUERY_ID": "1", "TQ_PROCESS_INDEX": "2"}, "TQ_PROCESS_COUNT"),
                         ({"TQ_PROCESS_COUNT": "2"}, "TQ_QUERY_ID")]:
        with pytest.raises(UserError, match=message):
            QueryEnv.read(bad)


def test_partitionings() -> None:
    assert partition_count(querylib.PerWorker, 2, 3) == 6
    assert partition_count(querylib.Merge, 2, 3) == 1
    assert partition_count(querylib.Hash(5), 2, 3) == 5
    with pytest.raises(UserError):
        querylib.Hash(0)
    with pytest.raises(UserError):
        partition_count("merge", 1, 1)  # type: ignore[arg-type]
    # Every (process, worker) gets its own partition, and partition i belongs to process
    # i mod P, where the coordinator places it.
    seen = {per_worker_partition(p, w, 2): p for p in range(2) for w in range(3)}
    assert sorted(seen) == list(range(6))
    assert all(partition % 2 == process for partition, process in seen.items())


def test_public_surface() -> None:
    for package in (querylib, querylib.api):
        names = package.__all__
        assert len(set(names)) == len(names)
        for name in names:
            assert getattr(package, name) is getattr(querylib.api, name), name
    for info in pkgutil.iter_modules(querylib.api.__path__):
        module = importlib.import_module(f"querylib.api.{info.name}")
        assert module.__doc__ and "Must not" in module.__doc__, info.name
    with pytest.raises(AttributeError):
        querylib.nothing_here  # noqa: B018


def test_a_query_process_title_names_query_name_and_process() -> None:
    from querylib.api._env import process_title

    env = {"TQ_QUERY_ID": "12", "TQ_QUERY_NAME": "clicks", "TQ_PROCESS_INDEX": "1",
           "TQ_PROCESS_COUNT": "2"}
    assert process_title(env) == "tq query 12 clicks 1/2"
    assert process_title({**env, "TQ_QUERY_NAME": ""}) == "tq query 12 1/2"
    assert process_title({**env, "TQ_QUERY_NAME": "a  b\nc" + "x" * 100}) == \
        "tq query 12 a b c" + "x" * 35 + " 1/2"
    assert process_title({}) is None  # run on its own: no title of ours


def test_the_runtime_watches_the_leaders_of_replicated_topics_only() -> None:
    """A query's producers and subscribers of a replicated topic follow its leaders through
    the catalog (`Runtime.leader_watch`, DESIGN §5 "Replication"); a topic of one replica
    needs no watch (its broker stays). A watch starts from the leader the client was given."""
    from catalog import Topic, TopicKind
    from catalog._records import SystemRef
    from querylib.api._runtime import Runtime
    from querylib.cluster import TopicInfo

    watched: list[tuple[str, int, object]] = []

    class Cluster:
        def watch_leader(self, topic: str, partition: int, moved: object, *,
                         since: object = None) -> object:
            watched.append((topic, partition, since))
            return lambda: None

    def info(replicas: tuple[tuple[int, ...], ...]) -> TopicInfo:
        topic = Topic(topic_id=1, name="persistent://public/default/t", partitions=2,
                      record_type="bytes", kind=TopicKind.STREAM, owner=SystemRef(),
                      locations=(1, 2), internal=False, created_at_ms=1, replicas=replicas,
                      isr=replicas, leader_epochs=(0, 0) if replicas else ())
        return TopicInfo(topic=topic, brokers={1: "tcp://a", 2: "tcp://b"}, version=1)

    runtime = Runtime(Cluster(), QueryEnv.__new__(QueryEnv))  # type: ignore[arg-type]
    assert runtime.leader_watch(info(()), 0) is None
    watch = runtime.leader_watch(info(((1, 2), (2, 1))), 1)
    assert watch is not None
    watch(lambda: None)
    assert watched == [("t", 1, (1, 2, 0))]  # topic 1, broker 2, epoch 0
