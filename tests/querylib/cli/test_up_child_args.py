"""`tq up` hands its connector and Kafka options to its executor child (`tq executor`) as
given: the child's parsed options equal tq up's, whatever their kind (a value, a flag, a
--no- flag, an optional value)."""

from __future__ import annotations

import argparse

from querylib.cli import build_parser
from querylib.cli._broker import add_connector_options, add_kafka_options
from querylib.cli._up_executor import child_args


def _forwarded_dests() -> list[str]:
    options = argparse.ArgumentParser(add_help=False)
    add_connector_options(options, default_port=None)
    add_kafka_options(options, default_port=None)
    return [a.dest for a in options._actions if a.option_strings]


def test_the_child_parses_to_tq_ups_own_options() -> None:
    up = build_parser().parse_args([
        "up", "--slots", "3", "--grace", "1.5", "--kafka-port", "0", "--kafka-sasl",
        "--no-kafka-auto-create-topics", "--kafka-group-initial-delay-ms", "10",
        "--connector-port", "-1", "--connector-cookie", "c00kie", "--advertised-host", "h",
        "--insecure", "--kafka-host", "0.0.0.0", "-v"])
    argv = child_args(up, "tcp://127.0.0.1:7400", "/s/secret", "/d/executor", ["kafka"])
    child = build_parser().parse_args(["executor", *argv])
    for dest in _forwarded_dests():
        assert getattr(child, dest) == getattr(up, dest), dest
    assert (child.coordinator, child.secret_file, child.data) == \
        ("tcp://127.0.0.1:7400", "/s/secret", "/d/executor")
    assert (child.slots, child.grace, child.verbose) == (3, 1.5, True)
    assert child.endpoint_fallback == "kafka" and child.endpoints_optional
    assert child.metrics_port == 0  # tq up's console reads it


def test_defaults_stay_defaults() -> None:
    up = build_parser().parse_args(["up"])
    up.connector_port, up.kafka_port = 7600, 9092  # what tq up sets for the defaults
    child = build_parser().parse_args(
        ["executor", *child_args(up, "tcp://x:1", "/s", "/d", ["connector", "kafka"])])
    for dest in _forwarded_dests():
        assert getattr(child, dest) == getattr(up, dest), dest
    assert child.slots is None and child.endpoint_fallback == "connector,kafka"
