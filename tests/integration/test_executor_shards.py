"""A host's broker work on several processes (issue 17): `tq up --brokers 2` runs the executor's
broker 0 in its process and broker 1 in a shard process (executor/_shard.py). A topic's
partitions spread over both; querylib publishers and subscribers, and Kafka clients, reach each
partition on its own broker; the shard dies with tq up, is restarted when it dies alone, and a
restarted tq up brings it back under the same broker id with its data."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
from pathlib import Path

import psutil
import pytest

from catalog import Broker, Executor, Topic
from querylib.cluster import Cluster
from tests.conftest import wait_for
from tests.integration._up import Up

pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(not sys.platform.startswith("linux"),
                                 reason="PR_SET_PDEATHSIG is Linux only")]


def _records(up: Up, collection: str) -> list[object]:
    with up.cluster() as cluster:
        return [r for r, _ in cluster.snapshot(collection)[collection].records]


def _executor(up: Up) -> Executor:
    (executor,) = [e for e in _records(up, "executors") if isinstance(e, Executor)]
    return executor


def _topic(up: Up, short: str) -> Topic:
    (topic,) = [t for t in _records(up, "topics")
                if isinstance(t, Topic) and t.short_name == short]
    return topic


def _brokers(up: Up) -> dict[int, Broker]:
    return {b.broker_id: b for b in _records(up, "brokers") if isinstance(b, Broker)}


def _shard(up: Up) -> psutil.Process | None:
    """The agent's live shard process, if it has one."""
    (agent,) = [p for p in psutil.Process(up.proc.pid).children()
                if "executor" in p.cmdline()]
    live = [p for p in agent.children() if not _gone(p) and "--shard" in _cmdline(p)]
    assert len(live) <= 1, live
    return live[0] if live else None


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:  # gone meanwhile
        return []


def _gone(proc: psutil.Process) -> bool:
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _produce_consume(up: Up, topic: str, count: int, *, create: bool) -> list[dict]:
    """Produce `count` keyed lines with `tq produce` (querylib's producer) into `topic`, made
    with 4 partitions over the executor's brokers if `create`; read them all back with `tq
    consume` (its subscriber)."""
    lines = "".join(f"k{i}:v{i}\n" for i in range(count))
    if create:  # an ingest topic (tq produce feeds those) with partitions on both brokers
        executor = _executor(up)
        brokers = (executor.broker_id, *executor.shards)
        with Cluster.connect(up.info["coordinator"],
                             secret_file=up.info["secret_file"]) as cluster:
            cluster.create_topic(topic, 4, ingest=True,
                                 locations=tuple(brokers[i % len(brokers)] for i in range(4)))
    done = up.tq("produce", topic, "--key-separator", ":", stdin=lines)
    assert done.returncode == 0, done.stderr
    read = up.tq("consume", topic, "--json", "--follow")
    assert read.returncode == 0, read.stderr
    return [e for e in map(json.loads, read.stdout.splitlines()) if "value" in e]


def test_two_brokers_spread_a_topic_and_querylib_reaches_every_partition(
        tmp_path: Path) -> None:
    with Up(tmp_path, "--brokers", "2") as up:
        executor = _executor(up)
        assert len(executor.shards) == 1
        (shard_id,) = executor.shards
        brokers = _brokers(up)
        assert shard_id in brokers and brokers[shard_id].address != executor.broker
        with Cluster.connect(up.info["coordinator"],
                             secret_file=up.info["secret_file"]) as cluster:
            placed = cluster.create_topic("placed", 4).topic  # the catalog places it
        assert set(placed.locations) == {executor.broker_id, shard_id}, placed.locations
        records = _produce_consume(up, "spread", 200, create=True)
        assert set(_topic(up, "spread").locations) == {executor.broker_id, shard_id}
        assert sorted(r["value"] for r in records) == sorted(f"v{i}" for i in range(200))
        assert {r["partition"] for r in records} == {0, 1, 2, 3}
        status = up.tq("status")
        assert f"brokers {shard_id} at {brokers[shard_id].address}" in status.stdout, \
            status.stdout


