"""Query processes started and supervised for real: the TQ_* environment as the child sees it,
fresh work directories, closed stdin, output line by line, exit codes, killing process groups
(with grandchildren that ignore SIGTERM), exec failures, and the psutil load of a process."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import msgspec
import psutil
import pytest

import executor._supervisor as _supervisor_module
from executor import (
    ArtifactCache,
    ExecFailedError,
    ExecutorError,
    HostLoad,
    LoadSampler,
    ProcessExistsError,
    SpawnSpec,
    Supervisor,
    UnknownProcessError,
    host_resources,
    pack_path,
)
from tests.conftest import wait_for, wait_for_async
from tests.executor._support import Recorder, alive, write_program

ENV_PROGRAM = """
    import json, os, sys
    null = os.stat("/dev/null")
    stdin = os.fstat(0)
    print(json.dumps({
        "env": {k: v for k, v in os.environ.items()
                if k.startswith("TQ_") or k == "PYTHONUNBUFFERED"},
        "cwd": os.getcwd(), "listing": sorted(os.listdir(".")), "argv": sys.argv[1:],
        "stdin_is_devnull": (stdin.st_rdev, stdin.st_ino) == (null.st_rdev, null.st_ino),
        "stdin": sys.stdin.read(), "pid": os.getpid(), "pgid": os.getpgid(0),
        "sid": os.getsid(0), "ppid": os.getppid(), "executable": sys.executable}))
    open("written-here", "w").close()
"""

OUTPUT_PROGRAM = """
    import sys
    for i in range(300):
        print(f"out {i}")
        if i % 100 == 0:
            print(f"err {i}", file=sys.stderr)
    sys.stdout.write("x" * 200000 + "\\n")
    sys.stderr.write("ünïcödé line\\r\\n")
    sys.stdout.write("no newline at the end")
    sys.exit(3)
"""

STUBBORN_PROGRAM = """
    import json, os, signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen(
        [sys.executable, "-c", "import signal, time\\n"
         "signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
         "print('ready', flush=True)\\n"
         "while True: time.sleep(1)"], stdout=subprocess.PIPE, text=True)
    child.stdout.readline()
    print(json.dumps({"pid": os.getpid(), "grandchild": child.pid}), flush=True)
    while True:
        time.sleep(1)
"""

LEAVES_A_CHILD_PROGRAM = """
    import json, subprocess, sys
    child = subprocess.Popen([sys.executable, "-c", "import time\\nwhile True: time.sleep(1)"])
    print(json.dumps({"grandchild": child.pid}), flush=True)
"""

SLEEPER_PROGRAM = """
    import time
    print("ready", flush=True)
    time.sleep(120)
"""


def program(tmp_path: Path, source: str, name: str = "job.py") -> Path:
    """Install `source` through the artifact cache, as the agent will; returns program/."""
    src = write_program(tmp_path / "src" / name, source)
    cache = ArtifactCache(tmp_path / "data" / "artifacts")
    artifact = cache.install(pack_path(src, max_bytes=1 << 20))
    src.unlink()
    return artifact.program


_FORK_SERVER = {"enabled": True}


@pytest.fixture(autouse=True, params=["forked", "exec"])
def start_mode(request, monkeypatch):
    """Every test twice: processes forked by the fork server, and exec'ed by the launcher."""
    monkeypatch.setitem(_FORK_SERVER, "enabled", request.param == "forked")
    return request.param


def supervisor(tmp_path: Path, sink, **kwargs) -> Supervisor:
    return Supervisor(work_root=tmp_path / "data" / "work", sink=sink,
                      fork_server=_FORK_SERVER["enabled"], **kwargs)


def run(coro):
    return asyncio.run(coro)


