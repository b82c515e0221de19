"""The broker's two doors on a real BrokerServer in this process: RPC clients (real sockets)
and the in-process `BrokerPort`. Both are admitted by the same core; only the port may write
as tq itself ("system"), and an RPC client may not borrow a session the port opened."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from querylib.broker import (
    AdvanceRequest,
    AsyncProducer,
    AsyncSubscriber,
    BrokerClosedError,
    BrokerLink,
    Chunk,
    Data,
    OpenProducerRequest,
    PrincipalError,
    ProduceRequest,
    SubscriberCore,
    TopicAuthorizationError,
)
from querylib.broker.messages import OpenSessionRequest, SubscribeRequest
from querylib.records import encode_batch, read_header
from querylib.records._types import CONTROL_BIT
from querylib.rpc import Credential, SecretRejectedError, principal_key
from querylib.server.broker import BrokerServer, TopicAccess
from tests.conftest import wait_for_async
from tests.integration._broker_helpers import AliceOwnsMine

SECRET = os.urandom(32)


def test_only_the_port_writes_as_tq_and_rpc_cannot_borrow_its_sessions(tmp_path: Path) -> None:
    async def main() -> list[bytes | None]:
        server = BrokerServer(tmp_path, SECRET)
        address = await server.start()
        try:
            # tq's own writer, in-process, with a well-known session id
            own = server.port.link("system", session="tq.well-known")
            await own.start()
            await own.request(OpenProducerRequest(session=own.session, topic="__logs",
                                                  partition=0))
            await own.request(ProduceRequest(session=own.session, topic="__logs",
                                             partition=0),
                              payload=[encode_batch([(1, None, b"by tq", ())])])
            # An RPC client cannot be "system" (no key is ever valid for it: it is refused
            # when it connects), borrow the port's session, or write `__logs`.
            system = Credential("system", principal_key(SECRET, "system"))
            claim = BrokerLink(address, system, timeout=20)
            with pytest.raises(SecretRejectedError):
                await claim.start()
            await claim.close(clean=False)
            rpc = BrokerLink(address, SECRET, timeout=5)
            await rpc.start()
            with pytest.raises(PrincipalError):
                await rpc.request(ProduceRequest(session=own.session, topic="__logs",
                                                 partition=0),
                                  payload=[encode_batch([(2, None, b"forged", ())])])
            with pytest.raises(TopicAuthorizationError):
                await rpc.request(OpenProducerRequest(session=rpc.session, topic="__logs",
                                                      partition=0))
            # ...or take first the id of a session the port will open (the connector's are
            # predictable): the port's ids are its own.
            with pytest.raises(PrincipalError):
                await rpc.request(OpenSessionRequest(session="tq.local.tq.connector.1",
                                                     lease=5.0))
            await rpc.close()
            # AsyncProducer runs over either door: the port, as tq...
            async with AsyncProducer(server.port, "__logs", principal="system") as producer:
                await producer.send(b"by tq again")
                await producer.flush()
            # ...and RPC, as anyone, into a topic open to anyone (a standalone broker's).
            async with AsyncProducer(address, "open", secret=SECRET) as producer:
                await producer.send(b"by a client")
            async with AsyncSubscriber(address, "__logs", 0, secret=SECRET,
                                       follow=False) as sub:
                return [r.value async for e in sub if isinstance(e, Data) for r in e.records]
        finally:
            await server.close()

    assert asyncio.run(main()) == [b"by tq", b"by tq again"]


def test_a_produce_naming_another_principals_session_is_refused(tmp_path: Path) -> None:
    """The request of every batch goes through the door's checks too (it is served without
    a task per request): bob cannot write through alice's session, nor after the close."""
    async def main() -> tuple[int, int]:
        server = BrokerServer(tmp_path, SECRET)
        address = await server.start()
        alice = BrokerLink(address, Credential("user:alice", principal_key(SECRET, "user:alice")),
                           timeout=10)
        bob = BrokerLink(address, Credential("user:bob", principal_key(SECRET, "user:bob")),
                         timeout=10)
        try:
            for link in (alice, bob):
                await link.start()
            await alice.request(OpenProducerRequest(session=alice.session, topic="t",
                                                    partition=0, create=True))
            batch = encode_batch([(0, None, b"alice's", ())])
            await alice.request(ProduceRequest(session=alice.session, topic="t", partition=0),
                                payload=[batch])
            with pytest.raises(PrincipalError, match="belongs to another principal"):
                await bob.request(ProduceRequest(session=alice.session, topic="t",
                                                 partition=0),
                                  payload=[encode_batch([(0, None, b"bob's", ())])])
            end = server.state.partition_info(("t", 0)).log_end
            await server.close()
            with pytest.raises(BrokerClosedError):
                server._serve_now(ProduceRequest(session=alice.session, topic="t",
                                                        partition=0), None)  # type: ignore[arg-type]
            return end, server.state.partition_info(("t", 0)).log_end
        finally:
            await alice.close(clean=False)
            await bob.close(clean=False)
            await server.close()

    assert asyncio.run(main()) == (1, 1)


