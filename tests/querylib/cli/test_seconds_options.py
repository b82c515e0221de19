"""Every option of `tq` that takes seconds refuses what is not a finite number in its range at
parse time, with argparse's one-line error naming the option: seen on main, `--timeout -1`,
`--broker-lease nan` and `--active-lease inf` were taken and only failed (or hung) later."""

from __future__ import annotations

import pytest

from querylib.cli import build_parser

# (command line before the option, the option, whether 0 means something)
OPTIONS = [
    (["consume", "t"], "--timeout", False),
    (["consume", "t"], "--broker-lease", False),
    (["consume", "t"], "--wait", True),
    (["produce", "t"], "--broker-lease", False),
    (["topics"], "--timeout", False),
    (["executor", "--data", "d"], "--grace", True),
    (["executor", "--data", "d"], "--lease", False),
    (["up"], "--grace", True),
    (["coordinator"], "--recovery-lease", False),
    (["coordinator"], "--active-lease", False),
    (["kill", "1"], "--wait-timeout", False),
    (["submit"], "--start-timeout", False),  # (its options come before the program)
]


def _parse(before: list[str], option: str, value: str):
    after = ["q.py"] if before == ["submit"] else []
    return build_parser().parse_args([*before, f"{option}={value}", *after])


@pytest.mark.parametrize(("before", "option", "zero"), OPTIONS)
@pytest.mark.parametrize("value", ["-1", "nan", "inf", "1e12", "soon"])
def test_bad_seconds_are_refused_at_parse_time(before: list[str], option: str, zero: bool,
                                               value: str, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        _parse(before, option, value)
    assert info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"argument {option}" in error and "seconds" in error, error


@pytest.mark.parametrize(("before", "option", "zero"), OPTIONS)
def test_good_seconds_are_taken(before: list[str], option: str, zero: bool, capsys) -> None:
    name = option[2:].replace("-", "_")
    assert getattr(_parse(before, option, "2.5"), name) == 2.5
    if zero:
        assert getattr(_parse(before, option, "0"), name) == 0
    else:
        with pytest.raises(SystemExit):
            _parse(before, option, "0")
