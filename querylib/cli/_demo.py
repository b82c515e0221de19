"""`tq demo`: the README's main job, a pipeline across tq and Spark, run and shown end to end.

A thin adapter over `querylib.examples.demo.run_demo` (which starts `tq up`, submits the
generator and the Spark query, follows them and checks the result): this module only renders.
On a terminal a live block (clicks published, the latest windows' counts, the catalog as
`tq status` shows it) is redrawn in place under the queries' output lines; into a pipe or file
the same things come as plain lines, the catalog whenever it changes.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from querylib._argtypes import integer, per_second, seconds

_PIPE_EVERY = 2.0  # seconds between progress lines when the output is not a terminal
_WINDOWS_SHOWN = 4


def register(sub: argparse._SubParsersAction) -> None:
    demo = sub.add_parser(
        "demo", help="run the main job: a generator query and a Spark query on tq up",
        description="Start tq up (data in --data), submit a query that publishes synthetic "
        "click events to topic clicks and a Spark query that counts clicks per page per "
        "window of event time into topic page_counts; show them live, check the counts, stop "
        "the cluster. A data dir made by an earlier tq demo is cleared first.")
    demo.add_argument("--data", default="tq-data", help="data directory (default ./tq-data)")
    demo.add_argument("--events", type=integer(1), default=6000, help="click events (default 6000)")
    demo.add_argument("--rate", type=per_second, default=400.0,
                      help="events per second of wall-clock time; 0: as fast as possible "
                      "(default 400)")
    demo.add_argument("--window", type=integer(1), default=1,
                      help="counting window, seconds of event time (default 1)")
    demo.add_argument("--timeout", type=seconds, default=900.0,
                      help="give up after this many seconds (default 900)")
    demo.add_argument("--listen", help="coordinator endpoint (default: tq up's, "
                      "tcp://127.0.0.1:7400, or free ports when those are taken)")
    demo.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from querylib.examples.demo import DemoOptions, run_demo

    view = DemoView(sys.stdout)
    options = DemoOptions(data=Path(args.data), events=args.events, rate=args.rate,
                          window=args.window, timeout=args.timeout, listen=args.listen)
    try:
        summary = run_demo(options, view)
    finally:
        view.clear()
    for line in summary_lines(summary, time.monotonic() - view.began):
        print(line)
    return 0 if summary.ok else 1


class DemoView:
    """Renders what the demo reports (querylib.examples.demo.Observer)."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = out.isatty()
        self.began = time.monotonic()
        self._block: list[str] = []
        self._shown = 0  # lines of the live block on screen
        self._last_line = ""
        self._last_pipe = 0.0
        self._catalog_seen: tuple[Any, ...] = ()

    # -- Observer ------------------------------------------------------------------------------

    def step(self, text: str) -> None:
        self._line(f"[{time.monotonic() - self.began:5.1f}s] {text}")

    def log(self, query: str, process: str, line: str) -> None:
        if line.strip():
            self._line(f"    {query}[{process}] {line.rstrip()}")

    def live(self, state: Any) -> None:
        from querylib.cli._catalog import render_status

        catalog = render_status(state.catalog, state.coordinator, state.catalog_broker)
        progress = self._progress(state)
        if self.tty:
            self._block = [*progress, "", *catalog]
            self._redraw()
            return
        # Into a pipe: the catalog when something in it changed, progress now and then.
        seen = tuple(catalog[1:])
        if seen != self._catalog_seen:
            self._catalog_seen = seen
            self._line("    catalog: " + catalog[0])
            for line in catalog[1:]:
                self._line("      " + line)
        now = time.monotonic()
        if progress[0] != self._last_line and now - self._last_pipe >= _PIPE_EVERY:
            self._last_pipe = now
            self._last_line = progress[0]
            self._line("    " + progress[0])

    def clear(self) -> None:
        """Take the live block off the screen (before the summary)."""
        self._erase()
        self._block = []

    # -- rendering -----------------------------------------------------------------------------

    def _progress(self, state: Any) -> list[str]:
        frontier = "-" if state.frontier is None else _clock(state.frontier)
        clicks = (f"clicks: {state.published} events read back, frontier {frontier}"
                  f"{' (ended)' if state.clicks_ended else ''}")
        counted = sum(state.counts.values())
        windows = sorted({w for w, _ in state.counts})
        lines = [f"{clicks}; page_counts: {len(windows)} windows, {counted} clicks counted"
                 f"{' (ended)' if state.counts_ended else ''}"]
        if self.tty:  # two lines fit a terminal's width better
            lines = [line.strip() for line in lines[0].split(";")]
        if not windows:
            return [*lines, "  (no counts yet: Spark is starting)"]
        pages = sorted({p for _, p in state.counts})
        cells = [["window", *pages]]
        for w in windows[-_WINDOWS_SHOWN:]:
            cells.append([_clock(w), *(str(state.counts.get((w, p), 0)) for p in pages)])
        widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
        lines += ["  " + "  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True))
                  for row in cells]
        return lines

    def _line(self, text: str) -> None:
        self._erase()
        self.out.write(text + "\n")
        self._redraw()

    def _erase(self) -> None:
        if self.tty and self._shown:
            self.out.write(f"\x1b[{self._shown}F\x1b[J")  # up to the block's start, clear
            self._shown = 0

    def _redraw(self) -> None:
        if not self.tty:
            self.out.flush()
            return
        self._erase()
        size = shutil.get_terminal_size()
        # Lines cut to the width, the block to the height: wrapped lines would break erasing.
        lines = [line[:size.columns - 1] for line in self._block][:max(size.lines - 2, 0)]
        for line in lines:
            self.out.write(line + "\n")
        self._shown = len(lines)
        self.out.flush()


def _clock(ms: int) -> str:
    """Event time as the time of day (UTC), to the second."""
    return time.strftime("%H:%M:%S", time.gmtime(ms // 1000))


def summary_lines(summary: Any, elapsed: float) -> list[str]:
    data = summary.data
    broker = data / "executor" / "broker"
    check = "checked" if summary.ok else "FAILED"
    lines = [
        f"tq demo {'done' if summary.ok else 'FAILED'} in {elapsed:.1f}s",
        *(f"  problem: {p}" for p in summary.problems),
        *(f"  query {q.query_id} {q.name}: {q.state.value}, exit codes "
          f"{','.join(map(str, q.exit_codes))}" for q in summary.queries),
        f"  events generated:          {summary.events}",
        f"  events in topic clicks:    {summary.clicks_read}",
        f"  windows counted:           {summary.windows} ({len(summary.counts)} "
        f"(window, page) counts)",
        f"  total counted by Spark:    {summary.counted}",
        f"  total counted == events generated, and each count == a count of topic clicks: "
        f"{check}",
        "",
        f"The data stays in {data} (the cluster is stopped). To read it:",
        f"  tq log dump {broker}/page_counts-0/00000000000000000000.log --records",
        f"  export TQ_HOME={data}",
        "  tq up &                # the demo's cluster again: catalog and topics recovered",
        "  tq topics; tq status   # clicks, page_counts, the queries that made them",
        "  tq consume page_counts # the counts, through the running cluster",
        "  kill %1                # (tq up holds the logs: stop it before reading the files)",
        f"  python -c \"import querylib.spark as s; s.session().read.format('tq')"
        f".option('subscribe', 'page_counts').load('{broker}').show(truncate=False)\"",
    ]
    return lines
