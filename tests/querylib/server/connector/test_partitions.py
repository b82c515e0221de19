"""`Partitions`: a stream's partition on another broker is read through broker RPC as a local
one is read from its log: partition info, and the scan for a producer's last appended message
(backwards in growing windows) give the same answers both ways. A stream's session there has
an id nobody else can take first."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from querylib.broker import BrokerLink, OpenProducerRequest, ProduceRequest
from querylib.connector import Connector, StreamRefusedError
from querylib.connector._records import encode_messages, source_id
from querylib.rpc import Credential, principal_key
from querylib.server.broker import BrokerServer
from querylib.server.connector import ConnectorEndpoint, EndpointConfig, Partitions, Remote
from querylib.server.connector._offsets import last_appended

SECRET = b"0123456789abcdef0123456789abcdef"
COOKIE = b"cookie"
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


def _credential(principal: str, secret: bytes = SECRET) -> Credential:
    return Credential(principal, principal_key(secret, principal))


async def _squat(tmp: Path) -> None:
    remote = BrokerServer(tmp / "remote", SECRET)
    local = BrokerServer(tmp / "local", SECRET)
    address = await remote.start("tcp://127.0.0.1:0")
    await local.start("tcp://127.0.0.1:0")

    async def locate(topic: str, partition: int) -> Remote | None:
        return Remote(1, address, 0, 0)

    endpoint = ConnectorEndpoint(local.port, EndpointConfig(port=0, cookie=COOKIE),
                                 locate=locate, credential=_credential("executor:host"))
    squatter = None
    try:
        host, port = await endpoint.start()
        # Another principal with a credential of its own opens first, on the broker the
        # stream's partition lives on, the session id it can work out for the stream.
        squatter = BrokerLink(address, _credential("user:mallory"), lease=30.0,
                              session=f"tq.connector.{source_id('logs', 'host-1', 1):016x}")
        await squatter.start()

        def write() -> None:
            with Connector(f"{host}:{port}", program="logs", instance="host-1", cookie=COOKIE,
                           dialect="released", timeout=10.0, reconnect_timeout=10.0) as conn:
                sid = conn.open_stream("events", stream_id=1)
                for i in range(10):
                    conn.send(sid, b"v%d" % i, message_id=i)

        try:
            await asyncio.to_thread(write)
        except StreamRefusedError as exc:
            pytest.fail(f"another principal's session kept the stream out: {exc}")
        info = remote.port.info(PID)
        assert info is not None and info.log_end == 10
    finally:
        if squatter is not None:
            await squatter.close()
        await endpoint.close()
        await local.close()
        await remote.close()


def test_another_principal_cannot_take_a_streams_session_on_another_broker(
        tmp_path: Path) -> None:
    asyncio.run(_squat(tmp_path))


def test_a_streams_session_on_another_broker_is_stable_and_keyed() -> None:
    """The same executor names a stream's session alike across restarts (so it reopens it);
    another key names it otherwise, and nothing of it is the predictable name."""
    route = Remote(1, "tcp://127.0.0.1:1", 0, 0)

    def session(credential: Credential) -> str:
        partitions = Partitions(None, credential=credential)  # type: ignore[arg-type]
        return partitions.link(route, session="tq.connector.0000000000000007",
                               lease=10.0).session

    mine = session(_credential("executor:host"))
    assert mine == session(_credential("executor:host"))
    assert mine != session(_credential("executor:other"))
    assert mine != session(_credential("executor:host", b"another cluster's secret 32bytes"))
    assert mine.startswith("tq.connector.") and "0000000000000007" not in mine
    assert 1 <= len(mine) <= 128
