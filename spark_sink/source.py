"""`spark.readStream.format("pulsar-watermark")`: a Pulsar topic as a Spark stream, with its watermark.

Offsets live in Spark's checkpoint: per partition the last position read (ledger, entry) and the
broker watermark of the subscription. The driver finds the end of each batch (the partitions' last
entries from the admin API, the watermark from the generator's companion topic, read *before* the
ends so that everything below the watermark lies inside the batch); executors read exactly the
range with a Pulsar reader, hiding markers. After Spark commits a batch, the subscription is
acknowledged up to the batch's end, so the broker watermark follows what Spark has finished.

Besides data, a batch carries one row with `is_watermark = true` and `event_time` = the broker
watermark whenever that watermark moved; `read_stream` (in `spark_sink`) turns those rows into
Spark's own event-time watermark.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from pulsar_access.topics import full_name, partition_name
from spark_sink.offsets import NO_WATERMARK, Entry, SourceOffset

SCHEMA = (
    "key string, value binary, event_time timestamp, publish_time timestamp, topic string, partition int, "
    "message_id string, properties map<string,string>, is_watermark boolean"
)


SOURCE_OPTIONS = (
    "topic", "subscription", "serviceUrl", "adminUrl", "authToken", "startingPosition", "maxMessagesPerTrigger",
    "watermarksOnly", "path",
)  # fmt: skip


def check_option_names(options: Any, known: Sequence[str]) -> None:
    """An option name we do not know is a typo until proven otherwise: say which one was meant."""
    import difflib

    by_lower = {name.lower(): name for name in known}
    for name in options:
        if str(name).lower() not in by_lower:
            close = difflib.get_close_matches(str(name).lower(), list(by_lower), n=1, cutoff=0.6)
            hint = f"did you mean '{by_lower[close[0]]}'? " if close else ""
            raise ValueError(
                f"unknown option '{name}' for format pulsar-watermark; {hint}known options: {', '.join(known[:-1])}"
            )


class SourceOptions:
    """The options a Spark user passes, checked once with errors that name the fix."""

    def __init__(self, options: Any) -> None:
        from pulsar_access.errors import checked_admin_url, checked_service_url

        check_option_names(options, SOURCE_OPTIONS)

        def get(name: str, default: str | None = None) -> str | None:
            value = options.get(name)  # Spark's options are case-insensitive (stored lower-case)
            return default if value is None else str(value)

        topic, subscription = get("topic"), get("subscription")
        if not topic:
            raise ValueError("option 'topic' is required: .option('topic', 'my-topic')")
        if not subscription:
            raise ValueError("option 'subscription' is required: .option('subscription', 'my-spark-job')")
        self.topic: str = topic
        self.subscription: str = subscription
        from pulsar_access.settings import PulsarSettings

        env = PulsarSettings.from_env()
        self.service_url = get("serviceUrl", env.service_url) or env.service_url
        self.admin_url = (get("adminUrl", env.admin_url) or env.admin_url).rstrip("/")
        where = "option 'serviceUrl' (or PULSAR_SERVICE_URL)"
        checked_service_url(self.service_url, where)
        checked_admin_url(self.admin_url, "option 'adminUrl' (or PULSAR_ADMIN_URL)")
        self.auth_token = get("authToken", env.auth_token)
        self.starting_position = (get("startingPosition", "earliest") or "earliest").lower()
        if self.starting_position not in ("earliest", "latest"):
            raise ValueError(
                f"option 'startingPosition' must be 'earliest' or 'latest', got {self.starting_position!r}"
            )
        cap = get("maxMessagesPerTrigger")
        try:
            self.max_entries = int(cap) if cap is not None else None
        except ValueError:
            raise ValueError(f"option 'maxMessagesPerTrigger' must be a positive integer, got {cap!r}") from None
        if self.max_entries is not None and self.max_entries <= 0:
            raise ValueError(f"option 'maxMessagesPerTrigger' must be a positive integer, got {cap!r}")
        self.watermarks_only = (get("watermarksOnly", "false") or "false").lower() == "true"

    def settings(self) -> Any:
        from pulsar_access.settings import PulsarSettings

        return PulsarSettings(self.service_url, self.admin_url, self.auth_token)


class TopicRange(InputPartition):
    """What one task reads: a partition's (start, end] and, maybe, the watermark row. Picklable."""

    def __init__(self, partition: int, start: Entry | None, end: Entry | None, watermark: int | None) -> None:
        super().__init__((partition, start, end, watermark))
        self.partition = partition
        self.start = start
        self.end = end
        self.watermark = watermark


