"""Every port and count option of `tq` refuses what is out of its range at parse time, with
argparse's one-line error naming the option. Seen on main: `tq up --kafka-port 70000` opened
the Kafka listener on port 4464 (70000 mod 65536) without a word, and `tq up
--connector-credits -5` started the coordinator before its executor child failed."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from querylib.cli import build_parser

# (command line before the option, the option, the smallest value, the largest)
PORTS = [
    (["up"], "--kafka-port"),
    (["up"], "--connector-port"),
    (["up"], "--coordinator-kafka-port"),
    (["up"], "--console-port"),
    (["coordinator"], "--console-port"),
    (["executor", "--data", "d"], "--metrics-port"),
    (["broker", "--data", "d"], "--kafka-port"),
    (["broker", "--data", "d"], "--connector-port"),
]
COUNTS = [
    (["up"], "--slots", 1),
    (["up"], "--brokers", 1),
    (["up"], "--connector-credits", 1),
    (["up"], "--kafka-idle-ms", 1),
    (["up"], "--kafka-max-connections", 1),
    (["up"], "--kafka-max-connections-per-ip", 1),
    (["up"], "--kafka-group-initial-delay-ms", 0),
    (["executor", "--data", "d"], "--broker-id", 1),
    (["coordinator"], "--checkpoint-updates", 1),
    (["broker", "--data", "d"], "--flush-interval-ms", 0),
    (["topic", "create", "t"], "--partitions", 1),
    (["topic", "create", "t"], "--replication-factor", 1),
    (["topic", "delete-records", "t", "--before", "end"], "--partition", 0),
    (["produce", "t"], "--partition", 0),
    (["produce", "t"], "--partitions", 1),
    (["consume", "t"], "--partition", 0),
    (["logs", "q"], "--tail", 0),
    (["kafka", "--data", "d"], "--partitions", 1),
    (["kafka", "--data", "d"], "--max-frame-bytes", 1),
    (["demo"], "--events", 1),
]


def _parse(before: list[str], option: str, value: str):
    return build_parser().parse_args([*before, f"{option}={value}"])


def _refused(before: list[str], option: str, value: str, capsys) -> str:
    with pytest.raises(SystemExit) as info:
        _parse(before, option, value)
    assert info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"argument {option}" in error, error
    return error


@pytest.mark.parametrize(("before", "option"), PORTS)
@pytest.mark.parametrize("value", ["65536", "70000", "-2", "http", "1.5"])
def test_a_port_out_of_range_is_refused_at_parse_time(before: list[str], option: str,
                                                      value: str, capsys) -> None:
    assert "is not a port" in _refused(before, option, value, capsys)


@pytest.mark.parametrize(("before", "option"), PORTS)
@pytest.mark.parametrize("value", [-1, 0, 9092, 65535])
def test_ports_and_none_are_taken(before: list[str], option: str, value: int) -> None:
    assert getattr(_parse(before, option, str(value)), option[2:].replace("-", "_")) == value


def test_tq_kafka_port_has_no_none(capsys) -> None:
    assert "is not a port" in _refused(["kafka", "--data", "d"], "--port", "-1", capsys)
    assert _parse(["kafka", "--data", "d"], "--port", "0").port == 0


@pytest.mark.parametrize(("before", "option", "low"), COUNTS)
def test_a_count_out_of_range_is_refused_at_parse_time(before: list[str], option: str,
                                                       low: int, capsys) -> None:
    for value in (str(low - 1), str(2**31), "many", "2.5"):
        assert "is not a whole number" in _refused(before, option, value, capsys)
    dest = "partitions" if before[0] == "consume" else option[2:].replace("-", "_")
    taken = getattr(_parse(before, option, str(low)), dest)
    assert taken == ([low] if before[0] == "consume" else low)


def test_tq_up_with_a_port_out_of_range_starts_nothing(tmp_path) -> None:
    env = {**os.environ, "TQ_HOME": str(tmp_path)}
    env.pop("TQ_COORDINATOR", None)
    done = subprocess.run([sys.executable, "-m", "querylib.cli", "up", "--kafka-port", "70000"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "argument --kafka-port: '70000' is not a port" in done.stderr
    assert "ready" not in done.stderr
    assert not (tmp_path / "cluster.json").exists()


@pytest.mark.parametrize(("before", "value"), [(["topic", "add-partitions", "t"], "0"),
                                               (["broker", "decommission"], "0"),
                                               (["topic", "add-partitions", "t"], "many")])
def test_a_positional_count_out_of_range_is_refused(before: list[str], value: str,
                                                    capsys) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args([*before, value])
    assert info.value.code == 2
    assert "is not a whole number" in capsys.readouterr().err


@pytest.mark.parametrize(("option", "value"), [("--connector-port", "70000"),
                                               ("--credits", "0"),
                                               ("--checkpoint-interval", "nan"),
                                               ("--checkpoint-interval", "-1")])
def test_the_standalone_connector_broker_checks_its_options(option: str, value: str,
                                                            capsys) -> None:
    from querylib.server.connector.__main__ import main

    with pytest.raises(SystemExit) as info:
        main(["--data", "d", f"{option}={value}"])
    assert info.value.code == 2
    assert f"argument {option}" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "fast"])
def test_a_rate_out_of_range_is_refused(value: str, capsys) -> None:
    assert "is not a rate" in _refused(["demo"], "--rate", value, capsys)
    assert _parse(["demo"], "--rate", "0").rate == 0
