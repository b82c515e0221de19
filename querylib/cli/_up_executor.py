"""`tq up`'s executor agent, in a child process of its own (DESIGN §1, §9 "Starting"): its
broker, Kafka listener, connector endpoint and query processes never share an event loop (or a
core) with the coordinator, so a flood of data does not delay control, and the reverse.

`ExecutorChild.start` runs `tq executor` (querylib/cli/_executor.py) with tq up's options and
the hidden ones of a child: `--parent-pid` (the kernel SIGKILLs it when tq up dies, however
it dies; its query processes follow it, as they follow any executor), `--ready-fd` (once
registered it writes there what opened: executor id, broker, connector, Kafka and metrics
addresses, the ports that moved or were skipped) and tq up's rules for taken ports. It
returns once the child is ready; a child that exits before is
executor.ExecutorExitedError (it said why on stderr, which it shares with tq up).

`ended` resolves with tq up's exit code (1) when the child exits on its own (a crash, the OOM
killer): tq up says so and stops, rather than starting another. A restart would hide a crash
loop, come back as a new executor session all the same (its queries fail with the old one),
and restart policy belongs to whoever supervises tq up (systemd, a container runtime).
`close` SIGTERMs it (it kills its queries and reports their exits while the coordinator still
runs), SIGKILL after a deadline.

`ChildMetrics` brings the child's /metrics into the console's: its families merged by name
with tq up's own, its process_* and tq_log_messages labelled process="executor", and the end
offsets of its partitions kept for the consumer groups' lag (coordinator_metrics `ends`).

Must not: start the child from any thread but the loop's (the death signal is tied to the
thread that forked it), or read the child's metrics on the loop (the console's thread does).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from dataclasses import dataclass, field
from typing import Any

from executor import exit_text, start_ready_child
from querylib.server import RemoteMetrics

__all__ = ["ChildMetrics", "ExecutorChild", "ExecutorReady", "child_args", "options_argv"]

_STOP_DEADLINE = 30.0  # seconds past the grace period a SIGTERMed child has before SIGKILL


@dataclass(frozen=True)
class ExecutorReady:
    """What the child reports once registered (querylib/cli/_executor.py `_report_ready`)."""

    pid: int
    executor_id: int
    host: str
    broker: str
    broker_id: int
    slots: int
    connector: str
    kafka: str
    metrics: str
    moved: dict[str, int] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    shards: list[int] = field(default_factory=list)  # broker ids of its other brokers


def child_args(args: argparse.Namespace, coordinator: str, secret_file: str, data: str,
               fallback: list[str], coordinator_key: str = "") -> list[str]:
    """The `tq executor` command line of tq up's child: tq up's own connector and Kafka
    options as given (a parser of just those names them), and where and who it is."""
    from querylib.cli._broker import add_connector_options, add_kafka_options

    options = argparse.ArgumentParser(add_help=False)
    add_connector_options(options, default_port=None)
    add_kafka_options(options, default_port=None)
    argv = ["--coordinator", coordinator, "--credentials", secret_file, "--data", data,
            "--grace", str(args.grace), "--metrics-port", "0", "--endpoints-optional",
            "--endpoint-fallback", ",".join(fallback)]
    if coordinator_key:  # a CURVE coordinator (it listens beyond loopback)
        argv += ["--coordinator-key", coordinator_key]
    if args.slots is not None:
        argv += ["--slots", str(args.slots)]
    if getattr(args, "brokers", None) is not None:
        argv += ["--brokers", str(args.brokers)]
    if args.verbose:
        argv.append("--verbose")
    if getattr(args, "advertise", None):  # reachable from other hosts (DESIGN §6)
        argv += ["--advertise", args.advertise, "--broker-listen", "tcp://0.0.0.0:0"]
    return argv + options_argv(args, options)


def options_argv(args: argparse.Namespace, options: argparse.ArgumentParser) -> list[str]:
    """The command line that gives `options` (a parser's) the values they have in `args`."""
    argv: list[str] = []
    for action in options._actions:
        value = getattr(args, action.dest, None)
        flag = action.option_strings[0] if action.option_strings else None
        if flag is None or value is None:
            continue
        if isinstance(action, argparse.BooleanOptionalAction):
            argv.append(flag if value else f"--no-{flag[2:]}")
        elif isinstance(action, argparse._StoreTrueAction):
            if value:
                argv.append(flag)
        else:
            argv += [flag, str(value)]
    return argv


class ExecutorChild:
    """tq up's executor agent in a child process (see the module docstring)."""

    def __init__(self, argv: list[str], grace: float) -> None:
        self.argv = argv
        self.grace = grace
        self.proc: asyncio.subprocess.Process | None = None
        self.ready: ExecutorReady | None = None
        self.ended: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._stopping = False
        self._watch: asyncio.Task[None] | None = None

    async def start(self) -> ExecutorChild:
        # The child's death signal fires when the thread that started it dies: the loop's,
        # which lives as long as tq up.
        self.proc, fields = await start_ready_child(self.argv, "tq up's executor")
        try:
            self.ready = ExecutorReady(**fields)
        except BaseException:
            await self.close()
            raise
        self._watch = asyncio.get_running_loop().create_task(self._watch_exit(),
                                                             name="executor child")
        return self

    async def _watch_exit(self) -> None:
        assert self.proc is not None
        code = await self.proc.wait()
        if self._stopping:
            return
        print(f"tq up: the executor (pid {self.proc.pid}) {exit_text(code)}; stopping (its "
              f"queries died with it)", file=sys.stderr, flush=True)
        if not self.ended.done():
            self.ended.set_result(1)

    async def close(self) -> None:
        """SIGTERM, then wait: it kills its queries and reports their exits first."""
        self._stopping = True
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), self.grace + _STOP_DEADLINE)
        except TimeoutError:
            print(f"tq up: the executor (pid {proc.pid}) did not stop within "
                  f"{self.grace + _STOP_DEADLINE:g}s; killing it", file=sys.stderr, flush=True)
            proc.kill()
            await proc.wait()
        if self._watch is not None:
            await self._watch


class ChildMetrics(RemoteMetrics):
    """The child's /metrics (its shards' merged in), scraped when tq up's are (on the
    console's thread); the partitions' end offsets it names are kept for the coordinator's
    families."""

    def __init__(self, url: str, timeout: float = 5.0) -> None:
        super().__init__(url, "executor", timeout)
        self.ends: dict[tuple[str, int], int] = {}  # (topic, partition) -> end offset

    def families(self) -> list[Any]:
        families = super().families()
        ends = {}
        for family in families:
            if family.name == "tq_partition_end_offset":
                for sample in family.samples:
                    ends[(sample.labels["topic"], int(sample.labels["partition"]))] = \
                        int(sample.value)
        self.ends = ends
        return families
