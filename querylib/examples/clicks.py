"""The demo's generator query: synthetic click events published to topic `clicks`.

    tq submit querylib/examples/clicks.py --processes 2 -- --events 6000 --rate 400
    python -m querylib.examples.clicks --events 100      (a one-process query, run directly)

Event n (0 <= n < --events) happens at synthetic event time T0 + n * 1000 // --per-second
milliseconds (T0 = 2024-01-01T00:00:00Z) and is published by worker n mod peers, so the
workers together publish every event exactly once. A click is the JSON object
{"n", "page", "user", "time"}; its tq logical time is its event time in milliseconds, so Spark
sees it as `tq_time`. Each worker has its own partition (PerWorker) and advances its frontier
at the end of every 100 ms tick of event time, then closes: end of stream.

--rate paces publishing in wall-clock time (events per second, all workers together; 0 means
as fast as possible), so that a demo has something to watch arriving.

Must not: depend on anything but querylib (it runs inside an executor's process).
"""

from __future__ import annotations

import argparse
import random
import sys
import time

import querylib

T0_MS = 1_704_067_200_000  # 2024-01-01T00:00:00Z: fixed, so runs are comparable
TICK_MS = 100  # the frontier advances once per tick of event time
PAGES = ("/", "/docs", "/pricing", "/blog", "/signup", "/about")
USERS = 50


def event_time(n: int, per_second: int) -> int:
    """The synthetic event time of event n, in milliseconds since the epoch."""
    return T0_MS + n * 1000 // per_second


def click(n: int, rng: random.Random, per_second: int) -> dict[str, object]:
    # Skewed on purpose: the first pages are the popular ones, as on a real site.
    page = PAGES[min(int(rng.expovariate(0.6)), len(PAGES) - 1)]
    return {"n": n, "page": page, "user": f"user-{rng.randrange(USERS)}",
            "time": event_time(n, per_second)}


def clicks(ctx: querylib.Context, *, topic: str, events: int, per_second: int, rate: float,
           seed: int) -> int:
    """Publish this worker's share of the events; returns how many it published."""
    rng = random.Random(seed * 1_000_003 + ctx.index)
    mine = range(ctx.index, events, ctx.peers)
    worker_rate = rate / ctx.peers if rate > 0 else 0.0
    started = time.monotonic()
    sent = 0
    with ctx.publish(topic, partition=querylib.PerWorker, serde="json") as out:
        tick_end = None
        for n in mine:
            t = event_time(n, per_second)
            if tick_end is not None and t >= tick_end:
                out.advance_to(tick_end)
            tick_end = (t // TICK_MS + 1) * TICK_MS
            out.send(t, [click(n, rng, per_second)])
            sent += 1
            if worker_rate:
                # Pacing, not synchronisation: a demo should show events arriving over time.
                ahead = sent / worker_rate - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)
        if tick_end is not None:
            out.advance_to(tick_end)
    return sent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topic", default="clicks")
    parser.add_argument("--events", type=int, default=6000, help="events in all (default 6000)")
    parser.add_argument("--per-second", type=int, default=100,
                        help="events per second of synthetic event time (default 100)")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="events per wall-clock second, all workers (default 0: no pacing)")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    if args.events < 0 or args.per_second <= 0 or args.rate < 0:
        parser.error("--events >= 0, --per-second > 0 and --rate >= 0")
    sent = querylib.execute(lambda ctx: clicks(
        ctx, topic=args.topic, events=args.events, per_second=args.per_second,
        rate=args.rate, seed=args.seed))
    print(f"published {sum(sent)} click events to {args.topic}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
