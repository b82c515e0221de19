"""`Partitions`: a stream's partition on another broker is read through broker RPC as a local
one is read from its log: partition info, and the scan for a producer's last appended message
(backwards in growing windows) give the same answers both ways."""

from __future__ import annotations

import asyncio
from pathlib import Path

from querylib.broker import OpenProducerRequest, ProduceRequest
from querylib.connector._records import encode_messages
from querylib.rpc import Credential
from querylib.server.broker import BrokerServer
from querylib.server.connector import Partitions, Remote
from querylib.server.connector._offsets import last_appended

SECRET = b"0123456789abcdef0123456789abcdef"
PID = ("events", 0)
MINE, OTHER = 7, 8


async def _fill(server: BrokerServer) -> None:
    """Batches of 100 by MINE (ids 0..) and OTHER in turn, MINE's last ones early, so the
    scan must widen its window (4096 offsets first) to find them."""
    link = server.port.link("anonymous", lease=10.0)
    await link.start()
    await link.request(OpenProducerRequest(session=link.session, topic=PID[0],
                                           partition=PID[1]))
    mid = 0
    for i in range(70):
        producer = MINE if i < 8 else OTHER
        batch = encode_messages([(mid + k, f"v{mid + k}".encode(), None, None, 0)
                                 for k in range(100)], time=0, now_ms=0, producer_id=producer)
        mid += 100
        await link.request(ProduceRequest(session=link.session, topic=PID[0],
                                          partition=PID[1]), payload=[batch])
    await link.close()


async def _compare(tmp: Path) -> None:
    remote = BrokerServer(tmp / "remote", SECRET)
    local = BrokerServer(tmp / "local", SECRET)
    address = await remote.start("tcp://127.0.0.1:0")
    await local.start("tcp://127.0.0.1:0")
    try:
        await _fill(remote)

        async def locate(topic: str, partition: int) -> Remote | None:
            return Remote(1, address, 0, 0)

        partitions = Partitions(local.port, locate=locate, credential=Credential.of(SECRET))
        log = remote.port.log(PID)
        info = await partitions.info(PID)
        assert info is not None and info.log_end == remote.port.info(PID).log_end == 7000
        for producer, start in ((MINE, 0), (MINE, 500), (MINE, 800), (OTHER, 0),
                                (OTHER, 6950), (9, 0)):
            expected = last_appended(log, producer, start)
            assert await partitions.scan(PID, producer, start) == expected, (producer, start)
        assert await partitions.scan(PID, MINE, 0) == (799, 800)
        assert await partitions.info(("nothing", 0)) is None
    finally:
        await local.close()
        await remote.close()


def test_a_remote_partition_reads_as_a_local_one(tmp_path: Path) -> None:
    asyncio.run(_compare(tmp_path))
