"""The thesis' `numbers` query: worker i publishes i*100 .. (i+1)*100, spread over logical
times, as topic `numbers` (PerWorker: one partition per worker; `--merge`: one partition).

    python -m querylib.examples.numbers_query [--topic numbers] [--merge] [--times 10]

Run directly it is a one-process query; under an executor (or with TQ_* set) every process
and worker takes part. Worker i sends number n at time n mod `times`, then advances to `times`
(run again, it appends to what the topic holds, in a new epoch: its times start at 0 again).
(Named numbers_query, not numbers: run as a program, its folder is sys.path[0], where a
numbers.py would shadow the stdlib `numbers` module.)
"""

from __future__ import annotations

import argparse
import sys

import querylib


def numbers(ctx: querylib.Context, *, topic: str, merge: bool, times: int) -> int:
    partition = querylib.Merge if merge else querylib.PerWorker
    mine = range(ctx.index * 100, (ctx.index + 1) * 100)
    with ctx.publish(topic, partition=partition) as out:
        for t in range(times):  # run again, it appends in a new epoch (DESIGN §5 "Epochs")
            out.send(t, [n for n in mine if n % times == t])
            out.advance_to(t + 1)
    return len(mine)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topic", default="numbers")
    parser.add_argument("--merge", action="store_true", help="one merged partition")
    parser.add_argument("--times", type=int, default=10, help="logical times to spread over")
    args = parser.parse_args(argv)
    querylib.execute(lambda ctx: numbers(ctx, topic=args.topic, merge=args.merge,
                                         times=args.times))
    return 0


if __name__ == "__main__":
    sys.exit(main())
