"""`spark.readStream.format("pulsar-watermark")`: Pulsar topics as a Spark stream, with their watermark.

Offsets live in Spark's checkpoint (`SourceOffset`): per partition of every topic read, the last
entry of the batch (ledger, entry), and the broker watermark *at those ends*. The driver takes each
partition's last entry from the admin API and the watermark at that entry from what the generator
published (`spark_sink.watermarks`: the head events it publishes as it folds markers, and the
subscriptions' tables), the minimum over every partition. Executors read exactly the range with a
Pulsar reader, hide markers and hand Spark Arrow record batches. The subscription is acknowledged
up to each batch's end once Spark has finished it, so the broker's own view of the subscription
(retention, backlog, `broker-ext status`) follows the query, and its watermark there is the one
Spark has.

Besides data, a batch carries one row with `is_watermark = true` and `event_time` = the broker
watermark whenever that watermark moved; every row has `watermark` (the broker watermark at the
batch's end), `producer` (the Pulsar producer name) and `late` (its event time is below the broker
watermark Spark holds while reading it: its producer broke its promise). `read_stream` (in
`spark_sink`) turns these into Spark's own event-time watermark.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from pulsar_access.errors import checked_admin_url, checked_service_url, explained
from pulsar_access.topics import TopicName, base_topic_and_partition, full_name, is_watermark_topic, partition_name
from spark_sink.clients import CLIENT_OPTION_PREFIX, client_options, keep_reader, shared_client, take_reader
from spark_sink.offsets import NO_WATERMARK, Entry, Ledgers, PartitionKey, SourceOffset, group_pieces, share_limit

log = logging.getLogger(__name__)

SCHEMA = (
    "key string, value binary, event_time timestamp, publish_time timestamp, topic string, partition int, "
    "message_id string, properties map<string,string>, producer string, late boolean, is_watermark boolean, "
    "watermark timestamp"
)

SOURCE_OPTIONS = (
    "topic", "topics", "topicsPattern", "subscription", "serviceUrl", "service.url", "adminUrl", "admin.url",
    "authToken", "startingOffsets", "startingPosition", "maxOffsetsPerTrigger", "maxMessagesPerTrigger",
    "failOnDataLoss", "minPartitions", "path",
)  # fmt: skip
"""Known option names; `pulsar.client.*` pass through to `pulsar.Client`. "path" (last) is Spark's own."""

ROWS_PER_ARROW_BATCH = 8192
MIN_ENTRIES_PER_SPLIT = 2000
"""A partition's range is cut for more tasks only into pieces of at least this many entries."""
RECEIVER_QUEUE = 5000
ADMIN_CALLS = 8
"""Admin API calls the driver makes at once (each partition's end, every batch)."""
DISCOVERY_INTERVAL_S = 10.0
"""How often new partitions, and topics matching `topicsPattern`, are looked for."""


def check_option_names(options: Any, known: Sequence[str], prefixes: Sequence[str] = ()) -> None:
    """An option name we do not know is a typo until proven otherwise: say which one was meant."""
    import difflib

    by_lower = {name.lower(): name for name in known}
    for name in options:
        lowered = str(name).lower()
        if lowered in by_lower or any(lowered.startswith(prefix) for prefix in prefixes):
            continue
        close = difflib.get_close_matches(lowered, list(by_lower), n=1, cutoff=0.6)
        hint = f"did you mean '{by_lower[close[0]]}'? " if close else ""
        raise ValueError(
            f"unknown option '{name}' for format pulsar-watermark; {hint}known options: {', '.join(known[:-1])}"
            + "".join(f", {prefix}*" for prefix in prefixes)
        )


def _positive_int(name: str, value: str | None) -> int | None:
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number <= 0:
        raise ValueError(f"option '{name}' must be a positive integer, got {value!r}")
    return number


