"""The executor agent's tasks in this process, against a real coordinator: a task that fails
with a bug (not a TqError) is reported, never dropped. A spawn that hits a bug releases its
slot and fails its query with the reason at once (not at the 60 s start timeout); a kill or
any other task that hits one is logged with its traceback and counted."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from coordinator import Coordinator
from executor import ExecutorAgent
from executor._agent_state import Kill
from querylib.cluster import AsyncCluster, QueryFailedError
from tests.conftest import wait_for_async
from tests.executor._support import write_program

pytestmark = pytest.mark.timeout(120)

SECRET = b"0123456789abcdef0123456789abcdef"

JOB = """
    import querylib
    querylib.execute(lambda ctx: None)
"""


class _Bug(RuntimeError):
    """Stands for a bug in the agent (not a TqError)."""


async def _running(tmp_path: Path) -> tuple[Coordinator, ExecutorAgent]:
    coordinator = Coordinator(tmp_path / "coordinator", SECRET, listen="tcp://127.0.0.1:0",
                              broker_listen="tcp://127.0.0.1:0")
    await coordinator.start()
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(SECRET)
    try:
        assert coordinator.endpoint is not None
        agent = await ExecutorAgent(coordinator.endpoint, SECRET, str(secret_file),
                                    tmp_path / "executor", slots=2, lease=5.0).start()
    except BaseException:
        await coordinator.close()
        raise
    return coordinator, agent


def test_a_bug_in_a_spawn_releases_the_slot_and_fails_the_query_with_the_reason(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    program = write_program(tmp_path / "job.py", JOB)

    async def main() -> None:
        coordinator, agent = await _running(tmp_path)
        try:
            assert agent.supervisor is not None

            async def spawn(*args: object, **kwargs: object) -> None:
                raise _Bug("injected bug in spawn")

            agent.supervisor.spawn = spawn  # type: ignore[method-assign]
            assert coordinator.endpoint is not None
            async with AsyncCluster(coordinator.endpoint, SECRET, lease=5.0) as cluster:
                query = await cluster.submit_query("job", program.as_uri(),
                                                   start_timeout=600)
                # Reported at once: the query fails with the reason, long before its timeout.
                with pytest.raises(QueryFailedError, match="injected bug in spawn"):
                    await cluster.await_start(query.query_id, timeout=30)
            await wait_for_async(lambda: agent.slots.used == 0, what="the slot back")
            assert agent.counters["bugs"] == 1
        finally:
            await agent.close()
            await coordinator.close()

    with caplog.at_level(logging.ERROR, logger="executor"):
        asyncio.run(main())
    logged = [r for r in caplog.records if r.exc_info and isinstance(r.exc_info[1], _Bug)]
    assert len(logged) == 1, caplog.text  # once, with its traceback


def test_a_bug_in_a_kill_task_is_logged_with_its_traceback_and_counted(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        coordinator, agent = await _running(tmp_path)
        try:
            assert agent.supervisor is not None

            async def kill(*args: object, **kwargs: object) -> None:
                raise _Bug("injected bug in kill")

            agent.supervisor.kill = kill  # type: ignore[method-assign]
            agent._kill(Kill((7, 0)))  # the core's instruction, performed as a task
            await wait_for_async(lambda: agent.counters["bugs"] == 1, what="the bug counted")
        finally:
            await agent.close()
            await coordinator.close()

    with caplog.at_level(logging.ERROR, logger="executor"):
        asyncio.run(main())
    logged = [r for r in caplog.records if r.exc_info and isinstance(r.exc_info[1], _Bug)]
    assert len(logged) == 1, caplog.text
