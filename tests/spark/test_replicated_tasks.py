"""Spark tasks on a replicated topic follow its leader (DESIGN §5 "Replication", §7 "Spark"):
a real coordinator and three `tq executor` processes, a topic of three replicas, and the
task-side functions the source and sink run (`open_producer`, `broker_read`) with the place
the driver planned: the leader's executor is SIGKILLed; a task writing goes on to the new
leader, and a task reading from the old leader's address reads every record once, in order.
The leader's executor SIGSTOPped under tasks whose broker lease is hours long: they move on
the catalog's word. (No SparkSession: a task is these functions in a Python worker, given
the place.)"""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import pytest

from querylib.records import encode_batch, iter_batches
from querylib.spark._cluster import (
    ClusterTopics,
    PartitionPlace,
    _CatalogLink,
    broker_read,
    open_producer,
)
from querylib.spark._options import parse_read_options
from tests.conftest import Processes, wait_for
from tests.integration._three_hosts import ThreeHosts, is_stopped

pytestmark = pytest.mark.timeout(240)


HOURS = 4 * 3600.0  # a silent broker's tasks' lease in the SIGSTOP proof (their timeout: an hour)


def _plan(home: Path, topic: str, **options: str) -> PartitionPlace:
    """Partition 0's place, as the driver plans it (with the source's `options`, e.g.
    timeout and brokerLease): the leader of now."""
    info = json.loads((home / "cluster.json").read_text())
    location = parse_read_options({"subscribe": topic, "coordinator": info["coordinator"],
                                   "secretFile": info["secret_file"], "timeout": "30",
                                   **options}, streaming=False).location
    topics = ClusterTopics(location)
    try:
        return topics.place(topic, 0)
    finally:
        topics.close()


def test_spark_tasks_follow_the_leader_of_a_replicated_topic(processes: Processes,
                                                             tmp_path: Path) -> None:
    hosts = ThreeHosts(processes, tmp_path)
    before = hosts.replicated("moving")
    place = _plan(tmp_path, "moving")

    with open_producer(place, "moving", 0) as producer:
        for i in range(100):
            producer.send_batch(encode_batch([(0, None, b"a%d" % i, ())]))
        producer.flush()
        hosts.kill(before["broker"])
        for i in range(100):
            producer.send_batch(encode_batch([(0, None, b"b%d" % i, ())]))
        producer.flush()
        producer.close(end=False)
    assert hosts.partition("moving")["broker"] != before["broker"]  # type: ignore[index]
    # The writing task's catalog connection outlives it a while, for the next task.
    (kept,) = [link for link in _CatalogLink._links.values() if link.key[0] == place.coordinator]
    assert kept.users == 0

    values = []
    for data in broker_read(place, "moving", 0, 0, 200):
        values += [r.value for b in iter_batches(data) if not b.is_control for r in b.records]
    assert values[:200] == [b"a%d" % i for i in range(100)] + [b"b%d" % i for i in range(100)]
    assert _CatalogLink._links[kept.key] is kept  # the reading task shared it


def test_spark_tasks_follow_a_leader_the_catalog_moved_while_the_old_one_is_silent(
        processes: Processes, tmp_path: Path) -> None:
    """A reading and a writing task, their broker lease (option brokerLease) hours long and
    their timeout an hour: the leader's executor is SIGSTOPped (its sockets open, answering
    nothing); both go on at the new leader the catalog names while the old one is still
    stopped: the catalog's word, not their lease, moved them."""
    hosts = ThreeHosts(processes, tmp_path)
    before = hosts.replicated("silent")
    place = _plan(tmp_path, "silent", timeout="3600", brokerLease=str(HOURS))
    assert (place.lease, place.timeout) == (HOURS, 3600.0)
    values: list[bytes] = []

    def read() -> None:
        for data in broker_read(place, "silent", 0, 0, 200):
            values.extend(r.value for b in iter_batches(data) if not b.is_control
                          for r in b.records)

    with open_producer(place, "silent", 0) as producer:
        for i in range(100):
            producer.send_batch(encode_batch([(0, None, b"a%d" % i, ())]))
        producer.flush()
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        wait_for(lambda: len(values) == 100, timeout=60, what="the reading task's first half")
        stopped = hosts.agent_of(before["broker"])
        os.killpg(stopped.pid, signal.SIGSTOP)
        flushed = threading.Event()

        def write() -> None:
            for i in range(100):
                producer.send_batch(encode_batch([(0, None, b"b%d" % i, ())]))
            producer.flush()
            flushed.set()

        threading.Thread(target=write, daemon=True).start()
        wait_for(flushed.is_set, timeout=120, interval=0.1,
                 what="the writing task to be answered by the new leader")
        wait_for(lambda: not reader.is_alive(), timeout=120, interval=0.1,
                 what="the reading task to read the new leader's records")
        assert is_stopped(stopped.pid)
        producer.close(end=False)
    assert hosts.partition("silent")["broker"] != before["broker"]  # type: ignore[index]
    assert values == [b"a%d" % i for i in range(100)] + [b"b%d" % i for i in range(100)]