class SourceOptions:
    """The options a Spark user passes, checked once with errors that name the fix.

    Named as in Spark's Kafka source where there is a match: `topic` / `topics` (comma list) /
    `topicsPattern` (a regex over full topic names; a bare one means `persistent://public/default/`),
    `startingOffsets`, `maxOffsetsPerTrigger`, `failOnDataLoss`, `minPartitions`; `serviceUrl` /
    `service.url`, `adminUrl` / `admin.url` and `pulsar.client.*` as Pulsar users know them.
    """

    def __init__(self, options: Any) -> None:
        from pulsar_access.settings import PulsarSettings

        check_option_names(options, SOURCE_OPTIONS, (CLIENT_OPTION_PREFIX,))

        def get(*names: str) -> str | None:
            for name in names:  # Spark's options are case-insensitive (stored lower-case)
                value = options.get(name)
                if value is not None:
                    return str(value)
            return None

        topic, topics, pattern = get("topic"), get("topics"), get("topicsPattern")
        given = [name for name, value in (("topic", topic), ("topics", topics), ("topicsPattern", pattern)) if value]
        if not given:
            raise ValueError(
                "option 'topic' is required (or 'topics', a comma list, or 'topicsPattern', a regex): "
                ".option('topic', 'my-topic')"
            )
        if len(given) > 1:
            raise ValueError(f"give one of the options 'topic', 'topics' and 'topicsPattern', not {given}")
        names = [topic] if topic else [t.strip() for t in (topics or "").split(",") if t.strip()]
        try:
            self.topics: list[str] = sorted({full_name(name) for name in names})
        except ValueError as exc:
            raise ValueError(f"option '{given[0]}': {exc}") from None
        self.pattern: re.Pattern[str] | None = None
        self.pattern_namespace = ""
        if pattern:
            self.pattern, self.pattern_namespace = _topic_pattern(pattern)
        subscription = get("subscription")
        if not subscription:
            raise ValueError("option 'subscription' is required: .option('subscription', 'my-spark-job')")
        self.subscription: str = subscription

        env = PulsarSettings.from_env()
        self.service_url = get("serviceUrl", "service.url") or env.service_url
        self.admin_url = (get("adminUrl", "admin.url") or env.admin_url).rstrip("/")
        checked_service_url(self.service_url, "option 'serviceUrl' (or PULSAR_SERVICE_URL)")
        checked_admin_url(self.admin_url, "option 'adminUrl' (or PULSAR_ADMIN_URL)")
        self.auth_token = get("authToken") or env.auth_token
        self.client_options = client_options(options)

        starting_name = "startingOffsets" if get("startingOffsets") is not None else "startingPosition"
        self.starting_offsets = _starting_offsets(starting_name, get("startingOffsets", "startingPosition"))
        cap_name = "maxOffsetsPerTrigger" if get("maxOffsetsPerTrigger") is not None else "maxMessagesPerTrigger"
        self.max_offsets = _positive_int(cap_name, get("maxOffsetsPerTrigger", "maxMessagesPerTrigger"))
        fail = (get("failOnDataLoss") or "true").lower()
        if fail not in ("true", "false"):
            raise ValueError(f"option 'failOnDataLoss' must be 'true' or 'false', got {fail!r}")
        self.fail_on_data_loss = fail == "true"
        self.min_partitions = _positive_int("minPartitions", get("minPartitions")) or os.cpu_count() or 1

    @property
    def topic(self) -> str | None:
        """The one topic named by option 'topic' (or a one-element 'topics'): the topic of older checkpoints."""
        return self.topics[0] if len(self.topics) == 1 and self.pattern is None else None

    @property
    def starting_position(self) -> str:
        """'earliest', 'latest' or 'json' (per-partition positions in `starting_offsets`)."""
        return self.starting_offsets if isinstance(self.starting_offsets, str) else "json"

    def settings(self) -> Any:
        from pulsar_access.settings import PulsarSettings

        return PulsarSettings(self.service_url, self.admin_url, self.auth_token)


def _topic_pattern(pattern: str) -> tuple[re.Pattern[str], str]:
    """A regex over full topic names, and the namespace to list (a bare regex: public/default)."""
    domain, sep, rest = pattern.partition("://")
    if not sep:
        domain, rest = "persistent", f"public/default/{pattern}"
    parts = rest.split("/", 2)
    if len(parts) != 3 or not all(parts):
        raise ValueError(
            f"option 'topicsPattern' {pattern!r} must be a regex over topic names, e.g. 'sensor-.*' or "
            "'persistent://tenant/namespace/sensor-.*'"
        )
    try:
        return re.compile(f"{domain}://{rest}"), f"{parts[0]}/{parts[1]}"
    except re.error as exc:
        raise ValueError(f"option 'topicsPattern' {pattern!r} is not a regex: {exc}") from None


