"""The Spark source's executor side: a task's ranges read with Pulsar readers, markers hidden, as Arrow record batches.

Only executors import this module (`PulsarStreamReader.read`): the driver plans batches and never builds rows.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from typing import Any

import pulsar
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from pulsar_access.errors import explained
from pulsar_access.readers import has_message_available
from pulsar_access.topics import partition_name
from spark_sink.clients import keep_reader, shared_client, take_reader
from spark_sink.offsets import Entry
from spark_sink.options import SourceOptions
from spark_sink.ranges import TopicRange
from watermark_core.protocol import MARKER_PROPERTY

ROWS_PER_ARROW_BATCH = 8192
RECEIVER_QUEUE = 5000


class ArrowRows:
    """Columns of one task's rows, handed to Spark as Arrow record batches of the source's schema."""

    def __init__(self, schema: StructType, part: TopicRange) -> None:
        self.schema = arrow_schema(schema)
        self.part = part
        self.topic = part.key[0] if part.key else None
        self.partition = part.key[1] if part.key else None
        self.keys: list[str] = []
        self.values: list[bytes] = []
        self.event_times: list[int] = []
        self.publish_times: list[int] = []
        self.ledgers: list[int] = []
        self.entries: list[int] = []
        self.batch_indexes: list[int] = []
        self.producers: list[str] = []
        self.property_offsets: list[int] = [0]
        self.property_keys: list[str] = []
        self.property_values: list[str] = []
        self._types = {field.name: field.type for field in self.schema}
        self._columns = (
            self.keys, self.values, self.event_times, self.publish_times, self.ledgers, self.entries,
            self.batch_indexes, self.producers, self.property_keys, self.property_values,
        )  # fmt: skip

    def add_properties(self, properties: Mapping[str, str]) -> None:
        """One row's message properties (most messages have none: then this only records an offset)."""
        if properties:
            self.property_keys.extend(properties.keys())
            self.property_values.extend(properties.values())
        self.property_offsets.append(len(self.property_keys))

    def __len__(self) -> int:
        return len(self.values)

    def batch(self) -> Any:
        """The rows collected so far as one record batch (computed column-wise), then empty again."""
        rows = len(self.values)
        types = self._types
        event_ms = pa.array(self.event_times, pa.int64())
        publish_ms = pa.array(self.publish_times, pa.int64())
        event_ms = pc.if_else(pc.equal(event_ms, 0), publish_ms, event_ms)  # no event time: its publish time
        keys = pa.array(self.keys, pa.string())
        ids = pc.binary_join_element_wise(
            pc.cast(pa.array(self.ledgers, pa.int64()), pa.string()),
            pc.cast(pa.array(self.entries, pa.int64()), pa.string()),
            pc.cast(pa.array(self.batch_indexes, pa.int64()), pa.string()),
            ":",
        )
        late_below = self.part.late_below
        late = (
            pc.less(event_ms, pa.scalar(late_below, pa.int64())) if late_below is not None
            else pa.repeat(pa.scalar(False), rows)
        )  # fmt: skip
        columns = {
            "key": pc.if_else(pc.equal(keys, ""), pa.scalar(None, pa.string()), keys),
            "value": pa.array(self.values, pa.binary()),
            "event_time": _timestamps(event_ms, types["event_time"]),
            "publish_time": _timestamps(publish_ms, types["publish_time"]),
            "topic": pa.repeat(pa.scalar(self.topic, pa.string()), rows),
            "partition": pa.repeat(pa.scalar(self.partition, pa.int32()), rows),
            "message_id": ids,
            "properties": pa.MapArray.from_arrays(
                pa.array(self.property_offsets, pa.int32()),
                pa.array(self.property_keys, pa.string()),
                pa.array(self.property_values, pa.string()),
                type=types["properties"],
            ),
            "producer": pa.array(self.producers, pa.string()),
            "late": late,
            "is_watermark": pa.repeat(pa.scalar(False), rows),
            "watermark": pa.repeat(_timestamp_scalar(self.part.watermark, types["watermark"]), rows),
        }
        for column in self._columns:
            column.clear()
        del self.property_offsets[1:]
        return pa.RecordBatch.from_arrays([columns[field.name] for field in self.schema], schema=self.schema)

    def watermark_row(self, watermark: int) -> Any:
        """The row that carries the broker watermark at the batch's end into Spark."""
        stamp = pa.array([watermark * 1000], pa.int64())
        values = {"late": pa.array([False]), "is_watermark": pa.array([True]), "topic": pa.array([self.topic])}
        columns = [
            stamp.cast(field.type) if field.name in ("event_time", "watermark")
            else values[field.name].cast(field.type) if field.name in values
            else pa.nulls(1, field.type)
            for field in self.schema
        ]  # fmt: skip
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)


