"""A broker's Kafka address in the catalog: registered with the broker, and catalogs written
before the field existed still load (the field defaults to "")."""

from __future__ import annotations

import msgspec

from catalog import Broker, decode_record, encode_record


def test_a_broker_record_without_kafka_address_still_decodes():
    old = msgspec.msgpack.encode({"type": "broker", "broker_id": 3, "host": "h",
                                  "address": "tcp://h:1", "session_id": None})
    broker = decode_record("brokers", old)
    assert broker == Broker(broker_id=3, host="h", address="tcp://h:1", session_id=None)
    assert broker.kafka_address == ""


def test_the_kafka_address_round_trips():
    broker = Broker(broker_id=1, host="h", address="tcp://h:1", session_id=7,
                    kafka_address="h:9092")
    assert decode_record("brokers", encode_record(broker)) == broker
