"""The public surface of querylib.kafka: everything in __all__ exists and is public, errors sit
under TqError, and the backend contract is what BrokerBackend (the one backend) implements."""

from __future__ import annotations

import querylib.kafka as kafka
import querylib.server.kafka as kafka_server
from catalog.errors import ProtocolError, TqError


def test_all_is_the_public_surface() -> None:
    for package in (kafka, kafka_server):
        public = {name for name in vars(package) if not name.startswith("_")}
        assert set(package.__all__) >= public
        assert len(package.__all__) == len(set(package.__all__))


def test_errors_sit_under_the_tq_hierarchy() -> None:
    assert issubclass(kafka.KafkaProtocolError, ProtocolError)
    assert not issubclass(kafka.KafkaRequestError, ProtocolError)
    for name in kafka.__all__:
        obj = getattr(kafka, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, TqError), name


def test_the_broker_backend_implements_the_backend_protocol() -> None:
    members = {name for name in dir(kafka_server.KafkaBackend) if not name.startswith("_")}
    assert members <= set(dir(kafka_server.BrokerBackend))
    assert not hasattr(kafka_server, "LocalBackend")  # one Kafka backend: a broker's


def test_advertised_versions_match_the_issue() -> None:
    v = kafka.SUPPORTED_VERSIONS
    A = kafka.ApiKey
    # Issue 15: the flexible versions current clients send (Kafka 4's ranges, short of the
    # versions that name topics by id only).
    assert v[A.API_VERSIONS] == (0, 4)
    assert v[A.METADATA] == (0, 13)
    assert v[A.PRODUCE] == (0, 12)
    assert v[A.FETCH] == (4, 17)
    assert v[A.LIST_OFFSETS] == (1, 8)
    assert v[A.FIND_COORDINATOR] == (0, 4)
    assert v[A.OFFSET_COMMIT] == (2, 9)
    assert v[A.OFFSET_FETCH] == (1, 9)
    assert v[A.JOIN_GROUP] == (0, 9)
    assert v[A.SYNC_GROUP] == (0, 5)
    assert (v[A.HEARTBEAT], v[A.LEAVE_GROUP]) == ((0, 4), (0, 5))
    assert v[A.INIT_PRODUCER_ID] == (0, 5)