def test_kafka_clients_produce_and_consume_across_both_leaders(tmp_path: Path) -> None:
    confluent_kafka = pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import AdminClient, NewTopic

    with Up(tmp_path, "--brokers", "2", "--kafka-port", "0") as up:
        executor = _executor(up)
        brokers = _brokers(up)
        (shard_id,) = executor.shards
        assert brokers[shard_id].kafka_address  # the shard has a listener of its own
        bootstrap = up.info["kafka"]
        admin = AdminClient({"bootstrap.servers": bootstrap})
        (future,) = admin.create_topics([NewTopic("kspread", 4, 1)]).values()
        future.result(timeout=30)
        topic = _topic(up, "kspread")
        assert set(topic.locations) == {executor.broker_id, shard_id}, topic.locations
        # Every listener says the same: each broker, and each partition's real leader.
        for where in (bootstrap, brokers[shard_id].kafka_address):
            metadata = admin if where == bootstrap else AdminClient({"bootstrap.servers": where})
            meta = wait_for(lambda m=metadata: (t := m.list_topics(timeout=20))
                            and "kspread" in t.topics and t, timeout=30,
                            what="the topic in Metadata")
            listed = {b.id: f"{b.host}:{b.port}" for b in meta.brokers.values()}
            assert listed[shard_id] == brokers[shard_id].kafka_address
            assert listed[executor.broker_id] == bootstrap
            assert {p.id: p.leader for p in meta.topics["kspread"].partitions.values()} == \
                dict(enumerate(topic.locations))
        producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap})
        for i in range(80):
            producer.produce("kspread", value=f"v{i}".encode(), partition=i % 4)
        assert producer.flush(30) == 0
        consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap,
                                             "group.id": "kspread", "enable.auto.commit": False,
                                             "auto.offset.reset": "earliest"})
        try:
            consumer.assign([confluent_kafka.TopicPartition("kspread", p, 0) for p in range(4)])
            got: dict[int, list[bytes]] = {}

            def all_read() -> bool:
                message = consumer.poll(0.5)
                if message is not None and message.error() is None:
                    got.setdefault(message.partition(), []).append(message.value())
                return sum(map(len, got.values())) == 80

            wait_for(all_read, timeout=60, interval=0, what="every record back")
        finally:
            consumer.close()
        assert {p: sorted(v) for p, v in got.items()} == \
            {p: sorted(f"v{i}".encode() for i in range(p, 80, 4)) for p in range(4)}


