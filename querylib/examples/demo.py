"""The demo pipeline behind `tq demo`: a cluster, a generator query and a Spark query, watched
from start to end and checked.

    run_demo(DemoOptions(data=Path("tq-data"), events=6000), observer) -> DemoSummary

1. Clears the data dir (only one an earlier demo made: it holds `.tq-demo`) and starts
   `tq up` as a child process with TQ_HOME = the data dir, on its default ports (it takes
   free ones for those that are taken); waits for its cluster.json.
2. Submits `clicks.py` (2 processes): synthetic click events into topic `clicks`.
3. Submits `page_counts.py` (1 process, a PySpark application): clicks per page per window
   into topic `page_counts`, ending once `clicks` has ended and Spark has drained it.
4. Meanwhile follows `clicks` and `page_counts` (querylib subscriptions of the demo's own
   session), the queries' output (the executor's `__logs`) and the catalog, and hands them to
   the observer.
5. Once both queries ended and `page_counts` reached its end of stream, checks that Spark's
   counts equal a count of the clicks made here from the `clicks` topic itself, and that their
   total is the number of events generated; then stops `tq up` (SIGTERM, waited for).

Must not: print (the observer renders), or return with a process of its own still running.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from catalog import Query
from catalog.errors import UserError

__all__ = ["DemoOptions", "DemoSummary", "LiveState", "Observer", "prepare_data_dir",
           "run_demo"]

EXAMPLES = Path(__file__).resolve().parent
MARKER = ".tq-demo"
_SLOTS = 4  # 2 generator processes + the Spark query, and one to spare
_POLL = 0.5  # seconds between looks at the catalog and the topics
_MAX_PROGRAM_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class DemoOptions:
    data: Path
    events: int = 6000
    rate: float = 400.0  # events per wall-clock second (0: as fast as possible)
    per_second: int = 100  # events per second of synthetic event time
    window: int = 1  # seconds of event time per counting window
    timeout: float = 900.0  # the whole demo, seconds
    listen: str | None = None


@dataclass
class LiveState:
    """What the demo knows at one moment, for the observer to show."""

    elapsed: float
    published: int = 0  # clicks read back from the topic so far
    frontier: int | None = None
    clicks_ended: bool = False
    counts: dict[tuple[int, str], int] = field(default_factory=dict)  # (window start, page)
    counts_ended: bool = False
    catalog: dict[str, Any] = field(default_factory=dict)  # collection -> snapshot
    coordinator: str = ""
    catalog_broker: str = ""


@dataclass
class DemoSummary:
    data: Path
    events: int
    clicks_read: int
    counts: dict[tuple[int, str], int]
    expected: dict[tuple[int, str], int]
    queries: list[Query]
    problems: list[str]

    @property
    def counted(self) -> int:
        return sum(self.counts.values())

    @property
    def windows(self) -> int:
        return len({w for w, _ in self.counts})

    @property
    def ok(self) -> bool:
        return not self.problems


class Observer(Protocol):
    def step(self, text: str) -> None: ...
    def log(self, query: str, process: str, line: str) -> None: ...
    def live(self, state: LiveState) -> None: ...


def prepare_data_dir(data: Path) -> str:
    """Make `data` an empty data dir for a demo run; say what was done. Refuses a directory
    the demo did not make, and one a running `tq up` uses."""
    if data.exists() and any(data.iterdir()):
        if not (data / MARKER).exists():
            raise UserError(f"{data} exists and was not made by tq demo; remove it or pass "
                            "--data DIR")
        _refuse_running(data)
        shutil.rmtree(data)
        message = f"cleared {data} (the previous demo run's data)"
    else:
        message = f"data in {data}"
    data.mkdir(parents=True, exist_ok=True)
    (data / MARKER).write_text("made by tq demo: `tq demo` clears this directory\n")
    return message


def _refuse_running(data: Path) -> None:
    try:
        pid = json.loads((data / "cluster.json").read_text()).get("pid")
    except (OSError, ValueError, AttributeError):
        return
    if isinstance(pid, int) and pid > 0:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        except PermissionError:
            pass
        raise UserError(f"a tq cluster (pid {pid}) runs on {data}; stop it first")


class UpProcess:
    """`tq up` as a child process (its own session, so a Ctrl-C reaches only the demo, which
    stops it in order), its output in `<data>/up.log`."""

    def __init__(self, data: Path, listen: str | None) -> None:
        self.data = data
        self.log_path = data / "up.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("TQ_")}
        env["TQ_HOME"] = str(data)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "querylib.cli", "up", "--data", str(data),
                 *(["--listen", listen] if listen else []), "--slots", str(_SLOTS)],
                env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                start_new_session=True)

    def wait_ready(self, timeout: float) -> dict[str, Any]:
        path = self.data / "cluster.json"
        deadline = time.monotonic() + timeout
        while not path.exists():
            if self.proc.poll() is not None:
                raise UserError(f"tq up exited with code {self.proc.returncode}: "
                                f"{self.log_tail()}")
            if time.monotonic() > deadline:
                raise UserError(f"tq up did not start within {timeout:g}s: {self.log_tail()}")
            time.sleep(0.05)
        return json.loads(path.read_text())

    def log_tail(self, lines: int = 5) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no output)"
        return " | ".join(text[-lines:]) or "(no output)"

    def stop(self, timeout: float = 60.0) -> bool:
        """SIGTERM, wait; SIGKILL the whole group if it has not ended by then. True if it
        ended on SIGTERM."""
        if self.proc.poll() is not None:
            return True
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
            return False


def submit(cluster: Any, program: Path, *, processes: int, args: list[str]) -> Query:
    """Upload `program` and run it as a query; returns once its processes registered."""
    from querylib.artifacts import pack_path, sha256_hex

    pack = pack_path(program, max_bytes=_MAX_PROGRAM_BYTES)
    source = cluster.upload_artifact(sha256_hex(pack), pack)
    return cluster.submit_query(program.stem, source, processes=processes, workers=1,
                                args=tuple(args), wait=True, timeout=120.0)


def window_of(event_ms: int, window: int) -> int:
    """The start (ms) of the window of `window` seconds holding `event_ms` (as Spark's)."""
    size = window * 1000
    return event_ms - event_ms % size


class _Watch:
    """The topics and logs the demo follows, polled from the demo's one thread."""

    def __init__(self, ctx: Any, observer: Observer, options: DemoOptions) -> None:
        self.ctx = ctx
        self.observer = observer
        self.window = options.window
        self.clicks: Any = None
        self.page_counts: Any = None
        self.logs: Any = None
        self.names: dict[str, str] = {}  # query id -> name, for log lines
        self.clicks_read = 0
        self.expected: dict[tuple[int, str], int] = {}
        self.state = LiveState(0.0)

    def follow_logs(self, broker: str, secret: bytes) -> None:
        from querylib.broker import Subscriber

        self.logs = Subscriber(broker, "__logs", [0], secret=secret, start="earliest",
                               follow=True)

    def poll(self) -> None:
        from querylib.broker import Data as LogData

        if self.logs is not None:
            while (event := self.logs.next_event(0.01)) is not None:
                if isinstance(event, LogData):
                    for record in event.records:
                        query, _, process = (record.key or b"").decode(errors="replace") \
                            .partition("/")
                        self.observer.log(self.names.get(query, query), process,
                                          (record.value or b"").decode(errors="replace"))
        if self.clicks is not None:
            self._drain(self.clicks, self._on_click, "clicks_ended")
        if self.page_counts is not None:
            self._drain(self.page_counts, self._on_count, "counts_ended")

    def _drain(self, sub: Any, on_record: Callable[[Any], None], ended: str) -> None:
        import querylib

        while (event := sub.next_event(0.01)) is not None:
            if isinstance(event, querylib.Data):
                for record in event.records:
                    on_record(record)
            elif isinstance(event, querylib.Progress) and ended == "clicks_ended":
                self.state.frontier = event.frontier
            elif isinstance(event, querylib.EndOfStream):
                setattr(self.state, ended, True)
                break

    def _on_click(self, click: dict[str, Any]) -> None:
        self.clicks_read += 1
        self.state.published = self.clicks_read
        key = (window_of(int(click["time"]), self.window), str(click["page"]))
        self.expected[key] = self.expected.get(key, 0) + 1

    def _on_count(self, count: dict[str, Any]) -> None:
        # A changelog: the latest record of a (window, page) is its count.
        self.state.counts[(int(count["window_start"]), str(count["page"]))] = int(count["count"])

    def close(self) -> None:
        for sub in (self.clicks, self.page_counts, self.logs):
            if sub is not None:
                sub.close()


def run_demo(options: DemoOptions, observer: Observer) -> DemoSummary:
    """Run the pipeline end to end (see the module docstring); the summary says what was
    checked and what went wrong."""
    import querylib

    data = options.data.resolve()
    observer.step(prepare_data_dir(data))
    # This process's own clients find the demo's cluster, and only it.
    for name in [k for k in os.environ if k.startswith("TQ_")]:
        del os.environ[name]
    os.environ["TQ_HOME"] = str(data)
    began = time.monotonic()
    listen = f" --listen {options.listen}" if options.listen else ""
    observer.step(f"starting the cluster: tq up --data {data}{listen}")
    up = UpProcess(data, options.listen)
    try:
        info = up.wait_ready(60.0)
        observer.step(f"cluster up in {time.monotonic() - began:.1f}s: coordinator "
                      f"{info['coordinator']}, catalog broker {info['catalog_broker']}")
        if info.get("console"):
            observer.step(f"watch it live in a browser: {info['console']} (the dataflow: "
                          f"{info['console']}#/graph)")
        with querylib.connect() as ctx:  # one client session: submits and subscribes
            watch = _Watch(ctx, observer, options)
            try:
                return _pipeline(options, observer, ctx.runtime.cluster, ctx, watch, info,
                                 began, data)
            finally:
                watch.close()
    finally:
        observer.step("stopping the cluster (SIGTERM to tq up)")
        if not up.stop():
            observer.step(f"tq up did not stop on SIGTERM and was killed: {up.log_tail()}")


def _pipeline(options: DemoOptions, observer: Observer, cluster: Any, ctx: Any, watch: _Watch,
              info: dict[str, Any], began: float, data: Path) -> DemoSummary:
    deadline = began + options.timeout
    snaps = cluster.snapshot("executors", "brokers")
    brokers = {b.broker_id: b.address for b, _ in snaps["brokers"].records}
    for executor, _ in snaps["executors"].records:
        watch.follow_logs(brokers[executor.broker_id], cluster.secret)
    generator = submit(cluster, EXAMPLES / "clicks.py", processes=2, args=[
        "--events", str(options.events), "--rate", f"{options.rate:g}",
        "--per-second", str(options.per_second)])
    watch.names[str(generator.query_id)] = "clicks"
    observer.step(f"query {generator.query_id} clicks: 2 processes publish {options.events} "
                  f"click events to topic clicks")
    watch.clicks = ctx.subscribe("clicks", serde="json", timeout=60.0)
    spark = submit(cluster, EXAMPLES / "page_counts.py", processes=1, args=[
        "--window", str(options.window), "--checkpoint", str(data / "spark" / "page_counts")])
    watch.names[str(spark.query_id)] = "page_counts"
    observer.step(f"query {spark.query_id} page_counts: Spark counts clicks per page per "
                  f"{options.window}s window into topic page_counts (Spark takes a while to "
                  "start)")
    watch.page_counts = ctx.subscribe("page_counts", serde="json", timeout=120.0)
    ids = {generator.query_id, spark.query_id}
    ended: dict[int, Query] = {}
    while True:
        watch.poll()
        catalog = cluster.snapshot("sessions", "brokers", "executors", "queries", "topics",
                                   "publications", "subscriptions")
        for query, _ in catalog["queries"].records:
            if query.query_id in ids and query.ended and query.query_id not in ended:
                ended[query.query_id] = query
                observer.step(f"query {query.query_id} {query.name} {query.state.value}")
        watch.state.elapsed = time.monotonic() - began
        watch.state.catalog = catalog
        watch.state.coordinator = info["coordinator"]
        watch.state.catalog_broker = info["catalog_broker"]
        observer.live(watch.state)
        failed = [q for q in ended.values() if q.state.value != "finished"]
        if failed or len(ended) == 2 and watch.state.counts_ended:
            break
        if time.monotonic() > deadline:
            raise UserError(f"the demo did not end within {options.timeout:g}s")
        time.sleep(_POLL)
    watch.poll()  # the last log lines
    return DemoSummary(data=data, events=options.events, clicks_read=watch.clicks_read,
                       counts=dict(watch.state.counts), expected=dict(watch.expected),
                       queries=[ended[i] for i in sorted(ended)],
                       problems=_problems(options, watch, ended))


def _problems(options: DemoOptions, watch: _Watch, ended: dict[int, Query]) -> list[str]:
    problems = [f"query {q.query_id} {q.name} {q.state.value}: {q.reason or q.exit_codes}"
                for q in ended.values() if q.state.value != "finished"]
    if problems:
        return problems
    if watch.clicks_read != options.events:
        problems.append(f"topic clicks holds {watch.clicks_read} events; the generator was "
                        f"asked for {options.events}")
    counted = sum(watch.state.counts.values())
    if counted != options.events:
        problems.append(f"Spark counted {counted} clicks; {options.events} were generated")
    if watch.state.counts != watch.expected:
        wrong = sorted(set(watch.state.counts.items()) ^ set(watch.expected.items()))[:3]
        problems.append(f"Spark's counts differ from a count of topic clicks, e.g. {wrong}")
    return problems
