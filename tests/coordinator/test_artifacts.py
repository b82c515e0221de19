"""What the coordinator's store of program packs (DESIGN §6 "Programs and spawning") may hold:
one unfinished upload per session, a bounded amount of packs no query runs per user, and packs
no live query runs only for an hour after they were stored. A user filled its disk before,
one 64 MiB pack (or unfinished upload) after another."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from pathlib import Path

import pytest

from catalog import ConflictError, InvalidCommandError, Resources, SessionKind
from coordinator import Coordinator, CoordinatorConfig
from coordinator._artifacts import ArtifactStore
from querylib.cluster import AsyncCluster
from querylib.cluster import messages as m

SECRET = os.urandom(32)
CHUNK = m.ARTIFACT_CHUNK_BYTES


def _pack(n: int, size: int = 1000) -> tuple[str, bytes]:
    data = n.to_bytes(4, "big") * (size // 4)
    return hashlib.sha256(data).hexdigest(), data


async def _coordinator(data: Path, **config: object) -> Coordinator:
    coordinator = Coordinator(data, SECRET, listen="tcp://127.0.0.1:0",
                              broker_listen="tcp://127.0.0.1:0",
                              config=CoordinatorConfig(**config))  # type: ignore[arg-type]
    await coordinator.start()
    return coordinator


def test_a_session_holds_one_unfinished_upload(tmp_path: Path) -> None:
    """A session that starts upload after upload, finishing none, holds one file's worth."""
    async def main() -> list[str]:
        coordinator = await _coordinator(tmp_path)
        try:
            assert coordinator.endpoint is not None
            async with AsyncCluster(coordinator.endpoint, SECRET, lease=10.0) as admin:
                for n in range(5):
                    digest, pack = _pack(n, 2 * CHUNK)
                    await admin.client.request(m.UploadArtifact(
                        session_id=admin._session(), sha256=digest, offset=0,
                        size=len(pack)), payload=[pack[:CHUNK]])
                return sorted(p.name for p in (tmp_path / "artifacts").iterdir())
        finally:
            await coordinator.close()

    held = asyncio.run(main())
    assert len(held) == 1 and held[0].startswith(".incoming-"), held


def test_a_user_holds_a_bounded_amount_of_packs_no_query_runs(tmp_path: Path) -> None:
    """Past its room for packs no live query runs, a user's next upload is refused with what
    to do; a query of one of them gives the room back. The admin is not bounded."""
    async def main() -> None:
        coordinator = await _coordinator(tmp_path, max_unclaimed_upload_bytes=3000)
        try:
            assert coordinator.endpoint is not None
            agent = AsyncCluster(coordinator.endpoint, SECRET, lease=10.0,
                                 kind=SessionKind.EXECUTOR)
            async with agent, AsyncCluster(coordinator.endpoint, SECRET, lease=10.0) as admin:
                broker = await agent.register_broker("host-a", "tcp://127.0.0.1:1")
                await agent.register_executor("host-a", broker.broker_id, Resources(
                    cores=1, memory=1 << 30, disk=1 << 30, slots=4))
                bob = await admin.add_user("user:bob", "user")
                async with AsyncCluster(coordinator.endpoint, bob, lease=10.0) as user:
                    sources = [await user.upload_artifact(*_pack(n)) for n in range(3)]
                    with pytest.raises(ConflictError, match="no query runs"):
                        await user.upload_artifact(*_pack(3))
                    await user.submit_query("runs", sources[0])
                    await user.upload_artifact(*_pack(3))
                for n in range(10, 15):
                    await admin.upload_artifact(*_pack(n))
        finally:
            await coordinator.close()

    asyncio.run(main())