def test_the_child_sees_its_environment_a_fresh_work_dir_and_no_stdin(tmp_path, start_mode):
    prog = program(tmp_path, ENV_PROGRAM)
    spec = SpawnSpec(query_id=12, process=1, processes=2, workers=3,
                     coordinator="tcp://127.0.0.1:7400", peers=("tcp://a:1", "tcp://b:2"),
                     credentials="/tmp/credential.json", broker="tcp://127.0.0.1:7500",
                     executor_id=5, name="clicks",
                     args=("--flag", "value with spaces"))

    async def go():
        out = Recorder()
        sup = supervisor(tmp_path, out, base_env={**os.environ, "TQ_COORDINATOR": "stale",
                                                  "TQ_HOME": "/the/executor/home"})
        first = await sup.spawn(spec, prog)
        report = await first.wait()
        second = await sup.spawn(spec, prog)  # the same process again: a new work directory
        await second.wait()
        forks = sup.forks.pid if sup.forks else None
        await sup.close()
        return out, first, second, report, forks

    out, first, second, report, forks = run(go())
    seen, again = out.json_lines()
    assert report.exit_code == 0 and not report.killed
    assert seen["env"] == {
        "TQ_QUERY_ID": "12", "TQ_QUERY_NAME": "clicks", "TQ_PROCESS_INDEX": "1",
        "TQ_PROCESS_COUNT": "2", "TQ_WORKERS": "3", "TQ_COORDINATOR": "tcp://127.0.0.1:7400",
        "TQ_PEERS": "tcp://a:1,tcp://b:2", "TQ_CREDENTIALS": "/tmp/credential.json",
        "TQ_HOME": "/the/executor/home",  # the one TQ_* variable of the executor's kept
        "TQ_BROKER": "tcp://127.0.0.1:7500", "TQ_EXECUTOR_ID": "5",
        "TQ_WORK_DIR": str(first.launched.work_dir),
        "TQ_FAILURE_FILE": str(first.launched.work_dir / ".tq-failure"),
        "PYTHONUNBUFFERED": "1"}
    assert seen["argv"] == ["--flag", "value with spaces"]
    assert Path(seen["cwd"]) == first.launched.work_dir == tmp_path / "data/work/12-1-0"
    assert seen["listing"] == [] and again["listing"] == []
    assert Path(again["cwd"]) == second.launched.work_dir == tmp_path / "data/work/12-1-1"
    assert (first.launched.work_dir / "written-here").exists()
    assert seen["stdin_is_devnull"] and seen["stdin"] == ""
    # forked by the fork server, or exec'ed through the launcher (same pid): either way the
    # leader of its own session and group
    assert seen["pid"] == seen["pgid"] == seen["sid"] == first.pid == report.pid
    assert (seen["ppid"] == forks) == (start_mode == "forked")
    assert os.path.realpath(seen["executable"]) == os.path.realpath(sys.executable)


FAILING_PROGRAM = """
    import json
    import helper

    def main():
        helper.parse("not json")

    main()
"""

HELPER = """
import json

def parse(text):
    return json.loads(text)
"""


@pytest.mark.parametrize("source, reason", [
    (FAILING_PROGRAM, "JSONDecodeError: Expecting value: line 1 column 1 (char 0) "
                      "(at helper.py:5 in parse)"),
    ("def broken(:\n    pass\n", "SyntaxError: invalid syntax (at job.py:1)"),
    ("import sys\nsys.exit(3)\n", ""),
    ("import sys\nsys.exit('no input given:\\n  pass a file')\n",
     "no input given: pass a file"),
], ids=["exception", "syntax-error", "exit-code", "exit-message"])
def test_a_failure_says_why_in_one_line_and_tracebacks_leave_tq_out(tmp_path, source, reason):
    src = write_program(tmp_path / "src" / "job.py", source)
    (src.parent / "helper.py").write_text(HELPER)
    cache = ArtifactCache(tmp_path / "data" / "artifacts")
    prog = cache.install(pack_path(src.parent, max_bytes=1 << 20)).program
    spec = SpawnSpec(query_id=1, process=0, entry="job.py")

    async def go():
        out = Recorder()
        sup = supervisor(tmp_path, out)
        await sup.spawn(spec, prog)
        report = await sup.wait(spec.key)
        await sup.close()
        return out, report

    out, report = run(go())
    assert report.exit_code == (3 if not reason else 1)  # (sys.exit("...") exits 1)
    assert report.failure == reason
    errors = out.texts("stderr")
    assert not any("/executor/" in line or "/querylib/" in line for line in errors), errors
    if reason.startswith("JSON"):
        assert errors[0] == "Traceback (most recent call last):"
        assert errors[1].startswith('  File "') and errors[1].endswith('job.py", line 8, '
                                                                      'in <module>')
        assert errors[-1].startswith("json.decoder.JSONDecodeError: Expecting value")
    elif reason.startswith("SyntaxError"):
        assert errors[-1] == "SyntaxError: invalid syntax"
    elif reason:
        assert errors == ["no input given:", "  pass a file"]  # as Python prints it