def _timestamp(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC)


class PulsarStreamReader(DataSourceStreamReader):
    """Driver side: offsets and commits. Executor side: `read`. Pulsar handles are never pickled."""

    def __init__(self, schema: StructType, options: Any) -> None:
        self.options = SourceOptions(options)
        self._driver: _DriverState | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "_driver": None}

    def _state(self) -> _DriverState:
        if self._driver is None:
            self._driver = _DriverState(self.options)
        return self._driver

    def initialOffset(self) -> dict[str, Any]:
        if self.options.watermarks_only:
            return SourceOffset().to_json()
        return SourceOffset(self._state().starting_positions()).to_json()

    def latestOffset(self, start: dict[str, Any] | None = None, limit: Any = None) -> dict[str, Any]:
        """Watermark first, then the partitions' ends: nothing below the watermark lies past them."""
        state = self._state()
        begin = SourceOffset.from_json(start) if start else state.last_end
        # The offset this was last called for (or returned) is a batch Spark has finished: Spark
        # asks for the next end only after the previous batch completed. Acknowledging it here,
        # rather than only in commit() (which Spark calls when the *next* batch starts), lets the
        # broker watermark move even when no new data would start another batch.
        if begin is not None and not self.options.watermarks_only:
            state.acknowledge(begin)
        watermark = max(state.watermark(), begin.watermark if begin else NO_WATERMARK, state.last_watermark)
        state.last_watermark = watermark
        if self.options.watermarks_only:
            return SourceOffset(watermark=watermark).to_json()
        end = SourceOffset(state.ends(), watermark)
        if self.options.max_entries is not None and begin is not None:
            end = end.capped(begin, self.options.max_entries)
        state.last_end = end
        return end.to_json()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin, stop = SourceOffset.from_json(start), SourceOffset.from_json(end)
        watermark = stop.watermark if stop.watermark > begin.watermark and stop.watermark >= 0 else None
        ranges: list[InputPartition] = [
            TopicRange(partition, first, last, None) for partition, first, last in stop.ranges_after(begin)
        ]
        if watermark is not None:
            if ranges:
                first = ranges[0]
                assert isinstance(first, TopicRange)
                ranges[0] = TopicRange(first.partition, first.start, first.end, watermark)
            else:
                ranges.append(TopicRange(-2, None, None, watermark))
        return ranges

    def commit(self, end: dict[str, Any]) -> None:
        """Spark finished every batch up to `end`: acknowledge the subscription up to there."""
        if not self.options.watermarks_only:
            self._state().acknowledge(SourceOffset.from_json(end))

    def stop(self) -> None:
        if self._driver is not None:
            self._driver.close()
            self._driver = None

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, TopicRange)
        if partition.end is not None:
            yield from _read_range(self.options, partition)
        if partition.watermark is not None:
            yield (None, None, _timestamp(partition.watermark), None, self.options.topic, None, None, None, True)


def _read_range(options: SourceOptions, part: TopicRange) -> Iterator[tuple[Any, ...]]:
    """Executor: the data messages of one partition in (start, end], markers hidden."""
    import pulsar

    from pulsar_access.errors import explained
    from watermark_core.protocol import MARKER_PROPERTY

    topic = full_name(options.topic)
    name = partition_name(topic, part.partition)
    client = options.settings().client()
    start_id = (
        pulsar.MessageId.earliest if part.start is None else pulsar.MessageId(-1, part.start[0], part.start[1], -1)
    )
    try:
        with explained(service_url=options.service_url, topic=name, doing="read"):
            reader = client.create_reader(name, start_id, start_message_id_inclusive=False)
    except BaseException:
        client.close()
        raise
    end = (part.end[0], part.end[1]) if part.end is not None else (-1, -1)
    last_entry: tuple[int, int] | None = None
    try:
        while True:
            if last_entry == end and not reader.has_message_available():
                break  # the end entry was the topic's last one (a batch whose size we cannot see)
            try:
                message = reader.read_next(timeout_millis=30_000)
            except pulsar.Timeout:
                raise RuntimeError(f"{name}: messages up to {end} were not readable within 30 s") from None
            msg_id = message.message_id()
            entry = (msg_id.ledger_id(), msg_id.entry_id())
            if part.start is not None and entry <= (part.start[0], part.start[1]):
                continue
            if entry > end:
                break
            properties = message.properties()
            if MARKER_PROPERTY not in properties:
                event_time = message.event_timestamp() or message.publish_timestamp()
                yield (
                    message.partition_key() or None,
                    message.data(),
                    _timestamp(event_time),
                    _timestamp(message.publish_timestamp()),
                    topic,
                    part.partition,
                    f"{entry[0]}:{entry[1]}:{msg_id.batch_index()}",
                    dict(properties),
                    False,
                )
            if entry == end and msg_id.batch_index() < 0:
                break
            last_entry = entry
    finally:
        reader.close()
        client.close()


