"""A partition's Kafka transaction history beside its log (`_txn_index`, `_disk.transaction_
history`): a broker restarted knows an aborted transaction however far back in the log it is
(beyond the tail it scans for idempotent producers), and its producers' fencing epochs, from
the history the broker kept when it closed, or, when that is missing or damaged, from a walk
of the whole log. Real broker, real files."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from querylib.broker.messages import OpenProducerRequest, ProduceRequest
from querylib.log import LogConfig, PartitionLog
from querylib.records import encode_batch, transaction_marker_batch
from querylib.server.broker import BrokerServer
from querylib.server.broker._bookkeeping import BrokerLimits
from querylib.server.broker._disk import open_partition, transaction_history
from querylib.server.broker._txn_index import INDEX_FILE, TxnHistory

SECRET = b"0123456789abcdef0123456789abcdef"
LIMITS = BrokerLimits(producer_scan_bytes=4096)
ABORTED, COMMITTED = 7, 8


def txn_data(producer_id: int, value: bytes) -> bytes:
    return encode_batch([(0, None, value, ())], producer_id=producer_id, producer_epoch=3,
                        base_sequence=0, is_transactional=True)


def plain(i: int) -> bytes:
    """1,000 records (offsets), 2 KB: the broker's tail scan reads back 4,096 offsets, then
    stops once it read more than its bytes."""
    return encode_batch([(0, None, str(i).encode(), ()) for _ in range(1000)])


async def write_history(data_dir: Path) -> None:
    """An aborted transaction (producer 7), a committed one (8), then 10,000 other records:
    far more than the tail the broker scans at open."""
    broker = BrokerServer(data_dir, SECRET, limits=LIMITS, log_config=LogConfig())
    await broker.start(None)
    link = broker.port.link("system")
    await link.start()
    try:
        await link.request(OpenProducerRequest(session=link.session, topic="t", partition=0,
                                               create=True, create_topic=True))

        async def produce(batch: bytes) -> None:
            await link.request(ProduceRequest(session=link.session, topic="t", partition=0),
                               payload=[batch])

        await produce(txn_data(ABORTED, b"aborted"))                           # offset 0
        await produce(txn_data(COMMITTED, b"committed"))                       # 1
        await produce(transaction_marker_batch(ABORTED, 3, False, timestamp=0))  # 2
        await produce(transaction_marker_batch(COMMITTED, 3, True, timestamp=0))  # 3
        for i in range(10):
            await produce(plain(i))
    finally:
        await link.close()
        await broker.close()


async def known_after_restart(data_dir: Path) -> tuple[list, dict]:
    """The aborted transactions a restarted broker serves readers (Kafka Fetch's aborted
    list and tq's subscriptions both read them), and the partition's fencing epochs."""
    broker = BrokerServer(data_dir, SECRET, limits=LIMITS, log_config=LogConfig())
    await broker.start(None)
    try:
        pid = await broker.port.ensure("t", 0, create=False)
        end = broker.port.info(pid).log_end
        return (broker.port.aborted_transactions(pid, 0, end),
                dict(broker.state.partitions[pid].marked_epochs))
    finally:
        await broker.close()


def test_an_aborted_transaction_far_back_is_known_after_a_restart(tmp_path: Path) -> None:
    asyncio.run(write_history(tmp_path))
    aborted, marked = asyncio.run(known_after_restart(tmp_path))
    assert aborted == [(ABORTED, 0)]
    assert marked == {ABORTED: 3, COMMITTED: 3}


def test_a_missing_or_damaged_history_is_walked_again(tmp_path: Path) -> None:
    asyncio.run(write_history(tmp_path))
    index = tmp_path / "t-0" / INDEX_FILE
    assert index.exists()
    for damage in (lambda: index.unlink(), lambda: index.write_bytes(b""),  # a power loss
                   lambda: index.write_bytes(b'{"crc": 1, "body"'),
                   lambda: index.write_text(index.read_text().replace('"through":', '"thru":')),
                   lambda: index.write_bytes(b'{"crc": 0, "body": 5}'),  # JSON, wrong types
                   lambda: index.write_bytes(b'{"crc": 0, "body": null}')):
        damage()
        aborted, marked = asyncio.run(known_after_restart(tmp_path))
        assert aborted == [(ABORTED, 0)]
        assert marked == {ABORTED: 3, COMMITTED: 3}
        assert index.exists()  # written anew


def test_a_history_behind_the_log_is_completed_by_a_walk(tmp_path: Path) -> None:
    """Records appended after the history was kept (a broker stopped uncleanly keeps none
    newer) are walked: a transaction open in the history and aborted after it is known."""
    path = str(tmp_path / "t-0")
    opened = open_partition(str(tmp_path), ("t", 0), LogConfig(), producer_scan_bytes=4096)
    opened.log.append(txn_data(ABORTED, b"aborted"))
    opened.log.close()
    opened = open_partition(str(tmp_path), ("t", 0), LogConfig(), producer_scan_bytes=4096)
    assert opened.transactions[0] == ((ABORTED, 0),)  # open, as of the history kept
    for i in range(10):
        opened.log.append(plain(i))
    opened.log.append(transaction_marker_batch(ABORTED, 3, False, timestamp=0))
    for i in range(10):
        opened.log.append(plain(i))
    opened.log.close()
    opened = open_partition(str(tmp_path), ("t", 0), LogConfig(), producer_scan_bytes=4096)
    opened.log.close()
    assert opened.transactions == ((), ((ABORTED, 0, 10_001),), ((ABORTED, 3),))
    assert os.path.exists(os.path.join(path, INDEX_FILE))
    # A log cut below the history's end (truncated): walked again from the start.
    log = PartitionLog.open(path, LogConfig())
    log.truncate_to(5000)
    log.close()
    opened = open_partition(str(tmp_path), ("t", 0), LogConfig(), producer_scan_bytes=4096)
    opened.log.close()
    assert opened.transactions == (((ABORTED, 0),), (), ())


def test_a_history_beyond_a_cut_log_is_removed_before_the_log_grows_again(tmp_path: Path) -> None:
    """A log that lost its tail below the history's end (what recovery cuts after a power
    loss) is walked whole at the opening, and the history it had must not outlive that
    opening: were the new one never to reach the disk (a rename a power loss takes; here a
    write that fails), the old one, trusted once the log grew past its end again with other
    records, would keep a transaction of the lost tail open for good."""
    path = str(tmp_path / "t-0")
    with PartitionLog.open(path, LogConfig()) as log:
        log.append(txn_data(ABORTED, b"lost"))                              # offset 0
        log.append(plain(0))                                                # 1..1000
        assert transaction_history(log, path).open == ((ABORTED, 0),)     # kept through 1001
        log.truncate_to(0)  # the tail lost
        blocker = os.path.join(path, INDEX_FILE + ".tmp")
        os.mkdir(blocker)  # the new history cannot be written
        assert transaction_history(log, path) == TxnHistory(0)
        os.rmdir(blocker)
        for i in range(2):
            log.append(plain(i))                                            # 0..1999
        assert transaction_history(log, path) == TxnHistory(2000)
