"""tq's own readers and Kafka transactions: a querylib subscriber of a broker (`tq broker
--kafka-port`) that confluent-kafka transactional producers write to sees committed records
only, never an aborted one, and never reads past the last stable offset (an open
transaction's records, and everything after them, wait for its end)."""

from __future__ import annotations

import pytest

from querylib.broker import Data, Subscriber, Values
from tests.conftest import Processes, free_port
from tests.integration._broker_helpers import secret_file, start_broker

confluent_kafka = pytest.importorskip("confluent_kafka")
Producer = confluent_kafka.Producer


def read_values(address: str, secret: bytes, topic: str, *, values: bool) -> list[bytes]:
    """Every record value a subscriber reads from the start to the end it sees."""
    with Subscriber(address, topic, [0], secret=secret, follow=False, values=values,
                    timeout=20) as sub:
        out: list[bytes] = []
        for event in sub:
            if isinstance(event, Data):
                out += [r.value for r in event.records]
            elif isinstance(event, Values):
                out += list(event.values)
    return out


@pytest.mark.parametrize("values", [False, True], ids=["records", "values"])
def test_a_querylib_subscriber_reads_committed_records_only(
        tmp_path, processes: Processes, values: bool) -> None:
    path, secret = secret_file(tmp_path)
    rpc, kafka = free_port(), free_port()
    start_broker(processes, tmp_path / "data", rpc, path, secret, kafka_port=kafka)
    address = f"tcp://127.0.0.1:{rpc}"
    p = Producer({"bootstrap.servers": f"127.0.0.1:{kafka}", "transactional.id": "tq-readers",
                  "linger.ms": 5})
    p.init_transactions(20)
    for n, commit in ((0, True), (1, False), (2, True)):
        p.begin_transaction()
        for i in range(4):
            p.produce("txn", value=f"{n}-{i}".encode())
        assert p.flush(20) == 0
        if commit:
            p.commit_transaction(20)
        else:
            p.abort_transaction(20)
    committed = [f"{n}-{i}".encode() for n in (0, 2) for i in range(4)]
    assert read_values(address, secret, "txn", values=values) == committed
    # An open transaction holds the reader at its first record, whatever follows it.
    p.begin_transaction()
    p.produce("txn", value=b"open")
    assert p.flush(20) == 0
    other = Producer({"bootstrap.servers": f"127.0.0.1:{kafka}", "enable.idempotence": True})
    other.produce("txn", value=b"after")
    assert other.flush(20) == 0
    assert read_values(address, secret, "txn", values=values) == committed
    p.commit_transaction(20)
    assert read_values(address, secret, "txn", values=values) == [*committed, b"open",
                                                                  b"after"]
