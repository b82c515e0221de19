"""The fork server as query processes meet it: a forked process is its program's `__main__`
(argv, `__file__`, a traceback that starts in the program), a process whose environment the
zygote cannot give goes through the launcher, and the zygote's death takes its processes
(reported killed) and a new zygote serves the next spawn."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from executor import SpawnSpec, Supervisor
from tests.conftest import wait_for_async
from tests.executor._support import Recorder, alive
from tests.integration.test_executor_processes import SLEEPER_PROGRAM, program

pytestmark = pytest.mark.timeout(120)

MAIN_PROGRAM = """
    import json, os, pickle, sys

    class Point:
        pass

    if __name__ == "__main__":
        print(json.dumps({"argv": sys.argv, "file": __file__, "ppid": os.getppid(),
                          "path0": sys.path[0], "main": sys.modules["__main__"].__file__,
                          "pickled": type(pickle.loads(pickle.dumps(Point()))).__name__}))
        raise ValueError("boom")
"""


def _supervisor(tmp_path: Path, out: Recorder) -> Supervisor:
    return Supervisor(work_root=tmp_path / "data" / "work", sink=out, fork_server=True)


def test_a_forked_process_runs_its_program_as_main(tmp_path):
    prog = program(tmp_path, MAIN_PROGRAM)

    async def go():
        out = Recorder()
        sup = _supervisor(tmp_path, out)
        await sup.start(wait=True)
        run_ = await sup.spawn(SpawnSpec(query_id=1, process=0, args=("a", "b")), prog)
        report = await run_.wait()
        zygote = sup.forks.pid
        await sup.close()
        return out, report, zygote

    out, report, zygote = run(go())
    (seen,) = out.json_lines()
    entry = str(prog / "job.py")
    assert seen == {"argv": [entry, "a", "b"], "file": entry, "ppid": zygote,
                    "path0": str(prog), "main": entry, "pickled": "Point"}
    assert report.exit_code == 1
    errors = out.texts("stderr")
    assert errors[0] == "Traceback (most recent call last):"
    assert errors[1].startswith(f'  File "{entry}"')  # no frame of the fork server's own
    assert errors[-1] == "ValueError: boom"


def test_an_environment_the_zygote_cannot_give_goes_through_the_launcher(tmp_path):
    prog = program(tmp_path, "import json, os\nprint(json.dumps({'ppid': os.getppid(), 'extra': "
                             "os.environ.get('EXTRA')}))\n")

    async def go():
        out = Recorder()
        sup = _supervisor(tmp_path, out)
        await sup.start(wait=True)
        forked = await sup.spawn(SpawnSpec(query_id=2, process=0), prog)
        await forked.wait()
        exec_d = await sup.spawn(SpawnSpec(query_id=2, process=1, env={"EXTRA": "x"}), prog)
        await exec_d.wait()
        zygote = sup.forks.pid
        await sup.close()
        return out, zygote

    out, zygote = run(go())
    first, second = out.json_lines()
    assert first == {"ppid": zygote, "extra": None}
    assert second["ppid"] != zygote and second["extra"] == "x"


def test_when_the_zygote_dies_its_processes_die_and_another_zygote_serves(tmp_path):
    prog = program(tmp_path, SLEEPER_PROGRAM)

    async def go():
        out = Recorder()
        sup = _supervisor(tmp_path, out)
        await sup.start(wait=True)
        first_zygote = sup.forks.pid
        run_ = await sup.spawn(SpawnSpec(query_id=3, process=0), prog)
        await out.wait_for(lambda: "ready" in out.texts("stdout"))
        os.kill(first_zygote, signal.SIGKILL)
        report = await asyncio.wait_for(run_.wait(), 30)
        await wait_for_async(lambda: sup.forks.pid not in (None, first_zygote),
                         what="another zygote")
        again = await sup.spawn(SpawnSpec(query_id=3, process=1), prog)
        await out.wait_for(lambda: out.texts("stdout").count("ready") == 2)
        second_zygote = sup.forks.pid
        await sup.close()
        return run_.pid, report, first_zygote, second_zygote, again.pid

    pid, report, first_zygote, second_zygote, again = run(go())
    assert report.exit_code == -signal.SIGKILL and not report.killed
    assert not alive(pid) and not alive(first_zygote)
    assert second_zygote != first_zygote
    assert not alive(again) and not alive(second_zygote)  # close() stopped both


def run(coro):
    return asyncio.run(coro)


def test_a_forked_process_is_titled_with_its_query(tmp_path):
    """Issue 14, problem 8: `ps` names each query process by query, name and process."""
    prog = program(tmp_path, "print(open('/proc/self/cmdline').read().strip(chr(0)))\n")

    async def go():
        out = Recorder()
        sup = _supervisor(tmp_path, out)
        await sup.start(wait=True)
        forked = await sup.spawn(SpawnSpec(query_id=12, process=1, processes=2,
                                           name="clicks"), prog)
        await forked.wait()
        await sup.close()
        return out

    out = run(go())
    assert out.texts("stdout") == ["tq query 12 clicks 1/2"]


FD_PROGRAM = """
    import atexit, json, os, sys

    target = int(sys.argv[1])  # the zygote's socket's number, free in this process
    opened = []
    while not opened or opened[-1] < target:
        opened.append(os.open(os.devnull, os.O_RDONLY))

    def check():  # after __main__ and the fork server's frames have unwound
        lost = []
        for fd in opened:
            try:
                os.fstat(fd)
            except OSError:
                lost.append(fd)
        print(json.dumps({"target_opened": target in opened, "lost": lost}), flush=True)

    atexit.register(check)
"""


def test_a_forked_process_keeps_the_descriptor_number_the_zygotes_socket_had(tmp_path):
    """The zygote's socket object must not close, at the child's exit, a descriptor the
    child opened under the same number (it closed a query's zmq eventfd: SIGABRT)."""
    prog = program(tmp_path, FD_PROGRAM)

    async def go():
        out = Recorder()
        sup = _supervisor(tmp_path, out)
        await sup.start(wait=True)
        cmdline = Path(f"/proc/{sup.forks.pid}/cmdline").read_bytes().split(b"\0")
        socket_fd = int(cmdline[cmdline.index(next(a for a in cmdline
                                                   if a.endswith(b"_zygote.py"))) + 1])
        forked = await sup.spawn(SpawnSpec(query_id=3, process=0, args=(str(socket_fd),)),
                                 prog)
        report = await forked.wait()
        await sup.close()
        return out, report

    out, report = run(go())
    assert out.json_lines() == [{"target_opened": True, "lost": []}], out.texts("stderr")
    assert report.exit_code == 0