StartingOffsets = str | dict[PartitionKey, Entry | str]


def _starting_offsets(name: str, value: str | None) -> StartingOffsets:
    """'earliest' (the default), 'latest', or per partition: {"topic": {"0": [ledger, entry] | "earliest" |
    "latest" | -2 | -1}}, [ledger, entry] being the first entry to read, as Kafka's offsets are."""
    text = (value or "earliest").strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()
    fix = (
        f"option '{name}' must be 'earliest' or 'latest' or per-partition JSON like "
        '{"my-topic": {"0": [ledger, entry], "1": "earliest"}}'
    )
    try:
        data = json.loads(text)
    except ValueError:
        raise ValueError(f"{fix}, got {value!r}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{fix}, got {value!r}")
    starts: dict[PartitionKey, Entry | str] = {}
    try:
        for topic, partitions in data.items():
            for index, start in dict(partitions).items():
                key = (full_name(str(topic)), int(index))
                if start in ("earliest", -2):
                    starts[key] = "earliest"
                elif start in ("latest", -1):
                    starts[key] = "latest"
                else:
                    ledger, entry = (int(x) for x in start)
                    starts[key] = (ledger, entry - 1)  # the entry before the first one to read
    except (TypeError, ValueError):
        raise ValueError(f"{fix}, got {value!r}") from None
    return starts


class TopicRange(InputPartition):
    """What one task reads: a partition's entries in (start, end], maybe the watermark row. Picklable.

    `watermark` is the broker watermark at the batch's end (None before there is one), `late_below`
    the one Spark holds while it reads this batch (the watermark at the batch's start).
    """

    def __init__(
        self,
        key: PartitionKey | None,
        start: Entry | None,
        end: Entry | None,
        watermark: int | None,
        late_below: int | None,
        watermark_row: bool,
    ) -> None:
        super().__init__((key, start, end, watermark, late_below, watermark_row))
        self.key = key
        self.start = start
        self.end = end
        self.watermark = watermark
        self.late_below = late_below
        self.watermark_row = watermark_row


class ReadTask(InputPartition):
    """One Spark task: the ranges it reads one after the other in one Python worker. Picklable."""

    def __init__(self, ranges: Sequence[TopicRange]) -> None:
        super().__init__(tuple(ranges))
        self.ranges = tuple(ranges)


def _present(watermark: int) -> int | None:
    return None if watermark == NO_WATERMARK else watermark


class PulsarStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Driver side: offsets and commits. Executor side: `read`. Pulsar handles are never pickled."""

    def __init__(self, schema: StructType, options: Any) -> None:
        self.schema = schema
        self.options = SourceOptions(options)
        self._driver: _DriverState | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"schema": self.schema, "options": self.options, "_driver": None}

    def _state(self) -> _DriverState:
        if self._driver is None:
            self._driver = _DriverState(self.options)
        return self._driver

    def _offset(self, data: Mapping[str, Any] | None) -> SourceOffset:
        return SourceOffset.from_json(data, self.options.topic)

    def initialOffset(self) -> dict[str, Any]:
        return SourceOffset(self._state().starting_positions(), tasks=self.options.min_partitions).to_json()

    def getDefaultReadLimit(self) -> ReadLimit:
        """`maxOffsetsPerTrigger` as Spark's own read limit (Spark passes it back to `latestOffset`)."""
        if self.options.max_offsets is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_offsets)

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: read up to the ends as they are now, then stop."""
        state = self._state()
        state.available_now = state.ends(state.partitions())

    def latestOffset(self, start: dict[str, Any] | None = None, limit: ReadLimit | None = None) -> dict[str, Any]:
        """The partitions' ends (within `limit`), and the broker watermark at those ends."""
        state = self._state()
        begin = self._offset(start) if start else state.last_end or SourceOffset(state.starting_positions())
        # `begin` is a batch Spark has finished: Spark asks for the next end only after the previous
        # batch completed. Acknowledging it here, rather than only in commit() (which Spark calls when
        # the *next* batch starts), lets the subscription follow the query even when no new data
        # would start another batch.
        state.acknowledge(begin)
        end = state.next_end(begin, limit.max_rows if isinstance(limit, ReadMaxRows) else None)
        state.last_end = end
        return end.to_json()

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return self._driver.last_end.to_json() if self._driver is not None and self._driver.last_end else None

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin, stop = self._offset(start), self._offset(end)
        watermark, late_below = _present(stop.watermark), _present(begin.watermark)
        moved = watermark is not None and stop.watermark > begin.watermark
        ranges = stop.ranges_after(begin)
        state = self._state()
        # Cut as when the batch was planned (its end offset, in Spark's checkpoint, holds the count): a batch run
        # again gives each task, and so each of the exactly-once sink's producers, the same rows on any driver.
        tasks = stop.tasks or self.options.min_partitions
        pieces = state.split(ranges, tasks) if ranges else []
        reads = [
            TopicRange(key, first, last, watermark, late_below, moved and index == 0)
            for index, (key, first, last) in enumerate(pieces)
        ]
        if moved and not reads:
            reads.append(TopicRange(None, None, None, watermark, late_below, True))
        sizes = [state.size(piece) for piece in pieces] or [0]  # [0]: the watermark row's empty read
        groups = group_pieces(sizes, tasks, MIN_ENTRIES_PER_SPLIT) if reads else []
        return [ReadTask([reads[index] for index in group]) for group in groups]

    def commit(self, end: dict[str, Any]) -> None:
        """Spark finished every batch up to `end`: acknowledge the subscription up to there."""
        self._state().acknowledge(self._offset(end))

    def stop(self) -> None:
        if self._driver is not None:
            self._driver.close()
            self._driver = None

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """Executor: Arrow record batches of the task's ranges' data messages, markers hidden."""
        assert isinstance(partition, ReadTask)
        for part in partition.ranges:
            batches = _ArrowRows(self.schema, part)
            if part.key is not None and part.end is not None:
                yield from _read_range(self.options, part, batches)
            if part.watermark_row and part.watermark is not None:
                yield batches.watermark_row(part.watermark)