def test_a_sigkilled_up_takes_the_shard_with_it(tmp_path: Path) -> None:
    up = Up(tmp_path, "--brokers", "2")
    try:
        shard = _shard(up)
        assert shard is not None
        os.kill(up.proc.pid, signal.SIGKILL)  # tq up alone, not its process group
        assert up.proc.wait(timeout=30) == -signal.SIGKILL
        wait_for(lambda: _gone(shard), timeout=30, what="the shard to die with tq up")
    finally:
        try:
            os.killpg(up.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        up.stop()


def test_a_killed_shard_is_said_and_restarted_on_its_id(tmp_path: Path) -> None:
    up = Up(tmp_path, "--brokers", "2")
    try:
        (shard_id,) = _executor(up).shards
        before = _produce_consume(up, "again", 40, create=True)
        shard = _shard(up)
        assert shard is not None
        shard.kill()
        wait_for(lambda: _gone(shard), timeout=30, what="the shard to die")
        wait_for(lambda: (s := _shard(up)) is not None and s.pid != shard.pid
                 and shard_id in _brokers(up),
                 timeout=60, interval=0.2, what="the shard to be restarted on its id")
        after = _produce_consume(up, "again", 40, create=False)
    finally:
        err = up.stop()
    assert len(before) == 40
    assert sorted(r["value"] for r in after) == sorted(2 * [f"v{i}" for i in range(40)])
    assert "broker shard 1 (broker " in err and "was killed by SIGKILL; restarting" in err, err


def test_a_dead_shards_session_is_closed_by_its_agent_not_left_to_expire(
        tmp_path: Path) -> None:
    """The agent saw its shard die: it closes the shard's coordinator session at once, so the
    shard's broker leaves the catalog (its partitions elect leaders elsewhere) and the
    restarted shard registers on its id without waiting a whole lease for the dead session to
    expire (10 s before, with the shard's partitions unserved meanwhile)."""
    up = Up(tmp_path, "--brokers", "2", "-v")  # -v: the coordinator says which sessions expire
    try:
        (shard_id,) = _executor(up).shards
        old_session = _brokers(up)[shard_id].session_id
        assert old_session is not None
        shard = _shard(up)
        assert shard is not None
        shard.kill()
        wait_for(lambda: (b := _brokers(up).get(shard_id)) is not None
                 and b.session_id not in (None, old_session),
                 timeout=60, interval=0.2, what="the shard to register again on its id")
    finally:
        err = up.stop()
    assert f"session {old_session} expired" not in err, err[-3000:]


def test_a_restarted_up_keeps_the_shard_id_and_its_data(tmp_path: Path) -> None:
    with Up(tmp_path, "--brokers", "2") as up:
        (shard_id,) = _executor(up).shards
        _produce_consume(up, "kept", 60, create=True)
        on_shard = {i for i, b in enumerate(_topic(up, "kept").locations) if b == shard_id}
        assert on_shard
    with Up(tmp_path, "--brokers", "2") as up:
        assert _executor(up).shards == (shard_id,)
        read = up.tq("consume", "kept", "--json", "--follow")
        assert read.returncode == 0, read.stderr
        records = [e for e in map(json.loads, read.stdout.splitlines()) if "value" in e]
        assert sorted(r["value"] for r in records) == sorted(f"v{i}" for i in range(60))
        assert on_shard <= {r["partition"] for r in records}


def test_a_host_whose_executor_data_is_lost_gets_its_broker_ids_back(tmp_path: Path) -> None:
    """DESIGN §6 "Executor broker ids": the executor's data dir gone (broker.id files and all),
    the restarted executor registers its broker and its shard under the ids they had (the
    host's name, credential and slot), so the partitions located there are served again
    (empty: a topic of one replica lost its records with the disk)."""
    with Up(tmp_path, "--brokers", "2") as up:
        before = _executor(up)
        assert len(_produce_consume(up, "homed", 20, create=True)) == 20
    shutil.rmtree(tmp_path / "executor")
    with Up(tmp_path, "--brokers", "2") as up:
        after = _executor(up)
        assert (after.broker_id, after.shards) == (before.broker_id, before.shards)
        assert (tmp_path / "executor" / "broker.id").read_text() == f"{before.broker_id}\n"
        read = _produce_consume(up, "homed", 40, create=False)
        assert sorted(r["value"] for r in read) == sorted(f"v{i}" for i in range(40))
        on_shard = {i for i, b in enumerate(_topic(up, "homed").locations)
                    if b in after.shards}
        assert on_shard & {r["partition"] for r in read}


def test_a_deleted_topics_partitions_leave_the_shard_too(tmp_path: Path) -> None:
    with Up(tmp_path, "--brokers", "2") as up:
        _produce_consume(up, "gone", 20, create=True)
        shard_dir = tmp_path / "executor" / "broker-1" / "broker"
        assert {p.name for p in shard_dir.iterdir()} >= {"gone-1", "gone-3"}
        with Cluster.connect(up.info["coordinator"],
                             secret_file=up.info["secret_file"]) as cluster:
            cluster.delete_topic("gone", force=True)  # answered once the brokers dropped it
        left = [p.name for p in tmp_path.joinpath("executor").rglob("gone-*")]
        assert left == [], left


STUBBORN = """\
import signal
import sys
import time
from pathlib import Path

import querylib


def main(ctx):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # killed after tq up's grace instead
    Path(sys.argv[1]).touch()
    time.sleep(600)


querylib.execute(main)
"""


def test_a_signal_to_the_whole_group_stops_the_shard_without_a_restart(tmp_path: Path) -> None:
    """A terminal or a service manager signals tq up's whole process group: the shard exits
    at once while the agent still waits for its queries to stop (here one ignoring SIGTERM,
    for tq up's 2 s grace). That exit is part of the stop: it was said as a crash to restart
    from ("exited with code 0; restarting it in 0.5s") and the shard was started again,
    only to be stopped once the agent reached it."""
    up = Up(tmp_path, "--brokers", "2")
    try:
        program = tmp_path / "stubborn.py"
        program.write_text(STUBBORN)
        ignoring = tmp_path / "ignoring"
        up.submit(program, str(ignoring))
        wait_for(ignoring.exists, timeout=60, what="the query to ignore SIGTERM")
        shard = _shard(up)
        assert shard is not None
        os.killpg(up.proc.pid, signal.SIGTERM)
        assert up.proc.wait(timeout=60) == 0
        assert _gone(shard)
    finally:
        err = up.stop()
    assert "restarting it" not in err and "restarted" not in err, err