def test_pipelined_requests_of_a_producer_are_appended_in_arrival_order(tmp_path: Path) -> None:
    """A producer sends its frontier advances between its batches without waiting for
    answers (`ProducerCore._issue`): the broker appends in arrival order, whichever requests
    are served without a task, so the log holds each frontier where it was sent."""
    async def main() -> list[str]:
        server = BrokerServer(tmp_path, SECRET)
        address = await server.start()
        link = BrokerLink(address, SECRET, timeout=10)
        try:
            await link.start()
            await link.request(OpenProducerRequest(session=link.session, topic="t",
                                                   partition=0, create=True))
            requests = []
            for t in range(1, 41):
                requests.append(link.request(
                    AdvanceRequest(session=link.session, topic="t", partition=0, frontier=t)))
                requests.append(link.request(
                    ProduceRequest(session=link.session, topic="t", partition=0),
                    payload=[encode_batch([(0, None, b"at %d" % t, ())])]))
            await asyncio.gather(*requests)
            log = server.partition_log(("t", 0))
            data = log.read(0, 1 << 20)
        finally:
            await link.close()
            await server.close()
        kinds, pos = [], 0
        while pos < len(data):
            header = read_header(data, pos)
            kinds.append("frontier" if header.attributes & CONTROL_BIT else "data")
            pos += header.size
        return kinds

    assert asyncio.run(main()) == ["frontier", "data"] * 40


def test_batches_issued_back_to_back_are_stored_in_order_without_a_loop_hop(
        tmp_path: Path) -> None:
    """`send_batch` hands its request to a task and returns without going through the event
    loop (no hop per batch); the tasks send in the order they were made, so the broker stores
    the batches in the order issued, over RPC and through the in-process port alike."""
    async def main() -> dict[str, list[bytes | None]]:
        server = BrokerServer(tmp_path, SECRET)
        address = await server.start()
        loop = asyncio.get_running_loop()
        stored: dict[str, list[bytes | None]] = {}
        try:
            doors: list[tuple[str, AsyncProducer]] = [
                ("rpc", AsyncProducer(address, "rpc", secret=SECRET)),
                ("port", AsyncProducer(server.port, "port", principal="system"))]
            for topic, producer in doors:
                async with producer:
                    hops: list[int] = []
                    loop.call_soon(hops.append, 1)  # runs once the loop gets a turn
                    for i in range(50):
                        await producer.send_batch(encode_batch([(i, None, b"%d" % i, ())]))
                    assert hops == []  # 50 batches issued, the loop never ran meanwhile
                    await producer.flush()
                async with AsyncSubscriber(address, topic, 0, secret=SECRET,
                                           follow=False) as sub:
                    stored[topic] = [r.value async for e in sub if isinstance(e, Data)
                                     for r in e.records]
        finally:
            await server.close()
        return stored

    expected = [b"%d" % i for i in range(50)]
    assert asyncio.run(main()) == {"rpc": expected, "port": expected}