class _ArrowRows:
    """Columns of one task's rows, handed to Spark as Arrow record batches of the source's schema."""

    def __init__(self, schema: StructType, part: TopicRange) -> None:
        self.schema = _arrow_schema(schema)
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
        import pyarrow as pa
        import pyarrow.compute as pc

        rows = len(self.values)
        types = {field.name: field.type for field in self.schema}
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
        import pyarrow as pa

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
def _arrow_schema(schema: StructType) -> Any:
    """The source's schema as Arrow's, converted once per worker, not once per range a task reads."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def _timestamps(millis: Any, arrow_type: Any) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.multiply(millis, pa.scalar(1000, pa.int64())).cast(arrow_type)


def _timestamp_scalar(millis: int | None, arrow_type: Any) -> Any:
    import pyarrow as pa

    return pa.scalar(None if millis is None else millis * 1000, pa.int64()).cast(arrow_type)


def _read_range(options: SourceOptions, part: TopicRange, rows: _ArrowRows) -> Iterator[Any]:
    """Executor: the data messages of one partition in (start, end], markers hidden, as record batches.

    The reader is the one a previous task on this partition left in this worker if it stopped at
    `start` or a little before (`spark_sink.clients.take_reader`), else a new one (a lookup and a
    subscription on the broker, 5-100 ms); it is left open for the next batch once the range is
    read, and closed if the task fails or stops early.
    """
    import pulsar

    from watermark_core.protocol import MARKER_PROPERTY

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
    keys, values, event_times, publish_times = rows.keys, rows.values, rows.event_times, rows.publish_times
    # The client's own reader under its Python wrapper: the same calls, without a wrapper object and
    # an extra Python frame per message and accessor.
    read_next = getattr(getattr(reader, "_reader", None), "read_next", None) or reader.read_next
    done = False
    try:
        while True:
            if message is None:
                if last_entry == end and not reader.has_message_available():
                    break  # the end entry was the topic's last one (a batch whose size we cannot see)
                try:
                    message = read_next(30_000)
                except pulsar.Timeout:
                    raise RuntimeError(f"{name}: messages up to {end} were not readable within 30 s") from None
            msg_id = message.message_id()
            entry = (msg_id.ledger_id(), msg_id.entry_id())
            if entry <= start:
                message = None
                continue
            if entry > end:
                break  # `message` is the next range's first: kept with the reader
            properties = message.properties()
            batch_index = msg_id.batch_index()
            if MARKER_PROPERTY not in properties:
                keys.append(message.partition_key())
                values.append(message.data())
                event_times.append(message.event_timestamp())
                publish_times.append(message.publish_timestamp())
                rows.ledgers.append(entry[0])
                rows.entries.append(entry[1])
                rows.batch_indexes.append(batch_index)
                rows.producers.append(message.producer_name())
                rows.add_properties(properties)
                if len(values) >= ROWS_PER_ARROW_BATCH:
                    yield rows.batch()
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


class _DriverState:
    """Long-lived on Spark's driver-side Python worker: admin, watermark events, acknowledging consumers."""

    def __init__(self, options: SourceOptions) -> None:
        from pulsar_access.admin import PulsarAdmin
        from pulsar_access.incarnations import Incarnations
        from spark_sink.watermarks import CompanionFollower, KnownWatermarks

        self.options = options
        self.settings = options.settings()
        self.admin = PulsarAdmin(self.settings)
        self.client = self.settings.client(**options.client_options)
        self.known = KnownWatermarks()
        incarnations = Incarnations(self.admin, lambda topic, partition: self.known.reset((topic, partition)),
                                    reader="the Spark source")  # fmt: skip
        self.follower = CompanionFollower(self.client, self.known, incarnations)
        self.last_end: SourceOffset | None = None
        self.available_now: dict[PartitionKey, Entry | None] | None = None
        self.ledgers: dict[PartitionKey, Ledgers] = {}
        self._stats: dict[PartitionKey, dict[str, Any]] = {}
        self._partitions: list[PartitionKey] = []
        self._next_discovery = 0.0
        self._starts: dict[PartitionKey, Entry | None] | None = None
        self._consumers: dict[PartitionKey, Any] = {}
        self._loss_reported: set[PartitionKey] = set()
        self._held: list[PartitionKey] = []
        self._pool = ThreadPoolExecutor(ADMIN_CALLS, thread_name_prefix="pulsar-watermark-admin")
        self.partitions()

    # -- what is read --------------------------------------------------------------------------------

    def partitions(self) -> list[PartitionKey]:
        """Every partition of every topic read; new topics and partitions are found every few seconds."""
        if time.monotonic() < self._next_discovery:
            return self._partitions
        from pulsar_access.admin import TopicNotFound

        topics = list(self.options.topics)
        if self.options.pattern is not None:
            topics += self._matching_topics()
        keys: list[PartitionKey] = []
        for topic in topics:
            try:
                count = self.admin.partitions(topic)
                if count == 0:
                    self.admin.internal_stats(topic)  # TopicNotFound if it does not exist
            except TopicNotFound:
                if self.options.pattern is not None or self._partitions:
                    continue  # deleted since: what was read stays in the offsets
                raise ValueError(f"topic {topic} does not exist; create it first or check option 'topic'") from None
            keys += [(topic, index) for index in range(count)] if count else [(topic, -1)]
        new = [key for key in keys if key not in self._partitions]
        if new:
            topics_new = sorted({topic for topic, _ in new})
            with explained(service_url=self.options.service_url, topic=topics_new[0], doing="read watermark events of"):
                self.follower.follow(topics_new)
            if self._partitions:
                log.info("reading new partitions %s from their start", new)
        self._partitions = sorted(set(self._partitions) | set(keys))
        self._next_discovery = time.monotonic() + DISCOVERY_INTERVAL_S
        return self._partitions

    def _matching_topics(self) -> list[str]:
        assert self.options.pattern is not None
        found = set()
        for name in self.admin.list_topics(self.options.pattern_namespace):
            base, _ = base_topic_and_partition(name)
            local = TopicName.parse(base).local
            if not is_watermark_topic(base) and not local.startswith("__") and self.options.pattern.fullmatch(base):
                found.add(base)
        return sorted(found)

    def starting_positions(self) -> dict[PartitionKey, Entry | None]:
        """Where a new query starts (`startingOffsets`); the subscription is created there too."""
        if self._starts is not None:
            return self._starts
        keys = self.partitions()
        for key in keys:
            self._subscription_consumer(key)
        wanted = self.options.starting_offsets
        latest = self.ends(keys)
        starts: dict[PartitionKey, Entry | None] = {}
        for key in keys:
            start = wanted if isinstance(wanted, str) else wanted.get(key, "earliest")
            if start == "earliest":
                starts[key] = None
            elif start == "latest":
                starts[key] = latest.get(key)
            else:
                assert not isinstance(start, str)
                starts[key] = start
        self.acknowledge(SourceOffset(starts))
        self._starts = starts
        return starts

    # -- ends, limits and the watermark ----------------------------------------------------------------

    def ends(self, keys: Sequence[PartitionKey]) -> dict[PartitionKey, Entry | None]:
        """Each partition's last entry (admin API, keep-alive connections, the partitions' calls side by side:
        a batch waits for about one round trip, not one per partition); ledgers are kept for limits and splits."""
        from pulsar_access.admin import TopicNotFound, last_confirmed_entry

        def stats_of(key: PartitionKey) -> dict[str, Any] | None:
            try:
                return self.admin.fast_internal_stats(partition_name(*key))
            except TopicNotFound:
                return None

        ends: dict[PartitionKey, Entry | None] = {}
        for key, stats in zip(keys, self._pool.map(stats_of, keys), strict=True):
            if stats is None:
                self._lost(key, "its topic was deleted")
                continue
            ledger, entry = last_confirmed_entry(stats)
            ends[key] = (ledger, entry) if entry >= 0 else None
            self.ledgers[key] = Ledgers.from_stats(stats)
            self._stats[key] = stats
        return ends

    def next_end(self, begin: SourceOffset, max_entries: int | None) -> SourceOffset:
        """The next batch's end after `begin`: every partition's last entry within the limits, and the
        broker watermark there (never below `begin`'s: it only goes up along the log)."""
        keys = self.partitions()
        ends = self.ends(keys)
        for key in keys:
            self._check_data_loss(key, begin.partitions.get(key))
        if self.available_now is not None:
            ends = {key: _min_entry(end, self.available_now.get(key)) for key, end in ends.items()}
        for key, start in begin.partitions.items():  # never back; partitions gone keep their place
            if start is not None and (ends.get(key) is None or ends[key] < start):  # type: ignore[operator]
                ends[key] = start
        starts = {key: begin.partitions.get(key) for key in ends}
        if max_entries is not None:
            ends = share_limit(starts, ends, self.ledgers, max_entries)
        found = self.known.watermark(ends)
        watermark = max(begin.watermark, NO_WATERMARK if found is None else found)
        held = self.known.held_back_by(ends)
        self._say_held_back(held, watermark)
        joined = [key for key, end in ends.items() if end is not None and begin.partitions.get(key) is None]
        if joined and begin.watermark != NO_WATERMARK:
            log.warning("%s got its first messages after the query's watermark reached %d: those below it are late "
                        "(a topic that joins late is a late joiner, like a producer)",
                        ", ".join(f"{t}" + (f" partition {p}" if p >= 0 else "") for t, p in joined[:20]),
                        begin.watermark)  # fmt: skip
        self.known.forget_before(starts)
        # How many tasks the batch is cut into, kept in its end offset for any replay; an end with nothing new to
        # read keeps the one before, so that a restart with another `minPartitions` starts no empty batch.
        tasks = self.options.min_partitions
        if begin.tasks is not None and not SourceOffset(ends).ranges_after(begin):
            tasks = begin.tasks
        return SourceOffset(ends, watermark, tuple(held), tasks)

    def _say_held_back(self, held: list[PartitionKey], watermark: int) -> None:
        """Log when the partitions holding the watermark back change: a query never stalls silently."""
        if held == self._held:
            return
        if held:
            log.warning(
                "the query's watermark is held at %s by %d partition(s) with messages but no broker watermark: %s. "
                "A topic takes part once a WatermarkProducer sends a W_SET there (plain producers never do) and "
                "the generator (`broker-ext serve`) follows it; or leave the topic out of 'topics'/'topicsPattern'",
                "none" if watermark == NO_WATERMARK else watermark, len(held),
                ", ".join(f"{t}" + (f" partition {p}" if p >= 0 else "") for t, p in held[:20]),
            )  # fmt: skip
        else:
            log.info("no partition holds the query's watermark back any more (now %s)", watermark)
        self._held = held

    def split(
        self, ranges: list[tuple[PartitionKey, Entry | None, Entry]], tasks: int
    ) -> list[tuple[PartitionKey, Entry | None, Entry]]:
        """The batch's ranges, large ones cut so that about `tasks` tasks share the work (Kafka's
        `minPartitions`), in pieces of at least `MIN_ENTRIES_PER_SPLIT` entries."""
        sizes = {key: self._ledgers_of(key).between(first, last) for key, first, last in ranges}
        total = sum(sizes.values())
        pieces: list[tuple[PartitionKey, Entry | None, Entry]] = []
        for key, first, last in ranges:
            wanted = round(tasks * sizes[key] / total) if total else 1
            cuts = max(1, min(wanted, sizes[key] // MIN_ENTRIES_PER_SPLIT))
            if cuts == 1:
                pieces.append((key, first, last))
            else:
                pieces += [(key, a, b) for a, b in self._ledgers_of(key).split(first, last, cuts)]
        return pieces

    def size(self, piece: tuple[PartitionKey, Entry | None, Entry]) -> int:
        """How many entries a range holds."""
        key, first, last = piece
        return self._ledgers_of(key).between(first, last)

    def _ledgers_of(self, key: PartitionKey) -> Ledgers:
        if key not in self.ledgers:  # a batch replayed after a restart
            self.ends([key])
        return self.ledgers.get(key) or Ledgers([])

    def _check_data_loss(self, key: PartitionKey, start: Entry | None) -> None:
        """Entries after `start` that Pulsar deleted before the query read them: fail (`failOnDataLoss`,
        the default) or say so once.

        Pulsar deletes whole ledgers, from the oldest, once every subscription has acknowledged them;
        the query acknowledges only what Spark has finished. So entries after `start` can be gone only
        if `start`'s ledger is gone and something else (TTL, a backlog quota, another consumer) moved
        the subscription past the start of the first ledger left. (Our own acknowledgement of a
        ledger's last entry shows as "(next ledger, -1)" once that ledger is deleted: not a loss.)
        """
        from pulsar_access.admin import mark_delete_of

        cursor = (self._stats.get(key, {}).get("cursors") or {}).get(self.options.subscription)
        first = self.ledgers[key].first if key in self.ledgers else None
        if start is None or not cursor or first is None or start[0] >= first:
            return
        acknowledged = mark_delete_of(cursor)
        if acknowledged > (first, -1):
            self._lost(key, f"ledger {start[0]} with entries after {start} was deleted (the subscription is at "
                            f"{acknowledged}: retention, a TTL or a backlog quota moved it)")  # fmt: skip

    def _lost(self, key: PartitionKey, why: str) -> None:
        message = (
            f"{partition_name(*key)}: data may have been lost: {why}. Set option failOnDataLoss to false to "
            "go on from what is left, or keep more with a retention policy on the namespace"
        )
        if self.options.fail_on_data_loss:
            raise RuntimeError(message)
        if key not in self._loss_reported:
            self._loss_reported.add(key)
            log.warning("%s", message)

    # -- the subscription ------------------------------------------------------------------------------

    def _subscription_consumer(self, key: PartitionKey) -> Any:
        """A consumer per partition that only acknowledges (and so creates the subscription)."""
        import pulsar

        if key not in self._consumers:
            initial = (
                pulsar.InitialPosition.Latest if self.options.starting_position == "latest"
                else pulsar.InitialPosition.Earliest
            )  # fmt: skip
            name = partition_name(*key)
            with explained(service_url=self.options.service_url, topic=name, doing="subscribe to"):
                self._consumers[key] = self.client.subscribe(
                    name, self.options.subscription,
                    consumer_type=pulsar.ConsumerType.Failover, receiver_queue_size=1, initial_position=initial,
                )  # fmt: skip
        return self._consumers[key]

    def acknowledge(self, offset: SourceOffset) -> None:
        import pulsar

        for key, position in offset.partitions.items():
            if position is not None and position[1] >= 0:
                self._subscription_consumer(key).acknowledge_cumulative(
                    pulsar.MessageId(max(key[1], 0), position[0], position[1], -1)
                )

    def close(self) -> None:
        self.follower.close()
        for consumer in self._consumers.values():
            consumer.close()
        self.client.close()
        self._pool.shutdown()
        self.admin.close()


def _min_entry(a: Entry | None, b: Entry | None) -> Entry | None:
    return None if a is None or b is None else min(a, b)
