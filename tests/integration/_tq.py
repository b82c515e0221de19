"""`python -m tests.integration._tq ARGS`: the `tq` command with the broker commands registered,
for integration tests that run before querylib/cli/__init__.py lists them."""

from __future__ import annotations

import sys

import querylib.cli as cli

for name in ("querylib.cli._broker", "querylib.cli._produce", "querylib.cli._consume"):
    if name not in cli._COMMAND_MODULES:
        cli._COMMAND_MODULES.append(name)

if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[1:]))