def test_output_arrives_line_by_line_in_order_with_long_lines_cut(tmp_path):
    prog = program(tmp_path, OUTPUT_PROGRAM)
    spec = SpawnSpec(query_id=1, process=0)

    async def go():
        out = Recorder()
        sup = supervisor(tmp_path, out)
        await sup.spawn(spec, prog)
        report = await sup.wait(spec.key)
        await sup.close()
        return out, report

    out, report = run(go())
    assert report.exit_code == 3 and not report.killed
    stdout = [line for line in out.lines if line.stream == "stdout"]
    assert [line.text for line in stdout[:300]] == [f"out {i}" for i in range(300)]
    long_pieces = stdout[300:304]
    assert [len(p.text) for p in long_pieces] == [65536, 65536, 65536, 200000 - 3 * 65536]
    assert [p.continues for p in long_pieces] == [True, True, True, False]
    assert stdout[304].text == "no newline at the end" and not stdout[304].continues
    assert len(stdout) == 305
    assert out.texts("stderr") == ["err 0", "err 100", "err 200", "ünïcödé line"]
    assert {(line.query_id, line.process) for line in out.lines} == {(1, 0)}
    assert all(line.timestamp_ms > 0 for line in out.lines)


def test_exit_by_signal_is_a_negative_code(tmp_path):
    prog = program(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")

    async def go():
        sup = supervisor(tmp_path, Recorder())
        await sup.spawn(SpawnSpec(query_id=2, process=0), prog)
        report = await sup.wait((2, 0))
        await sup.close()
        return report

    report = run(go())
    assert report.exit_code == -signal.SIGKILL and not report.killed


def test_kill_escalates_to_sigkill_for_a_group_that_ignores_sigterm(tmp_path):
    prog = program(tmp_path, STUBBORN_PROGRAM)
    spec = SpawnSpec(query_id=3, process=0)

    async def go():
        out = Recorder()
        sup = supervisor(tmp_path, out)
        run_ = await sup.spawn(spec, prog)
        (pids,) = await out.wait_for(out.json_lines, what="the pids")
        assert alive(pids["pid"]) and alive(pids["grandchild"])
        assert os.getpgid(pids["grandchild"]) == run_.pid
        report = await sup.kill(spec.key, grace=0.3)
        await wait_for_async(lambda: not alive(pids["grandchild"]), what="the grandchild to die")
        assert sup.running() == []
        await sup.close()
        return pids, report

    pids, report = run(go())
    assert report.exit_code == -signal.SIGKILL and report.killed
    assert not alive(pids["pid"]) and not alive(pids["grandchild"])


def test_kill_of_a_cooperative_process_is_sigterm(tmp_path):
    prog = program(tmp_path, SLEEPER_PROGRAM)

    async def go():
        out = Recorder()
        sup = supervisor(tmp_path, out, grace=30.0)
        await sup.spawn(SpawnSpec(query_id=4, process=0), prog)
        await out.wait_for(lambda: "ready" in out.texts("stdout"))
        report = await sup.kill((4, 0))
        with pytest.raises(UnknownProcessError):
            await sup.kill((4, 0))
        await sup.close()
        return report

    report = run(go())
    assert report.exit_code == -signal.SIGTERM and report.killed


def test_nothing_the_main_process_started_outlives_it(tmp_path):
    prog = program(tmp_path, LEAVES_A_CHILD_PROGRAM)

    async def go():
        out = Recorder()
        sup = supervisor(tmp_path, out)
        await sup.spawn(SpawnSpec(query_id=5, process=0), prog)
        report = await sup.wait((5, 0))
        await sup.close()
        return out, report

    out, report = run(go())
    (pids,) = out.json_lines()
    assert report.exit_code == 0 and not report.killed
    assert not alive(pids["grandchild"])


def test_exec_failures_carry_the_reason_and_leave_nothing_running(tmp_path):
    prog = program(tmp_path, "print('never')\n")
    not_executable = tmp_path / "python-without-x"
    not_executable.write_text("")

    async def go():
        reports = []

        async def on_exit(report):
            reports.append(report)

        sup = supervisor(tmp_path, Recorder(), on_exit=on_exit,
                         python=str(tmp_path / "no" / "python3"))
        with pytest.raises(ExecFailedError) as missing:
            await sup.spawn(SpawnSpec(query_id=6, process=0), prog)
        sup.python = str(not_executable)
        with pytest.raises(ExecFailedError) as denied:
            await sup.spawn(SpawnSpec(query_id=6, process=0), prog)
        sup.python = None
        with pytest.raises(ExecFailedError) as no_entry:
            await sup.spawn(SpawnSpec(query_id=6, process=0, entry="other.py"), prog)
        assert sup.running() == [] and reports == []
        await sup.spawn(SpawnSpec(query_id=6, process=0), prog)  # the key is free again
        report = await sup.wait((6, 0))
        await sup.close()
        return missing.value, denied.value, no_entry.value, report

    missing, denied, no_entry, report = run(go())
    assert "No such file" in missing.reason
    assert "Permission denied" in denied.reason
    assert no_entry.reason == "no such entry"
    assert report.exit_code == 0


def test_duplicates_are_refused_and_close_kills_everything(tmp_path):
    prog = program(tmp_path, SLEEPER_PROGRAM)

    async def go():
        out = Recorder()
        reports = []

        async def on_exit(report):
            reports.append(report)

        sup = supervisor(tmp_path, out, on_exit=on_exit, grace=10.0)
        a = await sup.spawn(SpawnSpec(query_id=7, process=0), prog)
        b = await sup.spawn(SpawnSpec(query_id=7, process=1), prog)
        with pytest.raises(ProcessExistsError):
            await sup.spawn(SpawnSpec(query_id=7, process=0), prog)
        await out.wait_for(lambda: out.texts("stdout").count("ready") == 2)
        await sup.close()
        with pytest.raises(ExecutorError, match="shutting down"):
            await sup.spawn(SpawnSpec(query_id=7, process=2), prog)
        return a.pid, b.pid, reports, sup

    a, b, reports, sup = run(go())
    assert sorted((r.process, r.exit_code, r.killed) for r in reports) == [
        (0, -signal.SIGTERM, True), (1, -signal.SIGTERM, True)]
    assert sup.running() == [] and not alive(a) and not alive(b)


def test_a_failing_sink_never_wedges_the_process(tmp_path):
    prog = program(tmp_path, "import sys\nfor i in range(20000):\n    print('x' * 50)\n"
                             "print('e' * 100000, file=sys.stderr)\n")

    async def go():
        async def broken(line):
            raise RuntimeError("sink bug")

        sup = supervisor(tmp_path, broken)
        await sup.spawn(SpawnSpec(query_id=8, process=0), prog)
        report = await sup.wait((8, 0))
        await sup.close()
        return report, sup.counters

    report, counters = run(go())
    assert report.exit_code == 0
    assert counters["sink_failures"] == 2  # once per stream, then it drains quietly


def test_load_of_a_process_counts_its_descendants(tmp_path):
    prog = program(tmp_path, STUBBORN_PROGRAM)
    data = tmp_path / "data"

    async def go():
        out = Recorder()
        sup = supervisor(tmp_path, out)
        run_ = await sup.spawn(SpawnSpec(query_id=9, process=2), prog)
        await out.wait_for(out.json_lines, what="the pids")
        sampler = LoadSampler(data)
        sampler.sample([(9, 2, run_.pid)])
        load = sampler.sample([(9, 2, run_.pid), (9, 3, 2 ** 22 + 1)])  # one pid is gone
        await sup.close(grace=0.2)
        return load

    load = run(go())
    resources = host_resources(data, slots=4)
    assert resources.cores >= 1 and resources.memory > 0 and resources.disk > 0
    assert resources.slots == 4
    assert load.running == 1
    (proc,) = load.per_process
    assert (proc.query_id, proc.process, proc.processes) == (9, 2, 2)
    assert proc.rss > 0 and proc.cpu_percent >= 0.0
    assert load.memory_used > 0 and load.memory_available > 0 and load.disk_free > 0
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(load), type=HostLoad) == load