def test_packs_no_live_query_runs_are_removed_an_hour_after_they_were_stored(
        tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    digests = []
    for n in range(3):
        digest, pack = _pack(n)
        assert store.receive(digest, "1", 0, len(pack), [pack]) == len(pack)
        digests.append(digest)
    old = time.time() - 2 * 3600
    for digest in digests[:2]:
        os.utime(tmp_path / digest, (old, old))
    assert store.prune(keep={digests[0]}) == [digests[1]]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([digests[0], digests[2]])
    # Uploaded again: stored anew (its hour starts again).
    digest, pack = _pack(0)
    os.utime(tmp_path / digest, (old, old))
    store.receive(digest, "2", 0, len(pack), [pack])
    assert store.prune(keep=set()) == []


def _incoming_bytes(data: Path) -> int:
    return sum(p.stat().st_size for p in (data / "artifacts").glob(".incoming-*"))


async def _bob(coordinator: Coordinator) -> object:
    """The credential of a new user, user:bob."""
    assert coordinator.endpoint is not None
    async with AsyncCluster(coordinator.endpoint, SECRET, lease=10.0) as admin:
        return await admin.add_user("user:bob", "user")


async def _start_upload(user: AsyncCluster, n: int) -> int:
    """`user` starts uploading the 2,000-byte pack `n`: its first 1,000 bytes; the bytes the
    coordinator holds of it."""
    digest, pack = _pack(n, 2000)
    reply = await user.client.request(m.UploadArtifact(
        session_id=user._session(), sha256=digest, offset=0, size=len(pack)),
        payload=[pack[:1000]])
    return reply.size


def test_every_chunk_is_held_to_the_size_its_upload_declared(tmp_path: Path) -> None:
    """A user whose upload declared a small pack cannot send it bigger: a later chunk that
    declares more, or runs past what was declared, is refused and the partial file removed.
    Before, only the first chunk was checked against the user's room, so the next ones could
    declare up to 64 MiB and fill the coordinator's disk past it."""
    async def main() -> None:
        coordinator = await _coordinator(tmp_path, max_unclaimed_upload_bytes=3000)
        try:
            bob = await _bob(coordinator)
            assert coordinator.endpoint is not None
            async with AsyncCluster(coordinator.endpoint, bob, lease=10.0) as user:
                digest, pack = _pack(1, 2000)

                async def chunk(offset: int, size: int, data: bytes) -> int:
                    reply = await user.client.request(m.UploadArtifact(
                        session_id=user._session(), sha256=digest, offset=offset,
                        size=size), payload=[data])
                    return reply.size

                assert await chunk(0, 2000, pack[:1000]) == 1000
                with pytest.raises(InvalidCommandError, match="declared 2000 bytes"):
                    await chunk(1000, m.ARTIFACT_CHUNK_BYTES * 8, bytes(CHUNK))
                assert _incoming_bytes(tmp_path) == 0
                assert await chunk(0, 2000, pack[:1000]) == 1000
                with pytest.raises(InvalidCommandError, match="does not fit"):
                    await chunk(1000, 2000, bytes(2000))
                assert _incoming_bytes(tmp_path) == 0
                # Bad chunks lose nothing else: the pack uploads whole afterwards.
                assert await user.upload_artifact(digest, pack) == f"sha256:{digest}"
        finally:
            await coordinator.close()

    asyncio.run(main())


def test_uploads_that_start_at_once_share_the_users_room(tmp_path: Path) -> None:
    """Uploads of one user started from several sessions at once reserve their declared sizes
    as they start: those that would take the user past its room are refused, so unfinished
    uploads hold no more than the room. Before, each start saw only the stored packs and all
    of them passed."""
    async def main() -> None:
        coordinator = await _coordinator(tmp_path, max_unclaimed_upload_bytes=3000)
        try:
            bob = await _bob(coordinator)
            assert coordinator.endpoint is not None
            sessions = [AsyncCluster(coordinator.endpoint, bob, lease=10.0) for _ in range(3)]
            for session in sessions:
                await session.__aenter__()
            try:
                results = await asyncio.gather(
                    *(_start_upload(s, n) for n, s in enumerate(sessions)),
                    return_exceptions=True)
                refused = [r for r in results if isinstance(r, ConflictError)]
                assert len(refused) == 2, results
                assert "unfinished" in str(refused[0])
                assert _incoming_bytes(tmp_path) == 1000
            finally:
                for session in sessions:
                    await session.__aexit__(None, None, None)
        finally:
            await coordinator.close()

    asyncio.run(main())


def test_an_upload_whose_session_ends_frees_its_room_and_its_file(tmp_path: Path) -> None:
    """`tq submit` interrupted half way through its upload: once its session ends (closed
    here; an expired lease ends it the same way), the partial file goes and the user's room is
    whole again. Before, both stayed for an hour: the next submit of a pack that needed the
    room was refused meanwhile."""
    async def main() -> None:
        coordinator = await _coordinator(tmp_path, max_unclaimed_upload_bytes=3000)
        try:
            bob = await _bob(coordinator)
            assert coordinator.endpoint is not None
            async with AsyncCluster(coordinator.endpoint, bob, lease=10.0) as interrupted:
                assert await _start_upload(interrupted, 1) == 1000
            deadline = time.monotonic() + 10
            while _incoming_bytes(tmp_path) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert _incoming_bytes(tmp_path) == 0
            async with AsyncCluster(coordinator.endpoint, bob, lease=10.0) as again:
                assert await _start_upload(again, 2) == 1000
        finally:
            await coordinator.close()

    asyncio.run(main())
