"""Client processes for the broker integration tests: `python -m tests.integration._broker_clients
MODE ...`. Every line they print is one JSON object, flushed, so tests can follow them.

produce   sends batches of records "TAG:BATCH:I" (logical time BATCH // time-step), prints
          {"acked": BATCH, "base": OFFSET} per acknowledged batch, advances its frontier after
          every batch when --advance is set, waits for --go-file before --then-advance, ends
          its stream unless --no-end. Exits 3 if a batch failed (e.g. the broker stayed away
          for --reconnect-timeout).
consume   prints {"data": [values], "offsets": [first, last], "time": T, "partition": P} per
          Data event, {"progress": F}, {"eos": true}; checks offsets are contiguous itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

from querylib.broker import Data, EndOfStream, Progress, Subscriber
from querylib.broker._producer import ProducerCore, now_ms
from querylib.broker._session import BrokerLink
from querylib.broker._stream import encode_records
from querylib.rpc import load_secret


def emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def produce(args: argparse.Namespace) -> int:
    link = BrokerLink(args.broker, load_secret(args.secret_file), timeout=args.timeout,
                      reconnect_timeout=args.reconnect_timeout)
    await link.start()
    core = ProducerCore(link, args.topic, args.partition)
    await core.open()
    emit({"ready": True})
    if args.start_file:
        while not os.path.exists(args.start_file):
            await asyncio.sleep(0.01)
    acks: list[tuple[int, asyncio.Task]] = []

    async def report(upto: int) -> bool:
        """Print acknowledgements in order: those done already, and all up to `upto`."""
        while acks and (acks[0][0] <= upto or acks[0][1].done()):
            number, task = acks.pop(0)
            reply = await task
            if reply is None:
                return False
            emit({"acked": number, "base": reply.base_offset, "next": reply.next_offset})
        return True

    ok = True
    for b in range(args.batches):
        entries = [(None, f"{args.tag}:{b}:{i}".encode(), (), now_ms(), b // args.time_step)
                   for i in range(args.records)]
        try:
            acks.append((b, await core.send_batch(encode_records(entries))))
            if args.advance:
                await core.advance((b + 1) // args.time_step)
        except Exception as exc:  # reported as a line; the test decides
            emit({"error": f"{type(exc).__name__}: {exc}"})
            ok = False
            break
        ok = await report(-1 if args.pipeline else b)
        if not ok:
            break
    ok = ok and await report(args.batches)
    if ok and args.go_file:
        emit({"waiting": True})
        while not os.path.exists(args.go_file):
            await asyncio.sleep(0.01)
    try:
        if ok and args.then_advance is not None:
            await core.advance(args.then_advance)
            await core.flush()
        if ok and not args.no_end:
            await core.end()
        await core.flush()
    except Exception as exc:
        emit({"error": f"{type(exc).__name__}: {exc}"})
        ok = False
    emit({"done": ok})
    await link.close(clean=ok)
    return 0 if ok else 3


def consume(args: argparse.Namespace) -> int:
    start: str | int = args.start if args.start in ("earliest", "latest") else int(args.start)
    expected = None
    with Subscriber(args.broker, args.topic, args.partition, secret=load_secret(args.secret_file),
                    start=start, credit=args.credit, follow=args.follow, timeout=args.timeout,
                    lease=args.lease, create=True) as sub:
        emit({"ready": True})
        for event in sub:
            if isinstance(event, Data):
                offsets = [r.offset for r in event.records]
                if expected is not None and offsets[0] <= expected:
                    emit({"error": f"offset {offsets[0]} after {expected}: duplicate"})
                    return 4
                expected = offsets[-1]
                emit({"data": [r.value.decode() for r in event.records],
                      "offsets": [offsets[0], offsets[-1]], "time": event.time,
                      "partition": event.partition})
                if args.delay:
                    time.sleep(args.delay)  # a deliberately slow consumer
            elif isinstance(event, Progress):
                emit({"progress": event.frontier})
            elif isinstance(event, EndOfStream):
                emit({"eos": True})
        emit({"positions": sub.positions})
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["produce", "consume"])
    parser.add_argument("--broker", required=True)
    parser.add_argument("--secret-file", required=True)
    parser.add_argument("--topic", default="t")
    parser.add_argument("--partition", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--lease", type=float, default=10.0)
    parser.add_argument("--reconnect-timeout", type=float, default=60.0,
                        help="seconds the producer keeps trying to reach a broker that left")
    parser.add_argument("--tag", default="p")
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--records", type=int, default=10)
    parser.add_argument("--time-step", type=int, default=1)
    parser.add_argument("--advance", action="store_true")
    parser.add_argument("--pipeline", action="store_true",
                        help="keep batches in flight instead of waiting for each ack")
    parser.add_argument("--start-file", help="wait for this file before sending")
    parser.add_argument("--go-file", help="after sending, wait for this file")
    parser.add_argument("--then-advance", type=int)
    parser.add_argument("--no-end", action="store_true")
    parser.add_argument("--start", default="earliest")
    parser.add_argument("--credit", type=int, default=1024 * 1024)
    parser.add_argument("--follow", action="store_true")
    parser.add_argument("--delay", type=float, default=0.0)
    args = parser.parse_args()
    if args.mode == "produce":
        return asyncio.run(produce(args))
    return consume(args)


if __name__ == "__main__":
    sys.exit(main())
