"""Spark tasks on a replicated topic follow its leader (DESIGN §5 "Replication", §7 "Spark"):
a real coordinator and three `tq executor` processes, a topic of three replicas, and the
task-side functions the source and sink run (`open_producer`, `broker_read`) with the place
the driver planned: the leader's executor is SIGKILLed; a task writing goes on to the new
leader, and a task reading from the old leader's address reads every record once, in order.
(No SparkSession: a task is these functions in a Python worker, given the place.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from querylib.records import encode_batch, iter_batches
from querylib.spark._cluster import ClusterTopics, broker_read, open_producer
from querylib.spark._options import Location
from tests.conftest import Processes
from tests.integration._three_hosts import ThreeHosts

pytestmark = pytest.mark.timeout(240)


def test_spark_tasks_follow_the_leader_of_a_replicated_topic(processes: Processes,
                                                             tmp_path: Path) -> None:
    hosts = ThreeHosts(processes, tmp_path)
    before = hosts.replicated("moving")
    info = json.loads((tmp_path / "cluster.json").read_text())
    topics = ClusterTopics(Location(coordinator=info["coordinator"],
                                    secret_file=info["secret_file"], timeout=30))
    try:
        place = topics.place("moving", 0)  # as the driver plans it: the leader of now
    finally:
        topics.close()

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

    values = []
    for data in broker_read(place, "moving", 0, 0, 200):
        values += [r.value for b in iter_batches(data) if not b.is_control for r in b.records]
    assert values[:200] == [b"a%d" % i for i in range(100)] + [b"b%d" % i for i in range(100)]