def test_a_client_may_write_as_anonymous_and_its_session_stays_its_own(tmp_path: Path) -> None:
    """A downgrade (the connector endpoint writes a shard's partitions so, DESIGN §12): alice's
    session opened as anonymous writes as anonymous (not her own topic), and stays alice's:
    bob cannot use it. Claiming anyone else is still ignored."""
    async def main() -> tuple[str, str]:
        server = BrokerServer(tmp_path, SECRET, directory=AliceOwnsMine())
        address = await server.start()
        alice_key = Credential("user:alice", principal_key(SECRET, "user:alice"))
        alice = BrokerLink(address, alice_key, timeout=10, principal="anonymous")
        bob = BrokerLink(address, Credential("user:bob", principal_key(SECRET, "user:bob")),
                         timeout=10)
        claims = BrokerLink(address, alice_key, timeout=10, principal="admin")
        try:
            for link in (alice, bob, claims):
                await link.start()
            await alice.request(OpenProducerRequest(session=alice.session, topic="open",
                                                    partition=0, create=True))
            await alice.request(ProduceRequest(session=alice.session, topic="open",
                                               partition=0),
                                payload=[encode_batch([(0, None, b"anonymous", ())])])
            with pytest.raises(TopicAuthorizationError):
                await alice.request(OpenProducerRequest(session=alice.session, topic="mine",
                                                        partition=0, create=True))
            with pytest.raises(PrincipalError, match="belongs to another principal"):
                await bob.request(ProduceRequest(session=alice.session, topic="open",
                                                 partition=0),
                                  payload=[encode_batch([(0, None, b"bob's", ())])])
            with pytest.raises(PrincipalError, match="belongs to another principal"):
                await bob.request(OpenSessionRequest(session=alice.session, lease=5.0,
                                                     principal="anonymous"))
            await alice.reopen(alice.generation)  # renewing it is alice's
            return (server.state.sessions[alice.session].principal,
                    server.state.sessions[claims.session].principal)
        finally:
            for link in (alice, bob, claims):
                await link.close(clean=False)
            await server.close()

    assert asyncio.run(main()) == ("anonymous", "user:alice")


def test_a_subscriber_on_a_session_opened_as_anonymous_gets_its_credit(tmp_path: Path) -> None:
    """Alice's session opened as anonymous subscribes with room for a few batches: the credit
    it grants as it consumes is hers to grant, so it reads on past its first window (it
    stalled once the first was spent: her grants were taken for a stranger's)."""
    async def main() -> int:
        server = BrokerServer(tmp_path, SECRET, directory=AliceOwnsMine())
        address = await server.start()
        alice = BrokerLink(address, Credential("user:alice",
                                               principal_key(SECRET, "user:alice")),
                           timeout=10, principal="anonymous")
        batches = [encode_batch([(0, None, bytes([i]) * 1000, ())]) for i in range(20)]
        received: list[Chunk] = []
        core = SubscriberCore(alice, "open", [0], "earliest", credit=3000,
                              sink=lambda item: received.append(item))
        try:
            await alice.start()
            await alice.request(OpenProducerRequest(session=alice.session, topic="open",
                                                    partition=0, create=True))
            for one in batches:
                await alice.request(ProduceRequest(session=alice.session, topic="open",
                                                   partition=0), payload=[one])
            await core.open()
            consumed = 0

            def consume() -> int:
                nonlocal consumed
                for chunk in received[consumed:]:
                    assert isinstance(chunk, Chunk)
                    core.consumed(0, len(chunk.data))
                consumed = len(received)
                return received[-1].next_offset if received else 0

            await wait_for_async(lambda: consume() >= len(batches), timeout=10)
            return consume()
        finally:
            await core.close()
            await alice.close(clean=False)
            await server.close()

    assert asyncio.run(main()) == 20


class _SlowDirectory:
    """Every topic open to anyone; resolving "slow" waits until the test opens `gate`."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.resolving = asyncio.Event()

    async def resolve(self, topic: str, partition: int, *, create: bool) -> TopicAccess:
        if topic == "slow":
            self.resolving.set()
            await self.gate.wait()
        return TopicAccess(topic, "*")

    def watch(self, learn: object, forget: object) -> None:
        pass


def test_a_session_opened_while_anothers_request_waits_stays_its_own(tmp_path: Path) -> None:
    """Bob subscribes in a session nobody has yet; while his request waits on the directory,
    alice opens that session. His request is refused once it goes on, rather than subscribing
    in alice's session and taking her deliveries to his socket."""
    async def main() -> None:
        directory = _SlowDirectory()
        server = BrokerServer(tmp_path, SECRET, directory=directory)
        address = await server.start()
        bob = BrokerLink(address, Credential("user:bob", principal_key(SECRET, "user:bob")),
                         timeout=10)
        alice = BrokerLink(address, Credential("user:alice",
                                               principal_key(SECRET, "user:alice")),
                           timeout=10, session="alices")
        try:
            await bob.start()
            taking = asyncio.ensure_future(bob.request(SubscribeRequest(
                session="alices", sub_id=1, topic="slow", partition=0, credit=1 << 20,
                create=True)))
            await asyncio.wait_for(directory.resolving.wait(), 10)
            await alice.start()
            directory.gate.set()
            with pytest.raises(PrincipalError, match="belongs to another principal"):
                await taking
            assert not server.state.sessions["alices"].subs
        finally:
            for link in (alice, bob):
                await link.close(clean=False)
            await server.close()

    asyncio.run(main())