ESCAPES_THE_GROUP_PROGRAM = """
    import json, subprocess, sys
    child = subprocess.Popen([sys.executable, "-c", "import time\\nwhile True: time.sleep(1)"],
                             start_new_session=True)  # leaves the group, keeps our stdout
    print(json.dumps({"escaped": child.pid}), flush=True)
"""


def test_output_held_open_by_an_escaped_process_is_abandoned_after_the_drain_timeout(tmp_path):
    # The documented limit: killpg cannot reach a process that left the group with setsid.
    # The exit is still reported (after drain_timeout), and the pipes are let go.
    prog = program(tmp_path, ESCAPES_THE_GROUP_PROGRAM)
    escaped: list[int] = []

    async def go():
        out = Recorder()
        sup = supervisor(tmp_path, out, drain_timeout=0.3)
        started = await sup.spawn(SpawnSpec(query_id=10, process=0), prog)
        (pids,) = await out.wait_for(out.json_lines, what="the escaped pid")
        escaped.append(pids["escaped"])
        report = await started.wait()
        await sup.close()
        return report, sup.counters

    try:
        report, counters = run(go())
    finally:
        for pid in escaped:
            os.kill(pid, signal.SIGKILL)
    assert report.exit_code == 0
    assert counters["undrained"] == 1


