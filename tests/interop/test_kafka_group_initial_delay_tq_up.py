"""A new group's first assignment waits group.initial.rebalance.delay.ms (issue 15), on a real
`tq up` with the default delay (3 s): two confluent consumers started together in one group,
auto-commit off, share the partitions from the start, so 10,000 records are read as 10,000 in
each of 3 runs (they were read as up to 20,000 when the first member got every partition at
once and the second's arrival rebalanced them: what was read but not committed was read
again)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import free_port, wait_for
from tests.integration._up_endpoints import UpWithEndpoints

confluent_kafka = pytest.importorskip("confluent_kafka")

pytestmark = pytest.mark.timeout(300)

PARTITIONS = 4
RECORDS = 10_000


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpWithEndpoints]:
    with UpWithEndpoints(tmp_path_factory.mktemp("tq-up-kafka-delay"),
                         "--connector-port", "-1", "--kafka-port", str(free_port())) as running:
        yield running


def _fill(up: UpWithEndpoints, topic: str) -> None:
    created = up.tq("topic", "create", topic, "--partitions", str(PARTITIONS))
    assert created.returncode == 0, created.stderr
    producer = confluent_kafka.Producer({"bootstrap.servers": up.info["kafka"],
                                         "linger.ms": 20})
    for i in range(RECORDS):
        producer.produce(topic, value=b"%d" % i, partition=i % PARTITIONS)
        producer.poll(0)
    assert producer.flush(60) == 0


@pytest.mark.parametrize("run", range(3))
def test_two_consumers_started_together_read_each_record_once(up, run: int) -> None:
    topic = "delay-shared"
    if run == 0:
        _fill(up, topic)
    consumers = []
    assignments: list[list[set[int]]] = [[], []]
    read: list[list[tuple[int, int]]] = [[], []]
    for n in range(2):
        consumer = confluent_kafka.Consumer({
            "bootstrap.servers": up.info["kafka"], "group.id": f"delay-{run}",
            "auto.offset.reset": "earliest", "enable.auto.commit": False,
            "partition.assignment.strategy": "range", "session.timeout.ms": 10_000})

        def assigned(_c, partitions, n=n) -> None:
            assignments[n].append({p.partition for p in partitions})

        consumer.subscribe([topic], on_assign=assigned)
        consumers.append(consumer)
    try:
        def everything_read() -> bool:
            for n, consumer in enumerate(consumers):
                for message in consumer.consume(500, 0.05):
                    assert message.error() is None, message.error()
                    read[n].append((message.partition(), message.offset()))
            distinct = set(read[0]) | set(read[1])
            return len(distinct) == RECORDS and all(assignments)

        wait_for(everything_read, timeout=120, what="every record to be read")
        # Anything read twice came in while the group settled: poll once more each, to see
        # a late duplicate as well.
        for n, consumer in enumerate(consumers):
            for message in consumer.consume(500, 0.5):
                read[n].append((message.partition(), message.offset()))
    finally:
        for consumer in consumers:
            consumer.close()
    assert len(read[0]) + len(read[1]) == RECORDS, (len(read[0]), len(read[1]))
    # One assignment each, from the start: no partition moved from one to the other.
    assert [len(a) for a in assignments] == [1, 1], assignments
    assert sorted(assignments[0][0] | assignments[1][0]) == list(range(PARTITIONS))
    assert not assignments[0][0] & assignments[1][0]
