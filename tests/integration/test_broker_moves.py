"""A client following its broker to a new address keeps writing as the principal its
credential authenticates (DESIGN §5 "Restarts", §12): the link's new RPC client signs with
the same credential, so the restarted broker admits it to the topic that principal owns."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

from querylib.broker import AsyncProducer, AsyncSubscriber, Data
from querylib.rpc import Credential, principal_key
from querylib.server.broker import BrokerServer, TopicAccess
from tests.conftest import free_port

SECRET = os.urandom(32)
OWNER = "user:7"


class _OwnedTopics:
    """A directory in which topic "t" is written by OWNER only, as the catalog says of a
    user's topic."""

    async def resolve(self, topic: str, partition: int, *, create: bool) -> TopicAccess:
        return TopicAccess(topic, OWNER if topic == "t" else "*")

    def watch(self, learn: Callable[[TopicAccess], None],
              forget: Callable[[str], None]) -> None:
        pass


def test_a_producer_that_follows_its_broker_writes_as_the_same_principal(
        tmp_path: Path) -> None:
    credential = Credential(OWNER, principal_key(SECRET, OWNER))

    async def main() -> tuple[list[bytes | None], str, int]:
        first = BrokerServer(tmp_path, SECRET, directory=_OwnedTopics())
        old = await first.start()
        second: BrokerServer | None = None
        where = {"address": old}

        async def locate() -> str:
            return where["address"]  # what the catalog says once the broker re-registered

        producer = AsyncProducer(old, "t", secret=credential, lease=0.5, locate=locate,
                                 reconnect_timeout=30.0)
        try:
            await producer.start()
            await producer.send(b"before", time=0)
            await producer.flush()
            await first.close()  # the broker goes away; it comes back elsewhere
            second = BrokerServer(tmp_path, SECRET, directory=_OwnedTopics())
            port = free_port()
            while f":{port}" in old:
                port = free_port()
            where["address"] = await second.start(f"tcp://127.0.0.1:{port}")
            await producer.send(b"after", time=1)
            await producer.flush()
            principal = second.state.sessions[producer.link.session].principal
            await producer.close()
            async with AsyncSubscriber(where["address"], "t", 0, secret=SECRET,
                                       follow=False) as sub:
                values = [r.value async for e in sub if isinstance(e, Data)
                          for r in e.records]
            return values, principal, producer.link.moves
        finally:
            await producer.link.close(clean=False)
            if second is not None:
                await second.close()
            await first.close()

    values, principal, moves = asyncio.run(main())
    assert values == [b"before", b"after"]
    assert moves == 1 and principal == OWNER
