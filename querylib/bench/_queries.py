"""Queries on `tq up`, end to end: `python -m querylib.bench queries` (`scripts/bench queries`).

Rows (each {"name", "figures", "baseline", "ratio", "goal"}):
- queries_submit_to_running: a 4-process query (one worker each) of a function that returns
  at once, submitted with `querylib.submit` to a `tq up` with 4 slots; the time from the
  submit request until its reply says every process registered (the query runs): spawning,
  interpreter start, `import querylib`, the session and the registration barrier. Median and
  spread of a few runs; the upload (`submit` with the pickling and packing) is reported beside.
  Goal: median <= 1 s.
- queries_pubsub_throughput: a publisher query sends 2M 100-byte records (serde `bytes`, 1000
  records per `send` and logical time, PerWorker; the publisher batches up to
  `publisher_batch_records` of them, where the pubsub rows send 1000-record batches) to a
  subscriber query on the same `tq up`; the subscriber counts records from its first Data
  event to the last. Three rounds, each the broker-level figures then the query path; the row
  is the round with the median ratio, and lists every round. Baseline: the broker-level
  figures of `python -m querylib.bench pubsub` measured in the same run: its headline figure,
  pre-built batches (`pubsub_throughput`: the transport and broker alone, the ratio's
  baseline), and the record API on both ends (`pubsub_throughput_codec`: per-record
  Producer.send and decoding, shown beside as `ratio_to_record_api`), and the run-at-a-time
  paths a query's publisher and subscriber use, without the query around them
  (`pubsub_throughput_values`, shown as `ratio_to_values_path`). Goal: >= 0.8x the
  broker-level figure.
- queries_console_cost: the same query path on a `tq up` with its console open in a headless
  chromium on the dataflow graph (live: server-sent events and redraws while the records
  flow), against a `tq up` without a console and no browser, rounds alternated; the ratio of
  medians. The browser is started for each "with" round and its start-up and the page's are
  not counted (it waits until the browser is quiet). Beside it, less exposed to a shared
  machine's noise, the CPU both sides spent per million records: `tq up`'s own processes
  (coordinator, brokers and, on one side, the console; its executor child included, not the
  queries) and the browser's processes. Skipped, saying why, without chromium or Playwright.
  Goal: >= 0.97x.

All processes share this machine's cores; nothing here asserts the numbers.
Must not: leave a `tq up` or its processes behind (everything started is stopped).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

RECORD_BYTES = 100
BATCH_RECORDS = 1000


def _idle(ctx: Any) -> None:
    """The submitted function of the latency runs: registering is all it does."""


def _publish(ctx: Any, topic: str, records: int) -> None:
    value = bytes(RECORD_BYTES)
    batch = [value] * BATCH_RECORDS
    with ctx.publish(topic, serde="bytes") as out:
        for t in range(records // BATCH_RECORDS):
            out.send(t, batch)
        out.advance_to(records // BATCH_RECORDS)


def _count(ctx: Any, topic: str, records: int, result: str) -> None:
    import querylib

    seen, first = 0, None
    with ctx.subscribe(topic, serde="bytes", timeout=120) as sub:
        for event in sub:
            if isinstance(event, querylib.Data):
                first = first or time.perf_counter()
                seen += len(event.records)
                if seen >= records:
                    break
    elapsed = time.perf_counter() - (first or time.perf_counter())
    Path(result).write_text(json.dumps({"records": seen, "seconds": elapsed}))


class _Up:
    """`tq up` in a temporary TQ_HOME, stopped (and its folder removed) on close."""

    def __init__(self, slots: int, console: bool = False, brokers: int = 1) -> None:
        self.home = Path(tempfile.mkdtemp(prefix="tq-bench-queries-"))
        env = dict(os.environ, TQ_HOME=str(self.home))
        env.pop("TQ_COORDINATOR", None)
        self.log = self.home / "up.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                # Any free ports (the chosen ones are in cluster.json); no connector or Kafka
                # endpoint: their default ports may be held by another `tq up` of this host.
                [sys.executable, "-m", "querylib.cli", "up", "--data", str(self.home / "data"),
                 "--listen", "tcp://127.0.0.1:0", "--slots", str(slots),
                 "--connector-port", "-1", "--kafka-port", "-1",
                 "--console-port", "0" if console else "-1", "--brokers", str(brokers)],
                env=env, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
        deadline = time.monotonic() + 120
        info = self.home / "cluster.json"
        while not info.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                said = self.log.read_text(errors="replace")[-2000:]
                self.close()
                raise RuntimeError(f"tq up did not start; it said:\n{said}")
            time.sleep(0.05)
        found = json.loads(info.read_text())
        self.coordinator, self.secret_file = found["coordinator"], found["secret_file"]
        self.console = found.get("console", "")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        shutil.rmtree(self.home, ignore_errors=True)


def submit_to_running(up: _Up, runs: int = 5, processes: int = 4) -> dict[str, Any]:
    from querylib import submit
    from querylib.api._submit import build_program
    from querylib.artifacts import sha256_hex
    from querylib.cluster import Cluster, wait_for_query_end

    with Cluster.connect(up.coordinator, secret_file=up.secret_file) as cluster:
        pack = build_program(_idle)
        source = cluster.upload_artifact(sha256_hex(pack), pack)
        seconds = []
        for _ in range(runs):
            started = time.perf_counter()
            query = cluster.submit_query("idle", source, processes=processes, wait=True,
                                         timeout=120)
            seconds.append(time.perf_counter() - started)
            wait_for_query_end(cluster, query.query_id, timeout=120)
        started = time.perf_counter()
        handle = submit(_idle, processes=processes, cluster=cluster)
        with_upload = time.perf_counter() - started
        handle.wait(timeout=120)
    median = statistics.median(seconds)
    return {
        "name": "queries_submit_to_running",
        "figures": {"processes": processes, "runs": runs, "median_s": round(median, 3),
                    "min_s": round(min(seconds), 3), "max_s": round(max(seconds), 3),
                    "submit_with_upload_s": round(with_upload, 3)},
        "baseline": None,
        "ratio": None,
        "goal": "median <= 1 s",
    }


def query_throughput(up: _Up, records: int) -> dict[str, Any]:
    from querylib import submit
    from querylib.cluster import Cluster

    result = up.home / "count.json"
    topic = f"bench-{time.time_ns()}"  # a fresh topic per run: an ended stream stays ended
    with Cluster.connect(up.coordinator, secret_file=up.secret_file) as cluster:
        reader = submit(_count, args=(topic, records, str(result)), cluster=cluster,
                        name="count")
        writer = submit(_publish, args=(topic, records), cluster=cluster, name="publish")
        ends = [writer.wait(timeout=600), reader.wait(timeout=600)]
    if any(q.state.value != "finished" for q in ends):
        raise RuntimeError(f"a benchmark query did not finish: {ends}")
    counted = json.loads(result.read_text())
    seconds = max(counted["seconds"], 1e-9)
    return {"records": counted["records"], "records_per_s": counted["records"] / seconds}


def _publisher_batch_records() -> int:
    from querylib.api._publisher import _BATCH_RECORDS

    return _BATCH_RECORDS


def run(records: int = 2_000_000, rounds: int = 3) -> Iterator[dict[str, Any]]:
    """The rows; the throughput row is the median of `rounds` rounds, each measuring the
    broker-level figures and then the query path back to back (on a shared 2-core machine one
    round's ratio moves by +-0.2, more than the goal's margin)."""
    from querylib.bench import _pubsub

    up = _Up(slots=4)
    try:
        latency = submit_to_running(up)
        latency["figures"]["load_avg_1m"] = round(os.getloadavg()[0], 2)
        yield latency
        measured = []
        for _ in range(rounds):
            broker = {row["name"]: row["figures"]["records_per_s"]
                      for row in _pubsub.throughput(batches=records // BATCH_RECORDS * 2)}
            measured.append((broker, query_throughput(up, records)["records_per_s"]))
    finally:
        up.close()
    broker, through = sorted(measured, key=lambda m: m[1] / m[0]["pubsub_throughput"])[
        rounds // 2]  # the round with the median ratio
    codec, headline = broker["pubsub_throughput_codec"], broker["pubsub_throughput"]
    values = broker["pubsub_throughput_values"]
    yield {
        "name": "queries_pubsub_throughput",
        "figures": {"records_per_s": round(through),
                    "records": records, "record_bytes": RECORD_BYTES,
                    "records_per_send": BATCH_RECORDS,
                    "publisher_batch_records": _publisher_batch_records(), "serde": "bytes",
                    "load_avg_1m": round(os.getloadavg()[0], 2),
                    "rounds": [{"records_per_s": round(t), "headline": b["pubsub_throughput"],
                                "ratio": round(t / b["pubsub_throughput"], 3)}
                               for b, t in measured],
                    "ratio_to_record_api": round(through / codec, 3),
                    "ratio_to_values_path": round(through / values, 3)},
        "baseline": {"pubsub_throughput_records_per_s": headline,
                     "pubsub_throughput_codec_records_per_s": codec,
                     "pubsub_throughput_values_records_per_s": values},
        "ratio": round(through / headline, 3),
        "goal": ">= 0.8x the broker-level figure (pubsub_throughput)",
    }
    # Longer streams and more rounds than the rows above: the difference sought is a few %.
    yield console_cost(records=records * 2, rounds=max(rounds, 5))


_BROWSER_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]


def console_cost(records: int = 1_000_000, rounds: int = 3) -> dict[str, Any]:
    """The queries_console_cost row (see the module docstring)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        chromium = None
    if chromium is None:
        return {"name": "queries_console_cost", "skipped": "needs chromium and playwright"}
    import psutil

    rates: dict[str, list[float]] = {"without": [], "with": []}
    cpu: dict[str, dict[str, list[float]]] = {side: {"tq_up": [], "browser": []}
                                              for side in rates}
    with sync_playwright() as playwright:
        for round_ in range(rounds):
            for side in (("without", "with") if round_ % 2 == 0 else ("with", "without")):
                up = _Up(slots=4, console=side == "with")
                browser = None
                try:
                    if side == "with":
                        browser = playwright.chromium.launch(
                            executable_path=chromium, headless=True, args=_BROWSER_FLAGS)
                        page = browser.new_page()
                        page.goto(up.console + "#/graph")
                        page.wait_for_selector("#status.live", timeout=60_000)
                        _settle(psutil)  # the browser's and the page's start are not counted
                    before = _cpu_seconds(up.proc.pid), _browser_cpu_seconds(psutil)
                    measured = query_throughput(up, records)
                    after = _cpu_seconds(up.proc.pid), _browser_cpu_seconds(psutil)
                    rates[side].append(measured["records_per_s"])
                    per_million = 1e6 / measured["records"]
                    cpu[side]["tq_up"].append((after[0] - before[0]) * per_million)
                    cpu[side]["browser"].append((after[1] - before[1]) * per_million)
                finally:
                    if browser is not None:
                        browser.close()
                    up.close()
    medians = {side: statistics.median(values) for side, values in rates.items()}
    return {
        "name": "queries_console_cost",
        "figures": {f"{side}_console_records_per_s": {
            "min": round(min(v)), "median": round(statistics.median(v)), "max": round(max(v))}
            for side, v in rates.items()} | {
                "cpu_seconds_per_million_records": {
                    side: {who: round(statistics.median(v), 3) for who, v in spent.items()}
                    for side, spent in cpu.items()},
                "rounds_records_per_s": {side: [round(r) for r in v]
                                         for side, v in rates.items()},
                "rounds_cpu_seconds_per_million_records": {
                    side: {who: [round(x, 3) for x in v] for who, v in spent.items()}
                    for side, spent in cpu.items()},
                "records": records, "rounds": rounds,
                "load_avg_1m": round(os.getloadavg()[0], 2)},
        "ratio": round(medians["with"] / medians["without"], 3),
        "baseline": "tq up without a console and no browser",
        "goal": ">= 0.97x: a browser open on the graph costs the query path at most 3%",
    }


def _cpu_seconds(pid: int) -> float:
    """CPU seconds (user and system) `tq up` (`pid`) has spent, its threads included, and its
    direct children's: its executor child (broker, listeners), not the query processes."""
    import psutil

    up = psutil.Process(pid)
    total = 0.0
    for proc in (up, *up.children()):
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue  # exited meanwhile
        total += times.user + times.system
    return total


def _browser_cpu_seconds(psutil: Any) -> float:
    """CPU seconds the browser's processes (children of this process named chromium) spent."""
    total = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            if "chrom" in child.name():
                times = child.cpu_times()
                total += times.user + times.system
        except psutil.Error:
            pass  # a renderer that ended between the listing and the reading
    return total


def _settle(psutil: Any, deadline_s: float = 15.0) -> None:
    """Wait (at most `deadline_s`) until the browser has finished starting itself or a page:
    half a second in which its processes spend under 5% of a core, so a start is not counted
    against the round that follows it."""
    end = time.monotonic() + deadline_s
    spent = _browser_cpu_seconds(psutil)
    while time.monotonic() < end:
        time.sleep(0.5)
        now = _browser_cpu_seconds(psutil)
        if now - spent < 0.025:
            return
        spent = now
