"""kafka-python as an independent oracle. Its snappy support needs the python-snappy module;
`snappy_for_kafka_python` gives it a stand-in built on cramjam's raw snappy (what python-snappy
itself wraps today), so kafka-python's own xerial framing code is what runs."""

from __future__ import annotations

import types
from collections.abc import Iterator

import cramjam
import pytest


@pytest.fixture
def snappy_for_kafka_python(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    import kafka.codec

    stand_in = types.SimpleNamespace(
        compress=lambda data: bytes(cramjam.snappy.compress_raw(bytes(data))),
        decompress=lambda data: bytes(cramjam.snappy.decompress_raw(bytes(data))),
    )
    monkeypatch.setattr(kafka.codec, "snappy", stand_in)
    yield
