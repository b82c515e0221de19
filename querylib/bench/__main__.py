"""`python -m querylib.bench [SUITE ...]`: run benchmark suites, print JSON lines.

`python -m querylib.bench --against REF [--rounds N] SUITE ...`: the same suites in the tree
of commit REF and in this one, alternated, compared figure by figure (`_compare`)."""

from __future__ import annotations

import importlib
import json
import sys

# suite name -> modules, each defining run() -> Iterable[dict]
SUITES: dict[str, tuple[str, ...]] = {
    "log": ("querylib.bench._log", "querylib.bench._records"),
    "records": ("querylib.bench._records",),
    "rpc": ("querylib.rpc._bench",),
    "pubsub": ("querylib.bench._pubsub",),
    "scaling": ("querylib.bench._scaling",),
    "peers": ("querylib.bench._peers",),
    "queries": ("querylib.bench._queries",),
    "coordinator": ("querylib.bench._coordinator",),
    "kafka": ("querylib.bench._kafka",),
    "connector": ("querylib.bench._connector",),
    "spark": ("querylib.bench._spark",),
    "replication": ("querylib.bench._replication",),
}


def main(argv: list[str]) -> int:
    ref, rounds = None, 3
    while argv[:1] in (["--against"], ["--rounds"]):
        if len(argv) < 2:
            print(f"bench: {argv[0]} needs a value", file=sys.stderr)
            return 2
        if argv[0] == "--against":
            ref = argv[1]
        elif not argv[1].isdigit() or int(argv[1]) < 1:
            print(f"bench: --rounds {argv[1]!r} is not a positive number", file=sys.stderr)
            return 2
        else:
            rounds = int(argv[1])
        argv = argv[2:]
    names = argv or list(SUITES)
    unknown = [n for n in names if n not in SUITES]
    if unknown:
        print(f"bench: unknown suite(s) {', '.join(unknown)}; known: {', '.join(SUITES)}",
              file=sys.stderr)
        return 2
    if ref is not None:
        from querylib.bench._compare import main as compare

        return compare(ref, names, rounds)
    for name in names:
        for module in SUITES[name]:
            for row in importlib.import_module(module).run():
                print(json.dumps({"suite": name, **row}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
