"""`python -m tests.coordinator._tq ARGS`: the `tq` command with the coordinator commands
registered, for tests that run before querylib/cli/__init__.py lists them."""

from __future__ import annotations

import sys

import querylib.cli as cli

for name in ("querylib.cli._coordinator", "querylib.cli._catalog"):
    if name not in cli._COMMAND_MODULES:
        cli._COMMAND_MODULES.append(name)

if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[1:]))
