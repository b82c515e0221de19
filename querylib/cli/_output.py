"""A query's output as `tq logs` and `tq submit --wait` show it (DESIGN §6 "Following a query").

Each executor writes its processes' lines to the `__logs` topic of its own broker, one record
per line keyed `<query>/<process>` (executor/_logs.py). This module reads every executor
broker's `__logs`, keeps one query's lines and prints them:

    [0] a line the program printed                    stdout
    [1 stderr] Traceback (most recent call last):     stderr
    --timestamps:  2026-11-25T21:35:01.123Z [0] ...   when the executor read the line (UTC)
    --json:        {"query": 12, "process": 0, "stream": "stdout", "time": "...", ...}

`--tail N` prints the last N lines (over all processes, in timestamp order). Following ends
when the query ends: the executor acknowledges a process's last lines before it reports the
exit (executor/_agent.py), so once the catalog has the query ended with every exit code, one
last read to the end of each `__logs` partition finds every line. Processes that have not
reported an exit when the query ended (killed, or on a lost executor) get `_SETTLE` seconds.

Must not: act on the query (kill, fail); it only reads.
"""

from __future__ import annotations

import collections
import contextlib
import json
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from catalog import Query
from querylib.cluster import wait_for_exits

if TYPE_CHECKING:
    from querylib.broker.messages import StartAt
    from querylib.rpc import Credential

__all__ = ["OutputOptions", "format_line", "print_output"]

_POLL = 0.2      # seconds a follower waits for lines before it checks whether to stop
_SETTLE = 10.0   # seconds after a query's end for its other processes to report their exits


@dataclass(frozen=True)
class OutputOptions:
    tail: int | None = None      # only the last N lines that exist when reading starts
    timestamps: bool = False
    json: bool = False


def format_line(query_id: int, process: int, stream: str, text: str, timestamp_ms: int,
                continues: bool, options: OutputOptions) -> str:
    """One output line as printed (without its newline)."""
    when = datetime.fromtimestamp(timestamp_ms / 1000, UTC)
    stamp = when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"
    if options.json:
        return json.dumps({"query": query_id, "process": process, "stream": stream,
                           "time": stamp, "timestamp_ms": timestamp_ms, "text": text,
                           "continues": continues}, ensure_ascii=False)
    mark = f"[{process}]" if stream != "stderr" else f"[{process} stderr]"
    return f"{stamp} {mark} {text}" if options.timestamps else f"{mark} {text}"


@dataclass(frozen=True)
class _Line:
    timestamp_ms: int
    text: str


class _Printer:
    """Prints whole lines from several reader threads, never interleaving two."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def __call__(self, lines: list[str]) -> None:
        if not lines:
            return
        with self.lock:
            sys.stdout.write("".join(line + "\n" for line in lines))
            sys.stdout.flush()


def _log_brokers(cluster: Any, timeout: float) -> list[str]:
    """The address of every executor's broker (where the `__logs` partitions live)."""
    snaps = cluster.snapshot("executors", "brokers", timeout=timeout)
    brokers = {b.broker_id: b.address for b, _ in snaps["brokers"].records}
    return sorted({brokers[e.broker_id] for e, _ in snaps["executors"].records
                   if e.broker_id in brokers})


