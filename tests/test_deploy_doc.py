"""docs/deploy.md stays true to the `tq` it documents: every `tq` command in its shell blocks
and every systemd unit's ExecStart parses with the real argument parser, the executor unit
joins by token (no coordinator address, no credential file), the coordinator's unit listens
on every interface and advertises an address, and the firewall opens the ports the units
listen on. (That the commands do what the guide says: tests/integration/test_join_token.py
and test_multihost_join.py.)"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from querylib.cli import build_parser

DEPLOY = Path(__file__).resolve().parents[1] / "docs" / "deploy.md"
_BLOCK = re.compile(r"^```(sh|ini)\n(.*?)^```", re.S | re.M)


def _blocks(kind: str) -> list[str]:
    return [body for lang, body in _BLOCK.findall(DEPLOY.read_text()) if lang == kind]


def _tq_argv(line: str) -> list[str] | None:
    """The arguments of the tq command on `line` (after an alias `tqa`, `sudo ... tq`, or
    `ExecStart=/opt/tq/bin/tq`), or None when the line runs no tq command."""
    words = shlex.split(line.partition("=")[2] if line.startswith("ExecStart=") else line,
                        comments=True)
    for i, word in enumerate(words):
        if word in ("tq", "tqa") or word.endswith("/bin/tq"):
            return words[i + 1:]
    return None


def _commands() -> list[list[str]]:
    found = []
    for body in _blocks("sh") + _blocks("ini"):
        for line in body.splitlines():
            if line.startswith("alias "):
                continue
            argv = _tq_argv(line)
            if argv:
                found.append(argv)
    return found


def _units() -> dict[str, list[str]]:
    """Each unit's ExecStart, by the tq command it runs (coordinator, executor)."""
    units = {}
    for body in _blocks("ini"):
        (start,) = [line for line in body.splitlines() if line.startswith("ExecStart=")]
        argv = _tq_argv(start)
        assert argv, start
        units[argv[0]] = argv
    return units


def test_the_guide_has_commands_and_two_units() -> None:
    assert len(_commands()) >= 8
    assert set(_units()) == {"coordinator", "executor"}


@pytest.mark.parametrize("argv", _commands(), ids=lambda a: " ".join(a)[:60])
def test_every_tq_command_of_the_guide_parses(argv: list[str]) -> None:
    build_parser().parse_args(argv)  # SystemExit (argparse's error) fails the test


def test_the_units_join_by_token_and_listen_where_the_firewall_opens() -> None:
    parser = build_parser()
    coordinator = parser.parse_args(_units()["coordinator"])
    executor = parser.parse_args(_units()["executor"])
    assert coordinator.listen.startswith("tcp://0.0.0.0:") and coordinator.advertise
    assert executor.coordinator is None and executor.secret_file is None
    assert executor.join is None  # from $TQ_JOIN_TOKEN, the unit's EnvironmentFile
    assert any("EnvironmentFile=-/etc/tq/join.env" in body for body in _blocks("ini"))
    assert any("TQ_JOIN_TOKEN=tqjoin1." in body for body in _blocks("sh"))
    port = int(coordinator.listen.rpartition(":")[2])
    broker_port = int(executor.broker_listen.rpartition(":")[2])
    firewall = " ".join(line for body in _blocks("sh") for line in body.splitlines()
                        if "ufw allow" in line)
    assert f"port {port}:{port + 1} " in firewall  # the coordinator and its catalog broker
    assert f"port {broker_port} " in firewall
