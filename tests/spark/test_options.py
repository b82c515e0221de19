"""Options of the tq source and sink: Kafka's names, checked with one-line errors."""

from __future__ import annotations

import pytest

from catalog.errors import InvalidTopicNameError
from querylib.spark import BadOptionError
from querylib.spark._options import (
    EARLIEST,
    LATEST,
    Location,
    parse_read_options,
    parse_write_options,
)

pytestmark = pytest.mark.spark


def read(streaming: bool = False, **options: str):
    return parse_read_options(options, streaming=streaming)


def test_defaults_follow_the_kafka_source() -> None:
    batch = read(subscribe="a", path="/d")
    assert batch.subscription.topics == ("a",)
    assert batch.starting.default == EARLIEST and batch.ending.default == LATEST
    assert batch.location == Location(data_dir="/d")
    assert batch.fail_on_data_loss and batch.max_offsets_per_trigger is None
    stream = read(streaming=True, subscribe="a", path="/d")
    assert stream.starting.default == LATEST


def test_names_are_case_insensitive_and_topics_normalised() -> None:
    opts = read(SUBSCRIBE="persistent://public/default/a, t/ns/b,a", StartingOffsets="latest",
                dataDir="/d")
    assert opts.subscription.topics == ("a", "t/ns/b")
    assert opts.starting.default == LATEST


def test_json_offsets_and_assign() -> None:
    opts = read(assign='{"a":[0,2],"t/ns/b":[1]}',
                startingOffsets='{"a":{"0":23,"2":-2}}', endingOffsets='{"a":{"0":-1}}')
    assert opts.subscription.assigned == (("a", 0), ("a", 2), ("t/ns/b", 1))
    assert opts.starting.for_partition("a", 0) == 23
    assert opts.starting.for_partition("a", 2) == EARLIEST
    assert opts.starting.for_partition("t/ns/b", 1) == EARLIEST  # not named: the default
    assert opts.ending.for_partition("a", 0) == LATEST


def test_stream_limits() -> None:
    opts = read(streaming=True, subscribePattern="a.*", maxOffsetsPerTrigger="10",
                maxRecordsPerPartition="5", minPartitions="4", failOnDataLoss="false")
    assert opts.subscription.pattern == "a.*"
    assert (opts.max_offsets_per_trigger, opts.max_records_per_partition,
            opts.min_partitions, opts.fail_on_data_loss) == (10, 5, 4, False)


@pytest.mark.parametrize(("options", "streaming", "says"), [
    ({}, False, "exactly one of the options subscribe"),
    ({"subscribe": "a", "assign": '{"a":[0]}'}, False, "exactly one"),
    ({"subscribe": " , "}, False, "no topic given"),
    ({"subscribePattern": "("}, False, "bad regular expression"),
    ({"assign": "[1]"}, False, "assign"),
    ({"assign": '{"a":[-1]}'}, False, "partition numbers >= 0"),
    ({"subscribe": "a", "startingOffsets": "first"}, False, "earliest, latest or JSON"),
    ({"subscribe": "a", "startingOffsets": '{"a":{"x":1}}'}, False, "not a partition number"),
    ({"subscribe": "a", "startingOffsets": '{"a":{"0":-3}}'}, False, "offset >= -2"),
    ({"subscribe": "a", "endingOffsets": "earliest"}, False, "not an end"),
    ({"subscribe": "a", "endingOffsets": '{"a":{"0":-2}}'}, False, "not an end"),
    ({"subscribe": "a", "endingOffsets": "latest"}, True, "batch queries only"),
    ({"subscribe": "a", "maxOffsetsPerTrigger": "5"}, False, "streaming queries only"),
    ({"subscribe": "a", "maxOffsetsPerTrigger": "0"}, True, "not a positive integer"),
    ({"subscribe": "a", "failOnDataLoss": "maybe"}, False, "not true or false"),
    ({"subscribe": "a", "startingOffset": "latest"}, False, "unknown option 'startingoffset'"),
    ({"subscribe": "a", "path": "/d", "coordinator": "tcp://h:1"}, False, "not both"),
    ({"subscribe": "a", "path": "/d", "dataDir": "/e"}, False, "different directories"),
    ({"subscribe": "a", "timeout": "0"}, False, r"option timeout: '0' is not a number of "
                                                r"seconds in \(0, 3600\]"),
    ({"subscribe": "a", "brokerLease": "nan"}, False, "option brokerLease: 'nan' is not"),
    ({"subscribe": "a", "brokerLease": "-1"}, False, r"seconds in \(0, 86400\]"),
])
def test_bad_options_say_what_to_do(options: dict, streaming: bool, says: str) -> None:
    with pytest.raises(BadOptionError, match=says) as info:
        read(streaming=streaming, **options)
    assert "\n" not in str(info.value)


def test_bad_topic_names_are_user_errors() -> None:
    with pytest.raises(InvalidTopicNameError):
        read(subscribe="a b")
    with pytest.raises(InvalidTopicNameError):
        parse_write_options({"topic": "x/y"})


def test_timeout_and_broker_lease() -> None:
    assert read(subscribe="a").location == Location(timeout=30.0, lease=10.0)
    opts = read(subscribe="a", coordinator="tcp://h:1", timeout="5", brokerLease="3600")
    assert (opts.location.timeout, opts.location.lease) == (5.0, 3600.0)
    assert parse_write_options({"topic": "t", "BROKERLEASE": "2.5"}).location.lease == 2.5


def test_write_options() -> None:
    opts = parse_write_options({"topic": "public/default/out", "path": "/d",
                                "checkpointLocation": "/cp"})
    assert opts.topic == "out" and opts.location.data_dir == "/d"
    with pytest.raises(BadOptionError, match="option topic is required"):
        parse_write_options({"path": "/d"})
    with pytest.raises(BadOptionError, match="unknown option 'subscribe'"):
        parse_write_options({"topic": "t", "subscribe": "a"})


def test_write_partitions_option() -> None:
    assert parse_write_options({"topic": "t"}).partitions == 1
    assert parse_write_options({"topic": "t", "Partitions": "4"}).partitions == 4
    for bad in ("0", "-1", "x"):
        with pytest.raises(BadOptionError, match="option partitions: .* is not a positive"):
            parse_write_options({"topic": "t", "partitions": bad})
    with pytest.raises(BadOptionError, match="option partitions: 100000 is more than"):
        parse_write_options({"topic": "t", "partitions": "100000"})