@functools.lru_cache(maxsize=8)
def arrow_schema(schema: StructType) -> Any:
    """The source's schema as Arrow's, converted once per worker, not once per range a task reads."""
    return to_arrow_schema(schema, timezone="UTC")


def _timestamps(millis: Any, arrow_type: Any) -> Any:
    return pc.multiply(millis, pa.scalar(1000, pa.int64())).cast(arrow_type)


def _timestamp_scalar(millis: int | None, arrow_type: Any) -> Any:
    return pa.scalar(None if millis is None else millis * 1000, pa.int64()).cast(arrow_type)


def read_range(options: SourceOptions, part: TopicRange, rows: ArrowRows) -> Iterator[Any]:
    """Executor: the data messages of one partition in (start, end], markers hidden, as record batches.

    The reader is the one a previous task on this partition left in this worker if it stopped at
    `start` or a little before (`spark_sink.clients.take_reader`), else a new one (a lookup and a
    subscription on the broker, 5-100 ms); it is left open for the next batch once the range is
    read, and closed if the task fails or stops early.
    """
    assert part.key is not None and part.end is not None
    name = partition_name(*part.key)
    settings = options.settings()
    kept = take_reader(settings, options.client_options, name, part.start)
    if kept is not None:
        reader, message = kept.reader, kept.pending
    else:
        client = shared_client(settings, options.client_options)
        start_id = (
            pulsar.MessageId.earliest if part.start is None
            else pulsar.MessageId(-1, part.start[0], part.start[1], -1)
        )  # fmt: skip
        with explained(service_url=options.service_url, topic=name, doing="read"):
            reader = client.create_reader(
                name, start_id, start_message_id_inclusive=False, receiver_queue_size=RECEIVER_QUEUE
            )
        message = None
    start = part.start or (-1, -1)
    end = part.end
    last_entry: Entry | None = None
    # Per message only what a correct loop needs (its position, the marker check) and one append per column,
    # each list a local: no attribute lookups, no method call of ours (`batch` builds the columns at once).
    keys, values, event_times, publish_times = rows.keys, rows.values, rows.event_times, rows.publish_times
    ledgers, entries, batch_indexes, producers = rows.ledgers, rows.entries, rows.batch_indexes, rows.producers
    property_keys, property_values, property_offsets = rows.property_keys, rows.property_values, rows.property_offsets
    properties_so_far = len(property_keys)
    # The client's own reader under its Python wrapper: the same calls, without a wrapper object and
    # an extra Python frame per message and accessor.
    read_next = getattr(getattr(reader, "_reader", None), "read_next", None) or reader.read_next
    # A message of a batched entry whose batch index follows the previous message's is of the same entry (a reader
    # gets an entry's messages in order and none of them skipped): its position was checked with its predecessor's,
    # and its entry, producer and publish time are the entry's. So such a message costs four binding calls fewer.
    previous_index = -2
    entry = (-1, -1)
    producer, published = "", 0
    done = False
    try:
        while True:
            if message is None:
                if last_entry == end and not has_message_available(reader):  # no answer raises: Spark runs it again
                    break  # the end entry was the topic's last one (a batch whose size we cannot see)
                try:
                    message = read_next(30_000)
                except pulsar.Timeout:
                    raise RuntimeError(f"{name}: messages up to {end} were not readable within 30 s") from None
            msg_id = message.message_id()
            batch_index = msg_id.batch_index()
            if batch_index <= 0 or batch_index != previous_index + 1:
                entry = (msg_id.ledger_id(), msg_id.entry_id())
                if entry <= start:
                    message = None
                    continue
                if entry > end:
                    break  # `message` is the next range's first: kept with the reader
                producer, published = message.producer_name(), message.publish_timestamp()
            previous_index = batch_index
            properties = message.properties()
            if not properties or MARKER_PROPERTY not in properties:
                if properties:  # most messages have none: then only their offset is recorded
                    property_keys.extend(properties)
                    property_values.extend(properties.values())
                    properties_so_far += len(properties)
                property_offsets.append(properties_so_far)
                keys.append(message.partition_key())
                values.append(message.data())
                event_times.append(message.event_timestamp())
                publish_times.append(published)
                ledgers.append(entry[0])
                entries.append(entry[1])
                batch_indexes.append(batch_index)
                producers.append(producer)
                if len(values) >= ROWS_PER_ARROW_BATCH:
                    yield rows.batch()
                    properties_so_far = 0
            message = None
            if entry == end and batch_index < 0:
                break
            last_entry = entry
        done = True
    finally:
        if done:
            keep_reader(settings, options.client_options, name, reader, end, message)
        else:
            reader.close()
    if len(rows):
        yield rows.batch()