def test_a_process_still_starting_when_close_runs_does_not_survive_it(tmp_path, monkeypatch):
    prog = program(tmp_path, SLEEPER_PROGRAM)
    real_launch = _supervisor_module.launch

    async def go():
        entered = asyncio.Event()

        async def launch(*args, **kwargs):
            entered.set()  # close() runs at the launch's first await, mid-start
            return await real_launch(*args, **kwargs)

        monkeypatch.setattr(_supervisor_module, "launch", launch)
        out = Recorder()
        sup = supervisor(tmp_path, out)
        spec = SpawnSpec(query_id=11, process=0)
        starting = asyncio.create_task(sup.spawn(spec, prog))
        await asyncio.wait_for(entered.wait(), 20)
        assert spec.key in sup._starting
        await sup.close()
        with pytest.raises(ExecutorError, match="shutting down"):
            await starting
        return sup

    sup = run(go())
    assert sup.running() == []
    work_dir = str(tmp_path / "data" / "work" / "11-0-0")

    def survivors() -> list[int]:
        return [p.pid for p in psutil.process_iter(["cwd", "status"])
                if p.info["cwd"] == work_dir and p.info["status"] != psutil.STATUS_ZOMBIE]

    # A child the fork server forked but had not reported yet dies by its death signal when
    # close() stops the zygote: the kernel delivers it a moment later, never not at all.
    wait_for(lambda: not survivors(), timeout=10, what="the half-started process to die")
