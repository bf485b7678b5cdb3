"""What the Spark source's executors hand to Spark: Arrow record batches of the source's schema (no Spark
session needed: the schema is built by hand as Spark parses `SCHEMA`)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pulsar
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


class FakeId:
    def __init__(self, entry: int, index: int = -1) -> None:
        self.entry, self.index = entry, index

    def ledger_id(self) -> int:
        return 7

    def entry_id(self) -> int:
        return self.entry

    def batch_index(self) -> int:
        return self.index


class FakeMessage:
    """What the client's binding hands out, with the accessors the read loop calls."""

    def __init__(self, entry: int, properties: dict[str, str], index: int = -1) -> None:
        self.id, self.props = FakeId(entry, index), properties

    def message_id(self) -> FakeId:
        return self.id

    def properties(self) -> dict[str, str]:
        return dict(self.props)

    def partition_key(self) -> str:
        return f"k{self.id.entry}"

    def data(self) -> bytes:
        return b"v%d" % self.id.entry

    def event_timestamp(self) -> int:
        return BASE + self.id.entry

    def publish_timestamp(self) -> int:
        return BASE + 1000 * self.id.entry

    def producer_name(self) -> str:
        return f"p{self.id.entry}"


class FakeReader:
    """`unanswered`: asking whether more is there fails as the client's does when its connection goes (the
    plain call answers False, the binding's asynchronous one a failed result)."""

    def __init__(self, messages: list[FakeMessage], unanswered: bool = False) -> None:
        self.messages = iter(messages)
        self.unanswered = unanswered
        self.closed = False
        self._reader = self

    def read_next(self, timeout_ms: int) -> FakeMessage:
        return next(self.messages)

    def has_message_available(self) -> bool:
        return not self.unanswered

    def has_message_available_async(self, callback: Any) -> None:
        callback(pulsar.Result.Timeout if self.unanswered else pulsar.Result.Ok, not self.unanswered)

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize("rows_per_batch", [2, 3, 8192])
def test_a_range_is_read_with_markers_hidden_and_each_rows_properties(
    monkeypatch: pytest.MonkeyPatch, rows_per_batch: int
) -> None:
    from spark_sink import clients, rows
    from spark_sink.options import SourceOptions

    monkeypatch.setattr(rows, "ROWS_PER_ARROW_BATCH", rows_per_batch)
    properties = {3: {"wm.marker": "W_SET"}, 5: {"a": "b", "c": "d"}, 6: {"e": "f"}}
    messages = [FakeMessage(entry, properties.get(entry, {})) for entry in range(10)]
    options = SourceOptions({"topic": T, "subscription": "s", "serviceUrl": "pulsar://localhost:6650",
                             "adminUrl": "http://localhost:8080"})  # fmt: skip
    part = TopicRange((T, -1), (7, 1), (7, 7), BASE + 10_000, BASE + 5, False)
    clients.keep_reader(options.settings(), options.client_options, T, FakeReader(messages), (7, 1))
    batches = list(rows.read_range(options, part, ArrowRows(SPARK_SCHEMA, part)))
    got: dict[str, list[Any]] = {name: [v for b in batches for v in b.column(name).to_pylist()] for name in
                                 ("value", "message_id", "properties", "late")}  # fmt: skip
    assert got["value"] == [b"v2", b"v4", b"v5", b"v6", b"v7"]  # after the start, up to the end, the marker hidden
    assert got["message_id"] == ["7:2:-1", "7:4:-1", "7:5:-1", "7:6:-1", "7:7:-1"]
    assert got["properties"] == [[], [], [("a", "b"), ("c", "d")], [("e", "f")], []]
    assert got["late"] == [True, True, False, False, False]  # event times below BASE + 5
    kept = clients.take_reader(options.settings(), options.client_options, T, (7, 7))
    assert kept is not None and kept.pending is None  # a whole entry at the end: nothing read past it


def test_the_messages_of_batched_entries_each_take_their_entrys_position_producer_and_publish_time() -> None:
    from spark_sink import clients, rows
    from spark_sink.options import SourceOptions

    # entries 1 to 4 of three messages each, the second of entry 2 a marker; the range is (7, 1] to (7, 3]
    messages = [
        FakeMessage(entry, {"wm.marker": "W_SET"} if (entry, index) == (2, 1) else {}, index)
        for entry in range(1, 5) for index in range(3)
    ]  # fmt: skip
    options = SourceOptions({"topic": T, "subscription": "s", "serviceUrl": "pulsar://localhost:6650",
                             "adminUrl": "http://localhost:8080"})  # fmt: skip
    part = TopicRange((T, -1), (7, 1), (7, 3), None, None, False)
    clients.keep_reader(options.settings(), options.client_options, T, FakeReader(messages), (7, 1))
    batches = list(rows.read_range(options, part, ArrowRows(SPARK_SCHEMA, part)))
    got: dict[str, list[Any]] = {name: [v for b in batches for v in b.column(name).to_pylist()] for name in
                                 ("message_id", "producer", "publish_time")}  # fmt: skip
    assert got["message_id"] == ["7:2:0", "7:2:2", "7:3:0", "7:3:1", "7:3:2"]
    assert got["producer"] == ["p2", "p2", "p3", "p3", "p3"]
    assert [int(t.timestamp() * 1000) - BASE for t in got["publish_time"]] == [2000, 2000, 3000, 3000, 3000]
    kept = clients.take_reader(options.settings(), options.client_options, T, (7, 3))
    assert kept is not None and kept.pending is not None and kept.pending.id.entry == 4  # read past the end


def test_a_batched_end_entry_is_not_cut_short_when_the_broker_does_not_answer_whether_more_is_there() -> None:
    """The end entry's size cannot be seen: the range ends after it only when the broker says nothing more is
    there. A question that went unanswered (the client answers "no") fails the task, which Spark runs again,
    rather than ending the batch without the rest of the entry."""
    from pulsar_access.readers import NotAnswered
    from spark_sink import clients, rows
    from spark_sink.options import SourceOptions

    messages = [FakeMessage(entry, {}, index) for entry in (2, 3) for index in range(2)]
    options = SourceOptions({"topic": T, "subscription": "s", "serviceUrl": "pulsar://localhost:6650",
                             "adminUrl": "http://localhost:8080"})  # fmt: skip
    part = TopicRange((T, -1), (7, 1), (7, 3), None, None, False)
    reader = FakeReader(messages, unanswered=True)
    clients.keep_reader(options.settings(), options.client_options, T, reader, (7, 1))
    with pytest.raises(NotAnswered):
        list(rows.read_range(options, part, ArrowRows(SPARK_SCHEMA, part)))
    assert reader.closed  # not kept for the next range
