"""Idempotent-producer sequence rules, one partition (Kafka's ProducerStateManager)."""

from __future__ import annotations

import pytest

from querylib.kafka import (
    DuplicateSequenceError,
    InvalidProducerEpochError,
    OutOfOrderSequenceError,
)
from querylib.records import encode_batch as _encode
from querylib.records import read_header
from querylib.server.kafka import ProducerStateTable


def header(pid: int, epoch: int, sequence: int, records: int = 2):
    batch = _encode([(0, None, b"v", ())] * records, producer_id=pid, producer_epoch=epoch,
                    base_sequence=sequence)
    return read_header(batch)


def appended(table: ProducerStateTable, h, offset: int) -> None:
    assert table.check(h) is None
    table.record(h, offset)


def test_batches_without_a_producer_id_are_not_checked() -> None:
    table = ProducerStateTable()
    plain = header(-1, -1, -1)
    for offset in range(3):
        appended(table, plain, offset)
    assert len(table) == 0


def test_in_order_batches_append_and_a_retry_gets_its_original_offset() -> None:
    table = ProducerStateTable()
    for i in range(7):
        appended(table, header(9, 0, 2 * i), 100 + 2 * i)
    # the last five are remembered: retries are acknowledged with their offsets
    for i in range(2, 7):
        assert table.check(header(9, 0, 2 * i)) == 100 + 2 * i
    # older ones are duplicates Kafka can no longer place
    with pytest.raises(DuplicateSequenceError):
        table.check(header(9, 0, 2))
    with pytest.raises(OutOfOrderSequenceError):
        table.check(header(9, 0, 16))  # 14 expected


def test_unknown_producer_is_accepted_at_any_sequence() -> None:
    table = ProducerStateTable()
    appended(table, header(5, 3, 1000), 0)
    appended(table, header(5, 3, 1002), 2)


def test_epochs() -> None:
    table = ProducerStateTable()
    appended(table, header(5, 1, 0), 0)
    with pytest.raises(InvalidProducerEpochError):
        table.check(header(5, 0, 2))
    with pytest.raises(OutOfOrderSequenceError):
        table.check(header(5, 2, 7))  # a new epoch starts at 0
    appended(table, header(5, 2, 0), 2)
    appended(table, header(5, 2, 2), 4)


def test_sequences_wrap_after_int32_max() -> None:
    table = ProducerStateTable()
    appended(table, header(5, 0, 2**31 - 2, records=2), 0)  # last sequence 2**31 - 1
    appended(table, header(5, 0, 0), 2)


def test_producers_are_bounded_least_recent_first() -> None:
    table = ProducerStateTable(max_producers=3)
    for pid in range(5):
        appended(table, header(pid, 0, 0), pid)
    assert len(table) == 3
    assert table.check(header(0, 0, 7)) is None  # forgotten: accepted as new
    with pytest.raises(OutOfOrderSequenceError):
        table.check(header(4, 0, 7))
