"""Mistakes surface in Spark's exception text as one clear line naming tq's error class.
(Each kind of mistake is checked in depth without Spark in test_options / test_plan; here one
of each error class goes through Spark's planning and tasks.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.spark._topics import create_topic

pytestmark = pytest.mark.spark


def failure(action) -> str:
    with pytest.raises(Exception) as info:  # noqa: B017 - Spark wraps ours in its own
        action()
    return str(info.value)


def test_read_errors(spark, tmp_path: Path) -> None:
    create_topic(tmp_path, "there", 1)

    def load(path: Path = tmp_path, **options: str):
        reader = spark.read.format("tq")
        for key, value in options.items():
            reader = reader.option(key, value)
        return lambda: reader.load(str(path)).collect()

    text = failure(load(subscribe="missing"))
    assert "UnknownTopicError: topic 'missing' not found in data dir" in text
    text = failure(load(subscribe="there", startingOffset="earliest"))
    assert "BadOptionError: unknown option 'startingoffset' for reading tq; known: " in text
    text = failure(load(subscribe="bad name"))
    assert "InvalidTopicNameError: invalid topic name 'bad name'" in text
    text = failure(load(tmp_path / "nowhere", subscribe="there"))
    assert "StorageError: data dir" in text and "does not exist" in text


def test_write_errors(spark, tmp_path: Path) -> None:
    create_topic(tmp_path, "there", 2)
    df = spark.createDataFrame([(b"v",)], "value binary")

    def save(frame, mode: str = "append", **options: str):
        writer = frame.write.format("tq").mode(mode)
        for key, value in options.items():
            writer = writer.option(key, value)
        return lambda: writer.save(str(tmp_path))

    # (a missing topic is created: test_write.py)
    text = failure(save(df, "overwrite", topic="there"))
    assert "BadOptionError: tq topics are append-only" in text
    text = failure(save(spark.createDataFrame([(1,)], "v int"), topic="there"))
    assert "BadSchemaError: writing to tq needs a value column" in text
    text = failure(save(spark.createDataFrame([(b"v", 5)], "value binary, partition int"),
                        topic="there"))  # found by the task, row by row
    assert "BadSchemaError: row partition 5 is outside 0..1" in text
