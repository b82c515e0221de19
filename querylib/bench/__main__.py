"""`python -m querylib.bench [SUITE ...]`: run benchmark suites, print JSON lines."""

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
    "queries": ("querylib.bench._queries",),
    "coordinator": ("querylib.bench._coordinator",),
    "kafka": ("querylib.bench._kafka",),
    "connector": ("querylib.bench._connector",),
    "spark": ("querylib.bench._spark",),
}


def main(argv: list[str]) -> int:
    names = argv or list(SUITES)
    unknown = [n for n in names if n not in SUITES]
    if unknown:
        print(f"bench: unknown suite(s) {', '.join(unknown)}; known: {', '.join(SUITES)}",
              file=sys.stderr)
        return 2
    for name in names:
        for module in SUITES[name]:
            for row in importlib.import_module(module).run():
                print(json.dumps({"suite": name, **row}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