class _Reader:
    """One broker's `__logs`, filtered to one query."""

    def __init__(self, address: str, query_id: int, secret: bytes | Credential,
                 options: OutputOptions, timeout: float) -> None:
        self.address = address
        self.query_id = query_id
        self.prefix = f"{query_id}/".encode()
        self.secret = secret
        self.options = options
        self.timeout = timeout
        self.position: StartAt = "earliest"
        self.abandoned = False  # set when the follower is interrupted: no last read

    def _lines(self, event: Any) -> list[_Line]:
        """This query's lines among `event`'s records (the record layout of executor/_logs)."""
        out = []
        for record in event.records:
            if record.key is None or not record.key.startswith(self.prefix):
                continue
            process = record.key[len(self.prefix):].decode(errors="replace")
            headers = dict(record.headers)
            stream = (headers.get("stream") or b"stdout").decode(errors="replace")
            text = (record.value or b"").decode("utf-8", errors="replace")
            out.append(_Line(record.timestamp, format_line(
                self.query_id, int(process) if process.isdigit() else -1, stream, text,
                record.timestamp, headers.get("continues") == b"1", self.options)))
        return out

    def read(self, emit: Callable[[list[_Line]], None], interrupted: threading.Event,
             stop: threading.Event | None = None) -> None:
        """Lines from the current position: to the end of the partition (stop None), or
        until `stop` is set and everything up to the end then was read. Returns early once
        `interrupted` is set."""
        from querylib.broker import Data, Subscriber

        with Subscriber(self.address, "__logs", [0], secret=self.secret, start=self.position,
                        follow=stop is not None, timeout=self.timeout) as sub:
            while not interrupted.is_set() and not (stop is not None and stop.is_set()):
                event = sub.next_event(_POLL)
                if isinstance(event, Data):
                    emit(self._lines(event))
                elif event is None and stop is None and sub.decoder.done():
                    break
            self.position = sub.positions.get(0, self.position)
        if stop is not None and not interrupted.is_set():  # ended: every line is in by now
            self.read(emit, interrupted)


@contextlib.contextmanager
def _ctrl_c() -> Iterator[threading.Event]:
    """An event Ctrl-C sets (instead of raising KeyboardInterrupt wherever the main thread
    is, e.g. inside a subscriber's close); KeyboardInterrupt once the block is left."""
    interrupted = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield interrupted
        return
    previous = signal.signal(signal.SIGINT, lambda *_: interrupted.set())
    try:
        yield interrupted
    finally:
        signal.signal(signal.SIGINT, previous)
    if interrupted.is_set():
        raise KeyboardInterrupt


def print_output(cluster: Any, query: Query, options: OutputOptions, *,
                 follow: bool = False, timeout: float = 30.0) -> Query:
    """Print `query`'s output lines; with `follow`, go on printing new lines until the query
    ended and every process reported its exit (or `_SETTLE` seconds after the end), then
    return its final record. KeyboardInterrupt on Ctrl-C, once reading stopped cleanly."""
    readers = [_Reader(a, query.query_id, cluster.secret, options, timeout)
               for a in _log_brokers(cluster, max(timeout, 30.0))]
    printer = _Printer()
    with _ctrl_c() as interrupted:
        _print_existing(readers, printer, options, interrupted)
        if not follow or interrupted.is_set():
            return query
        stop = threading.Event()
        threads = [threading.Thread(target=r.read, args=(lambda ls: printer(
            [x.text for x in ls]), interrupted, stop), daemon=True,
            name=f"tq logs {r.address}") for r in readers]
        for thread in threads:
            thread.start()
        try:
            ended = wait_for_exits(cluster, query.query_id, interrupted=interrupted,
                                   settle=_SETTLE)
        finally:
            stop.set()
            for thread in threads:
                thread.join()
    return ended


def _print_existing(readers: list[_Reader], printer: _Printer, options: OutputOptions,
                    interrupted: threading.Event) -> None:
    """What the readers' partitions hold now: all of it as it comes, or the last N lines."""
    if options.tail is None:
        for reader in readers:
            reader.read(lambda lines: printer([x.text for x in lines]), interrupted)
        return
    last: list[_Line] = []
    for reader in readers:
        kept: collections.deque[_Line] = collections.deque(maxlen=max(options.tail, 0))
        reader.read(kept.extend, interrupted)
        last += kept
    last.sort(key=lambda x: x.timestamp_ms)  # (stable: a broker's lines stay in log order)
    printer([x.text for x in last[len(last) - max(options.tail, 0):]])
