"""`python -m tests.coordinator._client [--lease S] [--resume ID] [--create NAME ...]
[--publish NAME ...] [--subscribe NAME ...]`: a client process holding a session.

Prints one JSON line ({"session": id, "resumed": bool}) once everything asked is done, then
waits until stdin closes (or it is killed) and closes its session cleanly.
"""

from __future__ import annotations

import argparse
import json
import sys

from querylib.cluster import Cluster


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lease", type=float, default=10.0)
    parser.add_argument("--resume", type=int)
    parser.add_argument("--create", action="append", default=[])
    parser.add_argument("--publish", action="append", default=[])
    parser.add_argument("--subscribe", action="append", default=[])
    args = parser.parse_args()
    with Cluster.connect(lease=args.lease, resume=args.resume, peer="test client") as cluster:
        for name in args.create:
            cluster.create_topic(name, 2)
        for name in args.publish:
            cluster.publish(name)
        for name in args.subscribe:
            cluster.subscribe(name, wait=30.0)
        print(json.dumps({"session": cluster.session_id, "resumed": cluster.resumed}),
              flush=True)
        sys.stdin.read()
    return 0


if __name__ == "__main__":
    sys.exit(main())
