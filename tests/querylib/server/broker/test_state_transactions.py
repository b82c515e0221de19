"""Kafka transactions in the broker's core: the last stable offset bounds subscriptions, the
batches of aborted transactions are not delivered, markers come only from tq's own
coordinator, and a partition opening learns its transactions from the log's tail."""

from __future__ import annotations

import pytest

from querylib.broker._errors import BrokerProtocolError
from querylib.records import decode_batch, encode_batch, transaction_marker_batch
from querylib.server.broker._events import (
    Deliver,
    Fail,
    OpenProducer,
    OpenSession,
    Produce,
    Subscribe,
    Tick,
)

from ._sim import Sim

P = ("t", 0)
TXN = 7


def txn_batch(value: bytes, seq: int) -> bytes:
    return encode_batch([(0, None, value, ())], producer_id=TXN, producer_epoch=0,
                        base_sequence=seq, is_transactional=True)


def started() -> Sim:
    sim = Sim()
    sim.open_partition(P)
    sim.feed(OpenSession("o-k", "kafka", 10.0, principal="anonymous"))
    sim.feed(OpenProducer("op-k", "kafka", P))
    sim.feed(OpenSession("o-s", "sys", 10.0, principal="system"))
    sim.feed(OpenProducer("op-s", "sys", P))
    return sim


def write(sim: Sim, session: str, batch: bytes) -> list:
    out = sim.feed(Produce(f"w{len(sim.logs[P])}", session, P, batch))
    sim.controls(P)
    return out


def delivered_values(sim: Sim) -> tuple[list[bytes], int]:
    """The record values a subscription from the start is sent, and where it ends."""
    sim.feed(OpenSession("o-r", "reader", 10.0))
    sim.track("reader", 1, 1 << 20)
    sim.feed(Subscribe("sub", "reader", 1, P, "earliest", 1 << 20))
    values: list[bytes] = []
    end = 0
    while sim.reads:
        for instr in sim.complete_read(next(iter(sim.reads))):
            if isinstance(instr, Deliver):
                end = instr.next_offset
                pos = 0
                while pos < len(instr.data):
                    size = int.from_bytes(instr.data[pos + 8:pos + 12], "big") + 12
                    batch = decode_batch(instr.data[pos:pos + size])
                    if not batch.is_control:
                        values += [r.value for r in batch.records]
                    pos += size
    return values, end


def test_open_transaction_bounds_readers_and_aborted_records_are_left_out() -> None:
    sim = started()
    write(sim, "kafka", txn_batch(b"a1", 0))
    write(sim, "sys", transaction_marker_batch(TXN, 0, False, timestamp=0))
    write(sim, "kafka", txn_batch(b"c1", 1))
    write(sim, "sys", transaction_marker_batch(TXN, 0, True, timestamp=0))
    write(sim, "kafka", txn_batch(b"open", 2))
    part = sim.state.partitions[P]
    assert part.stable_end == 4 < part.visible_end == 5  # held at the open transaction
    assert list(part.aborted) == [(TXN, 0, 1)]
    info = sim.state.partition_info(P)
    assert (info.log_end, info.high_watermark) == (4, 5)
    values, end = delivered_values(sim)
    assert values == [b"c1"] and end == 4


def test_only_system_writes_transaction_markers() -> None:
    sim = started()
    out = sim.feed(Produce("m", "kafka", P, transaction_marker_batch(TXN, 0, True,
                                                                     timestamp=0)))
    assert [type(i) for i in out] == [Fail]
    assert isinstance(out[0].error, BrokerProtocolError)


@pytest.mark.parametrize("aborted", [True, False])
def test_a_reopened_partition_knows_its_transactions(aborted: bool) -> None:
    sim = Sim()
    sim.open_partition(P, open_transactions=((TXN, 5),),
                       aborted_transactions=((8, 0, 2),) if aborted else ())
    part = sim.state.partitions[P]
    assert part.open_txns == {TXN: 5}
    assert list(part.aborted) == ([(8, 0, 2)] if aborted else [])


def test_a_transaction_nobody_ends_is_aborted_by_the_broker() -> None:
    sim = started()
    write(sim, "kafka", txn_batch(b"orphan", 0))
    other = encode_batch([(0, None, b"plain", ())])
    write(sim, "kafka", other)
    part = sim.state.partitions[P]
    assert part.stable_end == 0
    limit = sim.state.limits.max_transaction_seconds
    sim.feed(Tick(sim.state.now + limit - 1))
    assert sim.controls(P)[-1] is None  # not yet
    sim.feed(Tick(sim.state.now + 2))
    sim.controls(P)
    assert part.stable_end == part.visible_end == 3  # its ABORT marker at 2
    assert list(part.aborted) == [(TXN, 0, 2)]
    values, end = delivered_values(sim)
    assert values == [b"plain"] and end == 3
