"""The Kafka listener's settings on `tq up`, `tq coordinator`, `tq executor` (issue 15):
auto.create.topics.enable and group.initial.rebalance.delay.ms, Kafka's defaults, and the
coordinator broker's listener taking them as any other (it creates topics too now)."""

from __future__ import annotations

import pytest

from querylib.cli import build_parser
from querylib.cli._broker import kafka_config


def _config(*argv: str):
    args = build_parser().parse_args(list(argv))
    if args.kafka_port is None:
        args.kafka_port = 0
    return kafka_config(args)


@pytest.mark.parametrize("command", [["up"], ["coordinator"], ["executor", "--data", "d"]])
def test_kafkas_defaults(command: list[str]) -> None:
    config = _config(*command)
    assert config.auto_create_topics is True
    assert config.group_config.initial_rebalance_delay_ms == 3000


@pytest.mark.parametrize("command", [["up"], ["coordinator"], ["executor", "--data", "d"]])
def test_both_settings_are_configurable(command: list[str]) -> None:
    config = _config(*command, "--no-kafka-auto-create-topics",
                     "--kafka-group-initial-delay-ms", "250")
    assert config.auto_create_topics is False
    assert config.group_config.initial_rebalance_delay_ms == 250


def test_tq_ups_coordinator_listener_takes_the_same_settings() -> None:
    from querylib.cli._up import _group_coordinator

    args = build_parser().parse_args(["up", "--no-kafka-auto-create-topics",
                                      "--kafka-group-initial-delay-ms", "0"])
    config = _group_coordinator(args)
    assert config.auto_create_topics is False
    assert config.group_config.initial_rebalance_delay_ms == 0
    assert config.port == 0  # --coordinator-kafka-port's default: any free port


def test_a_negative_delay_is_refused(capsys) -> None:
    with pytest.raises(SystemExit):
        _config("coordinator", "--kafka-group-initial-delay-ms", "-1")
    assert "argument --kafka-group-initial-delay-ms" in capsys.readouterr().err

