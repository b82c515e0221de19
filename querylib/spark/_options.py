"""The options of the `tq` source and sink, parsed and checked once, on the driver.

Names follow Spark's Kafka source where they fit (Spark lower-cases option names, so they are
case-insensitive):

    subscribe             "a,b"                    topics to read (catalog.TopicName forms)
    subscribePattern      "orders\\..*"            topics whose short name matches (whole name)
    assign                {"a":[0,1]}              exact partitions
    startingOffsets       earliest | latest | {"a":{"0":23,"1":-2}}   (-2 earliest, -1 latest)
    endingOffsets         latest | {"a":{"0":50,"1":-1}}              (batch queries only)
    maxOffsetsPerTrigger  N                        streaming: at most N offsets per micro-batch
    maxRecordsPerPartition N                       split a partition's range into Spark tasks of
                                                   at most N offsets (default 1,000,000)
    minPartitions         N                        split ranges further until >= N tasks
    failOnDataLoss        true | false             offsets gone by retention: fail (default) or
                                                   go on from the oldest offset still there
    includeHeaders        true | false             add the headers column (default false)
    path / dataDir        DIR                      read/write the partition logs in DIR directly
                                                   (same host); without it, the cluster:
    coordinator           tcp://HOST:PORT          the coordinator (default: TQ_COORDINATOR,
                                                   then $TQ_HOME/cluster.json)
    secretFile            FILE                     the cluster secret (default: as discovered)
    timeout               SECONDS                  how long the coordinator and brokers may
                                                   take to answer (default 30)
    topic                 NAME                     (writes) the topic to publish into
    partitions            N                        (writes) the partitions of the topic when
                                                   the sink creates it (default 1); an existing
                                                   topic keeps its own

Partitions missing from a JSON offset map start at earliest and end at latest. This module is
pure: no I/O, no Spark; errors are BadOptionError (or InvalidTopicNameError for names).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from catalog import MAX_PARTITIONS, TopicName
from querylib.spark._errors import BadOptionError

__all__ = [
    "EARLIEST",
    "LATEST",
    "Location",
    "OffsetSpec",
    "ReadOptions",
    "Subscription",
    "WriteOptions",
    "include_headers",
    "parse_read_options",
    "parse_write_options",
]

EARLIEST = -2  # Kafka's sentinels in JSON offset maps
LATEST = -1
DEFAULT_MAX_RECORDS_PER_PARTITION = 1_000_000

_LOCATION_OPTIONS = ("path", "datadir", "coordinator", "secretfile", "timeout", "brokerlease")
_READ_OPTIONS = frozenset((
    "subscribe", "subscribepattern", "assign", "startingoffsets", "endingoffsets",
    "maxoffsetspertrigger", "maxrecordsperpartition", "minpartitions", "failondataloss",
    "includeheaders", *_LOCATION_OPTIONS,
))
# Spark hands a sink the query's own options too (checkpointLocation, queryName, ...).
_SPARK_WRITE_OPTIONS = frozenset(("checkpointlocation", "queryname", "mode"))
_WRITE_OPTIONS = frozenset(("topic", "partitions", *_LOCATION_OPTIONS, *_SPARK_WRITE_OPTIONS))
_OFFSETS_HELP = 'use earliest, latest or JSON like {"topic":{"0":23,"1":-2}}'


@dataclass(frozen=True)
class Location:
    """Where the partitions are: a local data dir (read and written directly), or a cluster
    reached through its coordinator."""

    data_dir: str | None = None
    coordinator: str | None = None
    secret_file: str | None = None
    timeout: float = 30.0
    # How long a task's broker may be silent before it is presumed gone (querylib's default).
    lease: float = 10.0

    def describe(self) -> str:
        return f"data dir {self.data_dir}" if self.data_dir else (
            f"cluster at {self.coordinator or '(discovered)'}")


@dataclass(frozen=True)
class Subscription:
    """Which topics (short names) or partitions a read covers."""

    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assigned: tuple[tuple[str, int], ...] = ()

    def describe(self) -> str:
        if self.pattern is not None:
            return f"subscribePattern {self.pattern!r}"
        if self.assigned:
            return f"assign {sorted(self.assigned)}"
        return f"subscribe {','.join(self.topics)}"


@dataclass(frozen=True)
class OffsetSpec:
    """earliest, latest, or per-partition offsets (EARLIEST/LATEST allowed as values)."""

    default: int  # EARLIEST or LATEST, for partitions not in `offsets`
    offsets: Mapping[tuple[str, int], int] = field(default_factory=dict)

    def for_partition(self, topic: str, partition: int) -> int:
        return self.offsets.get((topic, partition), self.default)


@dataclass(frozen=True)
class ReadOptions:
    subscription: Subscription
    starting: OffsetSpec
    ending: OffsetSpec
    location: Location
    max_offsets_per_trigger: int | None = None
    max_records_per_partition: int = DEFAULT_MAX_RECORDS_PER_PARTITION
    min_partitions: int = 1
    fail_on_data_loss: bool = True
    include_headers: bool = False


@dataclass(frozen=True)
class WriteOptions:
    topic: str
    location: Location
    partitions: int = 1  # of the topic, when the sink creates it


def parse_read_options(options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    """Check and parse the options of spark.read / spark.readStream.format("tq")."""
    options = _lower(options)
    _refuse_unknown(options, _READ_OPTIONS, "reading")
    subscription = _subscription(options)
    starting = _offsets(options, "startingoffsets", LATEST if streaming else EARLIEST)
    if streaming and "endingoffsets" in options:
        raise BadOptionError("option endingOffsets is for batch queries only; a stream reads "
                             "on; use spark.read for a bounded read")
    ending = _offsets(options, "endingoffsets", LATEST)
    if EARLIEST in ending.offsets.values() or "endingoffsets" in options and \
            options["endingoffsets"].strip().lower() == "earliest":
        raise BadOptionError("option endingOffsets: earliest (-2) is not an end; use latest "
                             "(-1) or an offset")
    max_per_trigger = _positive(options, "maxoffsetspertrigger")
    if max_per_trigger is not None and not streaming:
        raise BadOptionError("option maxOffsetsPerTrigger is for streaming queries only")
    return ReadOptions(
        subscription=subscription,
        starting=starting,
        ending=ending,
        location=_location(options),
        max_offsets_per_trigger=max_per_trigger,
        max_records_per_partition=_positive(options, "maxrecordsperpartition")
        or DEFAULT_MAX_RECORDS_PER_PARTITION,
        min_partitions=_positive(options, "minpartitions") or 1,
        fail_on_data_loss=_boolean(options, "failondataloss", True),
        include_headers=_boolean(options, "includeheaders", False),
    )


def include_headers(options: Mapping[str, str]) -> bool:
    """Whether the rows have a headers column (decides the schema, before anything else)."""
    return _boolean(_lower(options), "includeheaders", False)


def parse_write_options(options: Mapping[str, str]) -> WriteOptions:
    """Check and parse the options of df.write / df.writeStream.format("tq")."""
    options = _lower(options)
    _refuse_unknown(options, _WRITE_OPTIONS, "writing")
    topic = options.get("topic")
    if not topic:
        raise BadOptionError('option topic is required: .option("topic", "NAME")')
    partitions = _positive(options, "partitions") or 1
    if partitions > MAX_PARTITIONS:
        raise BadOptionError(f"option partitions: {partitions} is more than a topic may have "
                             f"({MAX_PARTITIONS})")
    return WriteOptions(topic=TopicName.parse(topic).short, location=_location(options),
                        partitions=partitions)


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items()}


def _refuse_unknown(options: Mapping[str, str], known: frozenset[str], what: str) -> None:
    unknown = sorted(set(options) - known)
    if unknown:
        raise BadOptionError(f"unknown option {unknown[0]!r} for {what} tq; known: "
                             f"{', '.join(sorted(known - _SPARK_WRITE_OPTIONS))}")


def _subscription(options: Mapping[str, str]) -> Subscription:
    given = [k for k in ("subscribe", "subscribepattern", "assign") if k in options]
    if len(given) != 1:
        raise BadOptionError("give exactly one of the options subscribe, subscribePattern, "
                             f"assign (got {len(given)})")
    kind = given[0]
    text = options[kind]
    if kind == "subscribe":
        names = [t.strip() for t in text.split(",") if t.strip()]
        if not names:
            raise BadOptionError("option subscribe: no topic given; use subscribe=NAME[,NAME]")
        return Subscription(topics=tuple(dict.fromkeys(TopicName.parse(n).short
                                                       for n in names)))
    if kind == "subscribepattern":
        try:
            re.compile(text)
        except re.error as exc:
            raise BadOptionError(f"option subscribePattern: bad regular expression: {exc}") \
                from None
        return Subscription(pattern=text)
    parsed = _json(text, "assign", 'use JSON like {"topic":[0,1]}')
    if not isinstance(parsed, dict) or not parsed:
        raise BadOptionError('option assign: use JSON like {"topic":[0,1]}')
    assigned: list[tuple[str, int]] = []
    for topic, partitions in parsed.items():
        if not isinstance(partitions, list) or not all(
                isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in partitions):
            raise BadOptionError(f"option assign: partitions of {topic!r} must be a list of "
                                 "partition numbers >= 0")
        name = TopicName.parse(topic).short
        assigned += [(name, p) for p in partitions]
    return Subscription(assigned=tuple(dict.fromkeys(assigned)))


def _offsets(options: Mapping[str, str], key: str, default: int) -> OffsetSpec:
    name = {"startingoffsets": "startingOffsets", "endingoffsets": "endingOffsets"}[key]
    text = options.get(key)
    if text is None:
        return OffsetSpec(default)
    word = text.strip().lower()
    if word == "earliest":
        return OffsetSpec(EARLIEST)
    if word == "latest":
        return OffsetSpec(LATEST)
    parsed = _json(text, name, _OFFSETS_HELP)
    if not isinstance(parsed, dict):
        raise BadOptionError(f"option {name}: {_OFFSETS_HELP}")
    offsets: dict[tuple[str, int], int] = {}
    for topic, per_partition in parsed.items():
        if not isinstance(per_partition, dict):
            raise BadOptionError(f"option {name}: {_OFFSETS_HELP}")
        short = TopicName.parse(topic).short
        for partition, offset in per_partition.items():
            if not (isinstance(partition, str) and partition.isdigit()) or not (
                    isinstance(offset, int) and not isinstance(offset, bool) and offset >= -2):
                raise BadOptionError(f"option {name}: {topic!r}: {partition!r}: {offset!r} is "
                                     "not a partition number and an offset >= -2")
            offsets[(short, int(partition))] = offset
    return OffsetSpec(default, offsets)


def _json(text: str, name: str, help_text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        raise BadOptionError(f"option {name}: {text[:60]!r} is not valid; {help_text}") from None


def _positive(options: Mapping[str, str], key: str) -> int | None:
    text = options.get(key)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise BadOptionError(f"option {key}: {text[:40]!r} is not a positive integer")
    return value


def _boolean(options: Mapping[str, str], key: str, default: bool) -> bool:
    text = options.get(key)
    if text is None:
        return default
    word = text.strip().lower()
    if word not in ("true", "false"):
        raise BadOptionError(f"option {key}: {text[:40]!r} is not true or false")
    return word == "true"


def _location(options: Mapping[str, str]) -> Location:
    data_dir = options.get("datadir") or options.get("path")
    if "datadir" in options and "path" in options and options["datadir"] != options["path"]:
        raise BadOptionError("options path and dataDir name different directories; give one")
    coordinator = options.get("coordinator")
    if data_dir and coordinator:
        raise BadOptionError("give either path/dataDir (a local data dir) or coordinator, "
                             "not both")
    return Location(data_dir=data_dir or None, coordinator=coordinator or None,
                    secret_file=options.get("secretfile") or None,
                    timeout=_seconds(options, "timeout", "30", 3600),
                    lease=_seconds(options, "brokerLease", "10", 86400))


def _seconds(options: Mapping[str, str], name: str, default: str, most: int) -> float:
    """Option `name` (looked up lower-cased, as every option is) in seconds, in (0, most]."""
    text = options.get(name.lower(), default)
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds <= most:  # NaN fails too
        raise BadOptionError(f"option {name}: {text[:40]!r} is not a number of seconds in "
                             f"(0, {most}]")
    return seconds