class _DriverState:
    """Long-lived on Spark's driver-side Python worker: admin, watermark feed, acknowledging consumers."""

    def __init__(self, options: SourceOptions) -> None:
        from pulsar_access.admin import PulsarAdmin, TopicNotFound

        self.options = options
        self.topic = full_name(options.topic)
        self.settings = options.settings()
        self.admin = PulsarAdmin(self.settings)
        try:
            count = self.admin.partitions(self.topic)
            if count == 0:
                self.admin.internal_stats(self.topic)
        except TopicNotFound:
            raise ValueError(f"topic {self.topic} does not exist; create it first or check option 'topic'") from None
        self.partition_indexes = list(range(count)) if count else [-1]
        self.client = self.settings.client()
        self.last_watermark = NO_WATERMARK
        self.last_end: SourceOffset | None = None
        self._consumers: dict[int, Any] = {}
        self._feed: Any = None

    def _subscription_consumer(self, partition: int) -> Any:
        """A consumer per partition that only acknowledges (and so creates the subscription)."""
        import pulsar

        from pulsar_access.errors import explained

        if partition not in self._consumers:
            initial = (
                pulsar.InitialPosition.Earliest if self.options.starting_position == "earliest"
                else pulsar.InitialPosition.Latest
            )  # fmt: skip
            name = partition_name(self.topic, partition)
            with explained(service_url=self.options.service_url, topic=name, doing="subscribe to"):
                self._consumers[partition] = self.client.subscribe(
                    name, self.options.subscription,
                    consumer_type=pulsar.ConsumerType.Failover, receiver_queue_size=1, initial_position=initial,
                )  # fmt: skip
        return self._consumers[partition]

    def starting_positions(self) -> dict[int, Entry | None]:
        for partition in self.partition_indexes:
            self._subscription_consumer(partition)
        if self.options.starting_position == "earliest":
            return {p: None for p in self.partition_indexes}
        return self.ends()

    def ends(self) -> dict[int, Entry | None]:
        """Each partition's last entry: the end of the next batch."""
        ends: dict[int, Entry | None] = {}
        for partition in self.partition_indexes:
            from pulsar_access.admin import last_confirmed_entry

            ledger, entry = last_confirmed_entry(self.admin.internal_stats(partition_name(self.topic, partition)))
            ends[partition] = (ledger, entry) if entry >= 0 else None
        return ends

    def watermark(self) -> int:
        """The subscription's broker watermark (minimum over partitions), from the generator.

        NO_WATERMARK while a partition has none, also when its recomputed state has none (an event
        with `event_time` null, e.g. after a reset to before any W_SET): never an older value kept
        for it. `latestOffset` then keeps the query's previous watermark, which still holds for what
        Spark reads: its offsets come from the checkpoint, not from the subscription's cursor.
        """
        if self._feed is None:
            from consumer.watermark_feed import WatermarkFeed
            from pulsar_access.errors import explained

            for partition in self.partition_indexes:
                self._subscription_consumer(partition)
            with explained(service_url=self.options.service_url, topic=self.topic, doing="read the watermarks of"):
                self._feed = WatermarkFeed(
                    self.client, self.topic, self.options.subscription, lambda _w: None,
                    partitions=self.partition_indexes,
                )  # fmt: skip
        current = self._feed.current
        return NO_WATERMARK if current is None else int(current.event_time)

    def acknowledge(self, offset: SourceOffset) -> None:
        import pulsar

        for partition, position in offset.partitions.items():
            if position is not None:
                self._subscription_consumer(partition).acknowledge_cumulative(
                    pulsar.MessageId(max(partition, 0), position[0], position[1], -1)
                )

    def close(self) -> None:
        if self._feed is not None:
            self._feed.close()
        for consumer in self._consumers.values():
            consumer.close()
        self.client.close()
        self.admin.close()
