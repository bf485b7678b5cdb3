"""What the Spark source's executors hand to Spark: Arrow record batches of the source's schema (no Spark
session needed: the schema is built by hand as Spark parses `SCHEMA`)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

pytest.importorskip("pyspark")
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    IntegerType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_sink.ranges import TopicRange
from spark_sink.rows import ArrowRows
from spark_sink.source import SCHEMA

pytestmark = pytest.mark.unit

TYPES = {
    "string": StringType(), "binary": BinaryType(), "timestamp": TimestampType(), "int": IntegerType(),
    "boolean": BooleanType(), "map<string,string>": MapType(StringType(), StringType()),
}  # fmt: skip
FIELDS = (field.split(" ", 1) for field in SCHEMA.split(", "))
SPARK_SCHEMA = StructType([StructField(name, TYPES[kind]) for name, kind in FIELDS])
T = "persistent://public/default/t"
BASE = 1_700_000_000_000


def stamp(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def add(
    rows: ArrowRows, key: str, event_time: int, entry: int, properties: dict[str, str], producer: str = "p"
) -> None:
    rows.keys.append(key)
    rows.values.append(b"v%d" % entry)
    rows.event_times.append(event_time)
    rows.publish_times.append(BASE + 9_000)
    rows.ledgers.append(5)
    rows.entries.append(entry)
    rows.batch_indexes.append(-1)
    rows.producers.append(producer)
    rows.add_properties(properties)


def test_rows_become_one_record_batch_of_the_schema_with_late_rows_marked() -> None:
    rows = ArrowRows(SPARK_SCHEMA, TopicRange((T, 1), None, (5, 9), BASE + 10_000, BASE + 5_000, True))
    add(rows, "", BASE + 7_000, 0, {"a": "b"})
    add(rows, "k", 0, 1, {})  # no event time: its publish time
    add(rows, "k", BASE + 4_000, 2, {"c": "d", "e": "f"}, "breaker")  # below the watermark Spark holds: late
    batch = rows.batch()
    assert batch.schema == rows.schema and len(rows) == 0
    got: dict[str, list[Any]] = batch.to_pydict()
    assert got["key"] == [None, "k", "k"]
    assert got["value"] == [b"v0", b"v1", b"v2"]
    assert got["event_time"] == [stamp(BASE + 7_000), stamp(BASE + 9_000), stamp(BASE + 4_000)]
    assert got["topic"] == [T] * 3 and got["partition"] == [1] * 3
    assert got["message_id"] == ["5:0:-1", "5:1:-1", "5:2:-1"]
    assert got["properties"] == [[("a", "b")], [], [("c", "d"), ("e", "f")]]
    assert got["producer"] == ["p", "p", "breaker"]  # who broke the promise
    assert got["late"] == [False, False, True]
    assert got["is_watermark"] == [False] * 3
    assert got["watermark"] == [stamp(BASE + 10_000)] * 3
    add(rows, "k", BASE, 3, {})  # the columns start again after a batch
    assert rows.batch().to_pydict()["message_id"] == ["5:3:-1"]


def test_the_watermark_row_carries_the_watermark_at_the_batchs_end() -> None:
    rows = ArrowRows(SPARK_SCHEMA, TopicRange(None, None, None, BASE + 10_000, None, True))
    got = rows.watermark_row(BASE + 10_000).to_pydict()
    assert got["is_watermark"] == [True] and got["late"] == [False]
    assert got["event_time"] == got["watermark"] == [stamp(BASE + 10_000)]
    assert got["value"] == [None] and got["key"] == [None] and got["producer"] == [None]


def test_before_any_watermark_nothing_is_late() -> None:
    rows = ArrowRows(SPARK_SCHEMA, TopicRange((T, -1), None, (5, 9), None, None, False))
    add(rows, "", 1, 0, {})
    got = rows.batch().to_pydict()
    assert got["late"] == [False] and got["watermark"] == [None] and got["partition"] == [-1]
