"""Fixtures of the interop tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Processes
from tests.interop._kafka import KafkaServer


@pytest.fixture
def kafka_server(tmp_path: Path, processes: Processes) -> Iterator[KafkaServer]:
    """A Kafka listener over tmp_path/data in a child process; call start() (after writing
    any topics the test needs through querylib.log), stop() and start() again at will."""
    server = KafkaServer(processes, tmp_path / "data")
    try:
        yield server
    finally:
        server.stop()
